"""PLI on AT&T faces under FedMD, undefended and under Laplace noise on the uploads (docs/attacks.md, "What the small
configs give"; the README): PLI beats chance but is not shown to leak beyond what the attacker gets from public data
alone (its learned prior, the public look), draws the faces closer than the public look does, and Laplace noise of
scale 1 reduces it at each seed's own cost in utility of at most 0.03; on three seeds, paired seed by seed, by the
verdict rule of the leakage matrix (:func:`fdattack.statistics.verdicts.decide`: each seed's within-run spread floors
the seeds' own).

One simulation per (arm, seed), shared by the tests (:func:`tests.conftest.shared_runs`): conf/experiment/
pli_fedmd_att_faces.yaml (FedMD, K = 4, 20 target identities, a 16-pixel box-blurred public look, chance 0.05) shrunk
to 2 rounds, inversion networks of width 64 (PLI 10 epochs a round, TBI 2) and a 15-epoch learned prior; the docs'
table is the config itself (5 rounds, width 128, a 30-epoch prior; about 7 minutes a seed, ``benchmarks/
headline_tables.py``). The prior depends on the public set, its settings and the attacker's seed alone, not on the
defense, so each seed trains it once and the defended run reads it back from the arms' ``cache_dir``
(tests/test_cached_networks.py: the same figures with and without it). About 62 s of one AMD EPYC core a seed.
"""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import pytest

from fdattack.config import compose
from fdattack.experiment import Experiment
from fdattack.statistics.across_seeds import seed_within
from fdattack.statistics.verdicts import Verdict, decide
from tests.conftest import REPO, SHARED_DATA, shared_runs

ATT = SHARED_DATA / "att_faces"
SEEDS = (0, 1, 2)
SHRUNK = (
    "protocol.rounds=2",
    "attack.pli.max_width=64",
    "attack.tbi.max_width=64",
    "attack.tbi.epochs_per_round=2",
    "attack.pli.prior.epochs=15",
    "evaluation.classifier=null",
    "evaluation.confidence_gap.enabled=false",
)
ARMS = {
    "none": ("attacks=[pli,tbi,public_mean]",),
    "laplace_1": ("attacks=[pli]", "defenses=[laplace]", "defense.laplace.scale=1"),
}
CHANCE = 1 / 20

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not ATT.is_dir(), reason=f"AT&T faces not found at {ATT}")]


def _run(out: Path, seed: int, extra: tuple[str, ...]) -> dict[str, float]:
    """One shrunk run's metrics.json, with the prior's scores of round 1 (logged once)."""
    cfg = compose(
        str(REPO / "conf" / "experiment" / "pli_fedmd_att_faces.yaml"),
        [f"output_dir={out}", "logger.wandb.mode=disabled", "logger.progress=never", f"seed={seed}", *SHRUNK, *extra],
    )
    metrics = Experiment(cfg).run()
    first = json.loads((out / "rounds.jsonl").read_text().splitlines()[1])
    return {**metrics, **{k: v for k, v in first.items() if k.startswith("attack/pli/prior_")}}


def _arms_of_seed(seed: int, folder: Path) -> dict[str, dict[str, float]]:
    """Every arm at ``seed``, the learned prior trained once (``cache_dir`` shared by the arms)."""
    cache = f"cache_dir={folder / 'cache'}"
    return {arm: _run(folder / arm, seed, (*extra, cache)) for arm, extra in ARMS.items()}


@pytest.fixture(scope="module")
def att_faces(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, float]]]:
    """Per arm, the runs at seeds 0, 1, 2."""
    runs = {f"seed_{seed}": partial(_arms_of_seed, seed) for seed in SEEDS}
    done = shared_runs(tmp_path_factory, "pli_att_faces", runs)
    return {arm: [done[f"seed_{seed}"][arm] for seed in SEEDS] for arm in ARMS}


def _per_seed(runs: list[dict[str, float]], key: str) -> list[float]:
    return [r[key] for r in runs]


def _within(runs: list[dict[str, float]], key: str) -> list[float]:
    return [seed_within(r, key) for r in runs]


def test_pli_beats_chance_but_not_its_public_only_control_on_att_faces_under_fedmd(att_faces: dict[str, list[dict[str, float]]]) -> None:
    """PLI's attack accuracy (the reconstruction nearest, by SSIM, to its own target's private mean among the targets'
    private means and every label's public mean) against chance, 1/20, and against its control: at each seed the better
    of its learned prior (Eq. 9, trained on public data alone) and the public look (``public_mean``).

    Measured on one AMD EPYC core (AVX-512), seeds 0, 1, 2: PLI 0.35, 0.30, 0.40; prior 0.45, 0.35, 0.70. Against
    chance (δ = one chance level) the verdict is *leaks* (+0.30, its 95 % interval [+0.06, +0.54] with each seed's
    Wilson spread over 20 targets); against the control it is not (−0.15 on the mean): the learned prior speaks, not the
    uploads. The config's 5 rounds give 0.65, 0.55, 0.60 against priors near 0.6 (docs/attacks.md).
    """
    runs = att_faces["none"]
    assert runs[0]["attack/pli/chance"] == pytest.approx(CHANCE)
    accuracy, within = _per_seed(runs, "attack/pli/accuracy"), _within(runs, "attack/pli/accuracy")
    against_chance = decide(accuracy, [CHANCE] * len(SEEDS), CHANCE, within=within, bounds=(0.0, 1.0))
    assert against_chance.verdict is Verdict.leaks, (accuracy, against_chance)
    sources = ("attack/pli/prior_accuracy", "attack/public_mean/accuracy")
    best = [max(sources, key=lambda k, r=r: r[k]) for r in runs]
    control = [r[k] for r, k in zip(runs, best)]
    control_within = [seed_within(r, k) for r, k in zip(runs, best)]
    against_control = decide(accuracy, control, CHANCE, within=[a + b for a, b in zip(within, control_within)], bounds=(0.0, 1.0))
    assert against_control.verdict is not Verdict.leaks, (accuracy, control, against_control)


def test_laplace_noise_of_scale_one_reduces_pli_on_att_faces_at_a_cost_of_at_most_three_points(
    att_faces: dict[str, list[dict[str, float]]],
) -> None:
    """Laplace noise (b = 1) on every upload and query answer against PLI, paired seed by seed.

    Measured on one AMD EPYC core (AVX-512), seeds 0, 1, 2: PLI 0.35, 0.30, 0.40 undefended, 0.05, 0.05, 0.05 under
    Laplace (one target of 20 at every seed, chance 0.05); drops 0.30, 0.25, 0.35. Asserted: the drop's 95 % interval
    (each seed's two Wilson spreads over 20 targets floor the seeds' own) lies above 0, the *reduces* of the matrix:
    [+0.02, +0.58], the thinnest margin of this file (at 3 seeds the Wilson spreads of 20 targets leave no more). It
    is not asserted to reach chance: at 3 seeds one hit in 20 at every seed cannot be shown within one chance level of it
    (the one-sided bound is 0.10); that takes about 10 seeds (``fdattack matrix --decide``).

    Utility beside it (``protocol/client_acc_mean``, every client on the whole test set): 0.263, 0.263, 0.288 both
    undefended and defended (0.262 at seed 1). Asserted: Laplace moves it by at most 0.03 at each of the three seeds (a
    description of these seeds, not a claim of no cost).
    """
    key = "attack/pli/accuracy"
    plain, noisy = _per_seed(att_faces["none"], key), _per_seed(att_faces["laplace_1"], key)
    within = [a + b for a, b in zip(_within(att_faces["none"], key), _within(att_faces["laplace_1"], key))]
    drop = decide(plain, noisy, CHANCE, within=within, bounds=(0.0, 1.0))
    assert drop.verdict is Verdict.leaks and drop.low > 0, (plain, noisy, drop)
    utility = "protocol/client_acc_mean"
    for seed, a, b in zip(SEEDS, _per_seed(att_faces["none"], utility), _per_seed(att_faces["laplace_1"], utility)):
        assert abs(b - a) <= 0.03, (seed, a, b)


def test_pli_draws_the_faces_closer_than_the_public_look_and_tbi_copies_the_public_look(
    att_faces: dict[str, list[dict[str, float]]],
) -> None:
    """Real faces against the floors of public knowledge (PLI's paper, §4.1): PLI's reconstructions are structurally
    closer to the targets' private means than the public-mean baseline is (standard SSIM), and TBI, unlike PLI, lands
    reconstructions nearest the targets' public means (it reproduces the public blur).

    Measured on one AMD EPYC core (AVX-512), seeds 0, 1, 2: standard SSIM to the private mean, PLI 0.338, 0.356,
    0.337 against the public mean's 0.295, 0.303, 0.300; the gaps 0.043, 0.053, 0.037 (sd 0.008): asserted above 0
    (the smallest leaves 0.037, 4.6 sd; another AVX-512 EPYC gave gaps down to 0.027 at seed 42, so no larger bound).
    Reconstructions nearest their public mean (of 20 targets): TBI 3, 4, 3 (2 epochs a round; 5 epochs: 3, 5, 5; 10
    epochs: 5, 6, 6), PLI 0 at every seed; asserted TBI above PLI (the smallest gap, 3, leaves 2 targets, 3.5 sd of
    the gaps). PLI's figures do not depend on TBI's epochs (the same at 2 and 5).
    """
    ssim = "ssim_standard"
    for seed, run in zip(SEEDS, att_faces["none"]):
        assert run[f"attack/pli/{ssim}"] > run[f"attack/public_mean/{ssim}"], (seed, run)
        assert run["attack/tbi/too_close_to_public"] > run["attack/pli/too_close_to_public"], (seed, run)


def test_the_whole_test_set_figure_is_not_saturated_where_the_own_label_figure_is(att_faces: dict[str, list[dict[str, float]]]) -> None:
    """docs/defenses.md: the own-label figure (a client's own 5 identities, one test image each) read 1.00 in every
    defense cell, so no defense could show a cost there; the whole test set (20 identities, 5 of them the client's)
    leaves room. On trained clients, seeds 0, 1, 2: own-label mean 0.95, 0.90, 1.00 (sd 0.05), whole-test mean 0.263,
    0.263, 0.288; the gap 0.687, 0.637, 0.712 (sd 0.038). Asserted per seed: own-label at least 0.8 (the smallest leaves
    0.10, 2 sd) and the whole-test figure at least 0.4 below it (the smallest gap leaves 0.237, 6 sd). It fails where
    the whole-test figure is taken on the own labels, or where the clients do not learn their own identities.
    """
    for seed, run in zip(SEEDS, att_faces["none"]):
        own, whole = run["protocol/client_acc_own_mean"], run["protocol/client_acc_mean"]
        assert own >= 0.8 and whole <= own - 0.4, (seed, own, whole)
