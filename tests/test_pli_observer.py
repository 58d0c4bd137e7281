"""PLI as an observer: client selection (Eq. 11), ablation variants, resumable state, and real runs on digits."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path
from typing import Callable

import pytest
import torch
from torch import Tensor

from fdattack.attacks.base import AttackContext
from fdattack.attacks.pli import PLIAttack, PLISettings, select_reconstructions
from fdattack.attacks.priors import PriorKind, PriorSettings
from fdattack.attacks.state_store import ClientStateStore
from fdattack.config import compose
from fdattack.data.imageset import ImageSet
from fdattack.experiment import run
from fdattack.fd.record import RoundRecord, open_query
from fdattack.fd.threat import AttackerView, ThreatModel
from fdattack.statistics.verdicts import Verdict, decide
from tests.conftest import REPO, shared_runs, tiny

NAIVE = PriorSettings(kind=PriorKind.naive)


def test_selection_picks_the_distinct_clean_candidate() -> None:
    g = torch.Generator().manual_seed(0)
    generic = torch.rand(1, 1, 16, 16, generator=g) * 2 - 1
    owner = torch.rand(1, 1, 16, 16, generator=g) * 2 - 1
    candidates = torch.stack([generic, owner, generic.clone()])  # (K=3, T=1, C, H, W)
    assert select_reconstructions(candidates, beta=0.0).tolist() == [1]
    # a noisy candidate is even less similar to the others, but TV rejects it when beta is large enough
    noisy = (torch.rand(1, 1, 16, 16, generator=g) > 0.5).float() * 2 - 1
    smooth_owner = torch.full((1, 1, 16, 16), 0.3)
    candidates = torch.stack([generic, smooth_owner, generic.clone(), noisy])
    assert select_reconstructions(candidates, beta=0.0).tolist() == [3]
    assert select_reconstructions(candidates, beta=1.0).tolist() == [1]
    assert select_reconstructions(candidates[:1], beta=0.1).tolist() == [0]


def test_pli_runs_every_round(tmp_path: Path) -> None:
    """FedMD on digits (tiny: 2 clients), 3 rounds, every knob small: PLI is scored, and saves its reconstructions,
    every round.

    It used to assert that SSIM improves from round 1 to round 3 (at width 64, 2 epochs a round, lr 1e-4); that does
    not hold with a margin. Measured there on one AMD EPYC core, seeds 42 / 0 / 1 (about 45 s each), SSIM per round:
    0.358, 0.353, 0.367 / 0.356, 0.362, 0.387 / 0.413, 0.444, 0.449; the gain from round 1 to 3 (0.009, 0.031, 0.037)
    has a spread of 0.028, more than the smallest gain (0.3x); standard SSIM's gain (0.010, 0.043, 0.049) likewise
    (spread 0.039). Accuracy at round 3 was 0.2 / 0.4 / 0.2, chance 0.2. So only the run's mechanics and the metrics'
    ranges are asserted, and the run is shrunk to them (width 16, 1 epoch a round, a 2-epoch prior, a 2-epoch
    evaluation classifier: about 7 s instead of 42 s). Seed 42 runs here.
    """
    cfg = compose(
        None,
        tiny(
            tmp_path,
            "attacks=[pli]",
            "protocol.rounds=3",
            "attack.pli.max_width=16",
            "attack.pli.epochs_per_round=1",
            "attack.pli.prior.epochs=2",
            "attack.pli.prior.width=8",
            "evaluation.epochs=2",
            "evaluation.confidence_gap.enabled=false",
        ),
    )
    metrics = run(cfg)
    rows = [json.loads(line) for line in (tmp_path / "run" / "rounds.jsonl").read_text().splitlines()]
    ssim = [r["attack/pli/ssim"] for r in rows[1:]]
    assert len(ssim) == 3 and all(-1.0 <= x <= 1.0 for x in ssim)  # scored every round (no improvement asserted: see above)
    assert 0.0 <= metrics["attack/pli/accuracy"] <= 1.0 and metrics["attack/pli/chance"] == 0.2
    assert (tmp_path / "run" / "images" / "attack_pli_reconstructions_round_0003.png").is_file()
    from PIL import Image

    # one row per target: reconstruction, private mean, public mean (8x8 digits, 5 targets)
    assert Image.open(tmp_path / "run" / "images" / "attack_pli_reconstructions_round_0003.png").size == (3 * 8, 5 * 8)
    saved = torch.load(tmp_path / "run" / "artifacts" / "pli_reconstructions_round_0003.pt", weights_only=True)
    assert saved["images"].shape == (5, 1, 8, 8) and saved["labels"].shape == (5,)
    prior = torch.load(tmp_path / "run" / "artifacts" / "pli_prior_round_0001.pt", weights_only=True)  # scored once, saved once
    assert torch.equal(prior["labels"], saved["labels"]) and prior["images"].shape == (5, 1, 8, 8)


def test_pli_s_learned_prior_recovers_the_targets_and_tbi_does_not_on_digits_with_fedmd(tmp_path: Path) -> None:
    """FedMD on digits, the first of the default 5 rounds, width 128: what holds over seeds is that PLI's learned prior
    (Eq. 9) recovers the targets and TBI, which reproduces the public look, does not.

    Measured on one AMD EPYC core, seeds 42 / 0 / 1 (5 targets, chance 0.2; nearest-mean SSIM accuracy), after round
    1: PLI's prior 1.0 / 1.0 / 1.0, TBI 0.0 / 0.0 / 0.0, PLI 0.2 / 0.2 / 0.0 (17 s a seed). After 3 rounds (an earlier
    measurement, 45 s a seed): prior 1.0 / 1.0 / 1.0 (prior SSIM 0.97-0.98), TBI 0.0 / 0.0 / 0.2, PLI 0.6 / 0.4 / 0.2.
    The prior-TBI gap is 1.0 at every seed after round 1 (1.0, 1.0, 0.8 after 3 rounds); asserting it above 0.2
    leaves 0.8. Not asserted, because it does not hold over seeds: PLI beats TBI (after 3 rounds 0.6 / 0.4 / 0.2
    against 0.0 / 0.0 / 0.2: a tie at chance on seed 1, where TBI's SSIM 0.44 is above PLI's 0.40 and TBI lands fewer
    reconstructions nearest the public means, 3 against PLI's 4), nor PLI above chance (seed 1), nor PLI above its own
    prior (below it on all three). The paper's headline claim is therefore not reproduced on 8x8 digits at this
    scale; seed 42 runs here.
    """
    cfg = compose(
        None,
        [
            f"output_dir={tmp_path / 'run'}",
            "logger.wandb.mode=disabled",
            "logger.progress=never",
            "attacks=[pli,tbi]",
            "attack.pli.max_width=128",
            "attack.tbi.max_width=128",
            "attack.pli.lr=1e-4",
            "attack.tbi.lr=1e-4",
            "evaluation.confidence_gap.enabled=false",
            "protocol.rounds=1",
            "evaluation.classifier=null",
        ],
    )
    metrics = run(cfg)
    assert metrics["attack/pli/chance"] == 0.2
    assert metrics["attack/pli/prior_accuracy"] > metrics["attack/tbi/accuracy"] + 0.2, metrics


def _attack_setup(seed: int = 0, j: int = 6) -> tuple[AttackerView, Callable[[Tensor], RoundRecord]]:
    """A view of a public set of 8x8 images (labels 0..j-1, D_0 and D_a) and records whose outputs come from a ``server_shift``."""
    g = torch.Generator().manual_seed(seed)
    images = torch.rand(48, 1, 8, 8, generator=g) * 2 - 1
    labels = torch.arange(48) % j
    domain = (torch.arange(48) >= 36).long()  # the last 12 are the auxiliary look
    threat = ThreatModel("server", "logits", public_labels_known=True, query_rows="public")
    view = AttackerView(threat, "fedmd", ImageSet.from_images(images, labels, domain), (4, 5), j, (1, 8, 8), has_server_model=True)
    logits = {k: torch.randn(48, j, generator=g) for k in (0, 1)}

    def record(server_shift: Tensor) -> RoundRecord:
        answer = lambda model, rows: (server_shift if model == "server" else logits[model])[rows]  # noqa: E731
        return RoundRecord(
            round=1,
            phase="digest",
            protocol="fedmd",
            participants=(0, 1),
            attack_point=True,
            query=open_query(answer, "pli", 1, "digest", torch.arange(48), (0, 1), has_server=True)[0],
        )

    return view, record


def _pli(view: AttackerView, **knobs: object) -> PLIAttack:
    settings = PLISettings(**{"max_width": 16, "lr": 1e-3, "epochs_per_round": 1, "gamma": 0.3, "prior": NAIVE, **knobs})  # type: ignore[arg-type]
    return PLIAttack(view, settings, AttackContext(seed=0))


def _attack_round(attack: PLIAttack, record: RoundRecord, round: int) -> Tensor:
    attack.on_record(record)
    (result,) = [r for r in attack.on_round_end(round) if r.role == "attack"]
    return result.images


def test_client_only_variant_ignores_the_server_and_reconstructs_from_one_hot() -> None:
    view, record = _attack_setup()
    server_a, server_b = torch.randn(48, 6), torch.randn(48, 6)
    attack = _pli(view, variant="client_only")
    assert attack._module().decoder.net[0].in_channels == 6  # G sees p^k only (R^J)
    assert torch.equal(_attack_round(attack, record(server_a), 1), _attack_round(_pli(view, variant="client_only"), record(server_b), 1))
    assert not torch.equal(_attack_round(_pli(view), record(server_a), 1), _attack_round(_pli(view), record(server_b), 1))


def test_finetune_switch_skips_eq10_only_when_it_would_run() -> None:
    view, record = _attack_setup()
    r = record(torch.randn(48, 6))
    assert not torch.equal(_attack_round(_pli(view, finetune=True), r, 1), _attack_round(_pli(view, finetune=False), r, 1))
    assert torch.equal(
        _attack_round(_pli(view, gamma=0.0, finetune=True), r, 1), _attack_round(_pli(view, gamma=0.0, finetune=False), r, 1)
    )


def test_attack_resumes_exactly_from_its_state_dict(tmp_path: Path) -> None:
    """Networks persisted on disk between rounds; a restored attack continues exactly where the checkpoint was."""
    view, record = _attack_setup()
    r = record(torch.randn(48, 6))
    settings = PLISettings(max_width=16, lr=1e-3, epochs_per_round=1, prior=NAIVE)
    attack = PLIAttack(view, settings, AttackContext(seed=0, store=ClientStateStore(tmp_path / "a")))
    _attack_round(attack, r, 1)
    checkpoint = attack.state_dict()
    straight = _attack_round(attack, r, 2)
    resumed = PLIAttack(view, settings, AttackContext(seed=0, store=ClientStateStore(tmp_path / "a")))
    resumed.load_state_dict(checkpoint)
    assert torch.equal(_attack_round(resumed, r, 2), straight)
    fresh = PLIAttack(view, settings, AttackContext(seed=0))
    assert not torch.equal(_attack_round(fresh, r, 2), straight)  # the restored networks, not new ones, made round 2


def test_pli_with_the_learned_prior_on_digits(tmp_path: Path) -> None:
    """FedMD on digits with the learned (restorer) prior: Table S-3's prior SSIM is logged and beats the naive prior's.

    Measured (prior SSIM, learned / naive), seeds 42 / 0 / 1: 0.957 / 0.747, 0.965 / 0.749, 0.959 / 0.729; the gap
    (0.210, 0.216, 0.229) has a spread of 0.02, and the bound 0.05 leaves 0.16 at the worst seed, 8x that spread.
    The default seed 42 runs here."""
    common = [
        "attacks=[pli]",
        "protocol.rounds=1",
        "attack.pli.max_width=32",
        "attack.tbi.max_width=32",
        "attack.pli.epochs_per_round=1",
        "attack.tbi.epochs_per_round=1",
        "evaluation.confidence_gap.enabled=false",
        "attack.pli.prior.epochs=5",
        "attack.pli.prior.width=16",
        "evaluation.classifier=null",
    ]
    learned = run(compose(None, tiny(tmp_path / "l", *common, "attack.pli.prior.kind=learned")))
    naive = run(compose(None, tiny(tmp_path / "n", *common, "attack.pli.prior.kind=naive")))
    assert learned["attack/pli/prior_ssim"] > naive["attack/pli/prior_ssim"] + 0.05
    assert (tmp_path / "l" / "run" / "images" / "attack_pli_prior_round_0001.png").is_file()


def test_evaluation_classifier_recognises_private_means_not_the_public_mean(tmp_path: Path) -> None:
    """The identity score's classifier is good on held-out images, credits the targets' private means and refuses
    their public means, also under pixel noise.

    Its classes are the 5 targets' private looks, their 5 blurred public looks and the 5 non-target digits, so a copy
    of the public look (the naive route to a high score when the classifier knew only the targets, where any image
    scored 1/5 and top-5 was 1.0) lands in a public-look class, a miss. Measured with classifier seeds 0-2 and noise
    seeds 0-2: the public means score 0/5 every time, clean or with noise of std 0.3 or 0.6; the private means 5/5
    clean and 3/5 to 5/5 with noise of std 0.3 (5/5 at the seeds here), hence the bound of 3/5.
    """
    from fdattack.evaluation import train_identity_scorer
    from fdattack.evaluation.identity import public_look_means
    from fdattack.experiment import Experiment
    from fdattack.functional.attack_accuracy import class_means

    exp = Experiment(compose(None, tiny(tmp_path)))
    split = exp.data.split
    scorer = train_identity_scorer(split, exp.engine, "pdafd_cnn", epochs=30, lr=1e-3, seed=0)
    assert scorer.class_names is not None and len(scorer.class_names) == 15  # 5 private looks, 5 public looks, 5 other digits
    targets = torch.tensor(split.target_labels)
    private = torch.cat([p.images for p in split.private])
    means = class_means(private, torch.cat([p.labels for p in split.private]), split.num_classes)[targets]
    public, public_labels = public_look_means(split)
    assert torch.equal(public_labels, targets)  # every target has public (blurred) images
    assert scorer.test_accuracy > 0.8
    scores = scorer(means, targets)
    assert scores["eval_top1"] == 1.0 and scores["eval_top1_public_look"] == 0.0
    assert scorer(public, public_labels)["eval_top1"] == 0.0  # a copy of the public look is a miss
    noise = torch.randn(means.shape, generator=torch.Generator().manual_seed(0)) * 0.3
    assert scorer(means + noise, targets)["eval_top1"] >= 0.6 and scorer(public + noise, public_labels)["eval_top1"] == 0.0


BLUR32_SEEDS = (0, 1, 2)


def _blur32_run(out: Path, seed: int) -> dict[str, float]:
    """AT&T FedMD with the public faces blurred over all 32 pixels (shrunk, see the tests below): PLI without a prior
    (γ = 0) and the public look, with the learned prior's accuracy of round 1 (scored once)."""
    cfg = compose(
        REPO / "conf" / "experiment" / "pli_fedmd_att_faces.yaml",
        [
            f"output_dir={out}",
            f"seed={seed}",
            "logger.wandb.mode=disabled",
            "logger.progress=never",
            "attacks=[pli,public_mean]",
            "data.blur_strength=32",
            "attack.pli.gamma=0",
            "attack.pli.max_width=64",
            "attack.pli.epochs_per_round=12",
            "attack.pli.prior.epochs=15",
            "protocol.rounds=3",
            "evaluation.classifier=null",
            "evaluation.confidence_gap.enabled=false",
        ],
    )
    metrics = run(cfg)
    prior = json.loads((out / "rounds.jsonl").read_text().splitlines()[1])["attack/pli/prior_accuracy"]
    return {**metrics, "attack/pli/prior_accuracy": prior}


@pytest.fixture(scope="module")
def blur32(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, float]]:
    """:func:`_blur32_run` at seeds 0-2, each once per session (:func:`tests.conftest.shared_runs`)."""
    done = shared_runs(tmp_path_factory, "pli_blur32", {f"seed_{s}": partial(_blur32_run, seed=s) for s in BLUR32_SEEDS})
    return [done[f"seed_{s}"] for s in BLUR32_SEEDS]


@pytest.mark.slow
def test_pli_beats_its_prior_where_the_public_look_hides_the_identities(blur32: list[dict[str, float]]) -> None:
    """PLI's own contribution (pli.md §11.1 item 4, the γ trade-off): where the public look hides the identities, the
    logits reveal what the public set alone cannot. AT&T FedMD with the public faces box-blurred over all 32 pixels:
    PLI without a prior (γ = 0: Eq. 3 on D_0 alone) against its learned prior (Eq. 9, a deblurring translator trained on
    the public set), both scored by the attack accuracy (nearest private mean by SSIM, 20 targets, chance 0.05).

    K = 4, 3 rounds, G of width 64 trained 12 epochs a round, a 15-epoch prior. Measured on one AMD EPYC core
    (AVX-512), seeds 0 / 1 / 2, about 47 s each: PLI 0.45 / 0.35 / 0.40, prior 0.15 / 0.00 / 0.15, the difference
    0.30 / 0.35 / 0.25 (mean 0.30, sd 0.05). At 20 epochs a round PLI 0.50 / 0.40 / 0.50 against 0.15 / 0.05 / 0.20;
    at 20 epochs and 5 rounds 0.55 / 0.55 / 0.30, at 20 epochs and 2 rounds 0.30 / 0.35 / 0.20. The worst margin over
    0 is 0.25 (five targets), 5 sd of the differences. Each seed is asserted on its own (the claim is "at every seed").
    """
    for seed, final in zip(BLUR32_SEEDS, blur32):
        assert final["attack/pli/accuracy"] > final["attack/pli/prior_accuracy"], (seed, final["attack/pli/accuracy"])


@pytest.mark.slow
def test_pli_leaks_beyond_its_public_only_control_where_the_public_look_hides_the_identities(blur32: list[dict[str, float]]) -> None:
    """The README's "PLI leaks where the public look hides the identities", by the verdict rule of the leakage matrix
    (:func:`fdattack.statistics.verdicts.decide`): PLI's accuracy against its control, at each seed the best of what
    the attacker gets without the uploads (its learned prior, the public look, chance), paired seed by seed; the margin
    is the accuracy kind's, one chance level. The public look of a face averaged over all 32 pixels names no identity
    (0 at every seed), so the control is the prior, or chance where the prior scores below it. Measured on one AMD EPYC
    core (AVX-512), seeds 0 / 1 / 2: PLI 0.45 / 0.35 / 0.40 against the control's 0.15 / 0.05 / 0.15, differences
    0.30 / 0.30 / 0.25, whose 95 % t interval [0.21, 0.36] lies above 0. It fails where PLI reads nothing from the
    logits (it then scores what the prior does, or chance).
    """
    chance = blur32[0]["attack/pli/chance"]
    values = [final["attack/pli/accuracy"] for final in blur32]
    controls = [max(final["attack/pli/prior_accuracy"], final["attack/public_mean/accuracy"], chance) for final in blur32]
    decision = decide(values, controls, chance, bounds=(0.0, 1.0))
    assert decision.verdict is Verdict.leaks, (decision, values, controls)


def test_attacks_are_passive(tmp_path: Path) -> None:
    """Running PLI and TBI changes nothing the protocol does: same protocol metrics as without attacks."""
    small = [
        "attack.pli.max_width=16",
        "attack.tbi.max_width=16",
        "attack.pli.epochs_per_round=1",
        "attack.tbi.epochs_per_round=1",
        "attack.pli.prior.epochs=1",
        "attack.pli.prior.width=8",
        "evaluation.epochs=2",
    ]
    watched = run(compose(None, tiny(tmp_path / "a", *small, "attacks=[pli,tbi]")))
    alone = run(compose(None, tiny(tmp_path / "b")))
    protocol = {k: v for k, v in alone.items() if k.startswith("protocol/")}
    assert protocol and {k: watched[k] for k in protocol} == protocol
