"""PDA-FD's attacks end to end (pdafd.md §5, §6): they beat their baselines on real data, reach the targets' outputs only
through the server's Adversary, hold no membership ground truth, choose references as specified, and keep their
students on disk for resume."""

from __future__ import annotations

import json
from pathlib import Path

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader

from fdattack.attacks.results import MembershipScores
from fdattack.cli import main
from fdattack.config import compose
from fdattack.engine import LocalTrainer
from fdattack.experiment import Experiment
from fdattack.lit.student import DistillationStudent
from tests.conftest import REPO, SHARED_DATA, tiny
from tests.object_graph import reachable
from tests.test_bad_input import _one_line
from tests.test_threat_model import FORBIDDEN

DIGITS = str(REPO / "conf" / "experiment" / "ldia_lira_fedmd_digits.yaml")
MNIST = str(REPO / "conf" / "experiment" / "ldia_lira_dsfl_mnist.yaml")
#: a small DS-FL on digits: 4 clients, one round, every LiRA knob at its smallest
SMALL = [
    "protocol=dsfl_pdafd",
    "data.split=random",
    "data.partition=dirichlet",
    "data.min_client_size=16",
    "protocol.num_clients=4",
    "protocol.rounds=1",
    "protocol.warmup_private_epochs=2",
    "protocol.private_epochs=1",
    "protocol.distill_epochs=1",
    "protocol.public_per_round=100",
    "attack.lira_distill.students=2",
    "attack.lira_distill.epochs=1",
    "evaluation.max_candidates=300",
]


#: experiments whose data is not shipped (composed below with a stand-in root): the paper's model, public samples per
#: round and public set from another dataset (name, size) for each (pdafd.md §7.1, §7.3, §7.4)
PAPER_SCALE = {
    "pdafd_cifar10": ("resnet18_gn", 5000, None),
    "pdafd_fashion_mnist": ("pdafd_cnn", 5000, None),
    "pdafd_cinic10": ("mobilenet_v2", 10000, None),
    "pdafd_purchase": ("mlp", 5000, None),
    "pdafd_cifar10_cifar100": ("resnet18_gn", 5000, ("cifar100", 10000)),
}


def _metrics(path: Path) -> dict[str, float]:
    return json.loads((path / "metrics.json").read_text())


@pytest.mark.slow
@pytest.mark.parametrize("seed", [42, 0, 1])
def test_ldia_and_distillation_lira_and_rmia_beat_their_baselines_on_mnist(tmp_path: Path, seed: int) -> None:
    """DS-FL on 2,000 MNIST digits, 5 clients, Dirichlet(1); the attacks at round 1 with 2 students per client each.

    Measured on one AMD EPYC core, seeds 42 / 0 / 1, about 13 s each:

    - LDIA's KL 0.070 / 0.120 / 0.101; the uniform guess's 0.331 / 0.389 / 0.380 and 1,000 random guesses' mean 0.619 /
      0.680 / 0.665. Uniform minus LDIA: 0.261 / 0.268 / 0.279, spread 0.018; the bound 0.15 leaves 0.111, 6x. Random
      minus LDIA: 0.549 / 0.560 / 0.564, spread 0.015; the bound 0.4 leaves 0.149, 10x. (The ratios moved more: the
      former bounds, KL under half the uniform's and a quarter of the random's, left 1.9x and 1.1x their spreads.)
    - LDIA's Chebyshev distance 0.098 / 0.118 / 0.117; random guesses' mean 0.186 / 0.202 / 0.194: the gap 0.088 /
      0.084 / 0.077 (spread 0.011) over the bound 0.04 leaves 0.037, 3.4x. Not asserted: below the uniform guess's
      (0.166 / 0.179 / 0.166; gap 0.068 / 0.060 / 0.050, 2.7x its spread 0.019 above 0), and the former bound, 0.6 x
      the random mean, fails on seed 1 (0.117 against 0.116).
    - distillation LiRA's AUC with 2 students 0.632 / 0.616 / 0.626 (seed 2: 0.613; with 4 students 0.677 / 0.644 / 0.669 /
      0.637): range 0.016; the bound 0.58 leaves 0.036 at the worst seed, 2.2x the range. With ~266 members and as many
      non-members per client, the mean AUC's null sd is 0.011, so 0.58 is some 7 null sd from chance. Not asserted: its
      TPR at 1 % FPR, 1.3 / 1.2 / 1.5 % (chance 1 %).
    - distillation RMIA (Zarifzadeh et al., ICML 2024) on the same simulation with as few students keeps its power, as
      its paper says it does with few references: AUC 0.697 / 0.682 / 0.672 (seed 2: 0.667; with 4 students 0.701 /
      0.686 / 0.686 / 0.671), over LiRA's by 0.065 / 0.066 / 0.046 (seed 2: 0.054; range 0.020 over the four seeds;
      mean +0.058 [+0.043, +0.073], `benchmarks/headline_tables.py --tables few_references --seeds 42 0 1 2`).
      The bound 0.62 on its AUC leaves 0.052 at the worst seed (1.7x its range 0.030); the bound 0.02 on its lead leaves
      0.026 (1.3x the lead's range; the worst lead is 2.3x the bound). Not asserted: its TPR at 1 % FPR 8.5 / 7.9 / 5.9 %
      (LiRA's 1.3 / 1.2 / 1.5 %).
    - Not asserted: co-op RMIA's AUC 0.614 / 0.639 / 0.630 (seed 2: 0.619) and its lead over co-op LiRA (+0.017 /
      +0.032 / +0.023 / +0.003 at seeds 42, 0, 1, 2: too thin at seed 2). The three seeds run here.
    """
    out = tmp_path / "run"
    assert (
        main(
            [
                "run",
                MNIST,
                f"data.root={SHARED_DATA / 'mnist_t10k'}",
                "data.max_per_class=200",
                "protocol.num_clients=5",
                "protocol.rounds=1",
                "protocol.public_per_round=300",
                "attacks=[ldia,lira_distill,rmia_distill]",
                "attack.lira_distill.students=2",
                "attack.rmia_distill.students=2",
                "evaluation.bootstrap_resamples=100",  # the intervals are not asserted here
                "logger.wandb.mode=disabled",
                "logger.progress=never",
                f"output_dir={out}",
                f"seed={seed}",
            ]
        )
        == 0
    )
    m = _metrics(out)
    assert m["attack/ldia/kl"] < m["attack/ldia/uniform_kl"] - 0.15 and m["attack/ldia/kl"] < m["attack/ldia/random_kl_mean1000"] - 0.4, m
    assert m["attack/ldia/chebyshev"] < m["attack/ldia/random_chebyshev_mean1000"] - 0.04, m
    assert m["attack/lira_distill/auc"] > 0.58, m
    assert m["attack/rmia_distill/auc"] > 0.62 and m["attack/rmia_distill/auc"] > m["attack/lira_distill/auc"] + 0.02, m
    assert m["attack/lira_distill/clients_scored"] == m["attack/rmia_distill/clients_scored"] == 5.0


@pytest.mark.parametrize("seed", [42, 0, 1])
def test_ldia_beats_the_random_and_uniform_guesses_on_digits(tmp_path: Path, seed: int) -> None:
    """FedMD on digits, 2 rounds. Measured (LDIA KL / uniform guess's KL / mean of 1,000 random guesses' KL), seeds 42, 0,
    1: 0.087 / 0.344 / 0.629, 0.073 / 0.335 / 0.624, 0.065 / 0.299 / 0.589. LDIA's KL over the uniform guess's is 0.25,
    0.22, 0.22 (spread 0.04); the bound 0.5 leaves 0.25 at the worst seed, 7x that spread. Half the uniform KL stays
    far below the random guesses' (0.15-0.17 against 0.59-0.63). Each seed is asserted on its own: the README says the
    first run's LDIA leaks at every seed."""
    out = tmp_path / "run"
    assert (
        main(
            [
                "run",
                DIGITS,
                "attacks=[ldia]",
                "protocol.rounds=2",
                f"seed={seed}",
                "logger.wandb.mode=disabled",
                "logger.progress=never",
                f"output_dir={out}",
            ]
        )
        == 0
    )
    rows = [json.loads(line) for line in (out / "rounds.jsonl").read_text().splitlines()]
    assert [("attack/ldia/kl" in r) for r in rows] == [False, True, True]  # LDIA reads the uploads of rounds 1 and 2
    m = _metrics(out)
    assert m["attack/ldia/kl"] < m["attack/ldia/uniform_kl"] / 2 < m["attack/ldia/random_kl_mean1000"]


@pytest.mark.parametrize("insert", ["query", "batch"])
def test_targets_outputs_reach_the_attack_only_through_the_adversary(tmp_path: Path, insert: str) -> None:
    exp = Experiment(compose(None, [*tiny(tmp_path), *SMALL, "attacks=[lira_coop]", f"attack.lira_coop.insert={insert}"]))
    candidates = len(exp.view.candidates)  # type: ignore[arg-type]
    final = exp.run()
    rows = [json.loads(line) for line in (tmp_path / "run" / "rounds.jsonl").read_text().splitlines()]
    if insert == "query":  # asked each client once, while round 1's upload phase was open
        assert final["adversary/lira_coop/queries"] == 4 and final["adversary/lira_coop/query_samples"] == 4 * candidates
        assert "adversary/lira_coop/added_samples" not in final
    else:  # appended to round 1's public batch: every client uploaded on 100 rows + the candidates
        assert final["adversary/lira_coop/added_samples"] == candidates and "adversary/lira_coop/queries" not in final
        assert rows[1]["comm/upload_bytes"] == 4 * (100 + candidates) * 10 * 4
    assert 0.0 <= final["attack/lira_coop/auc"] <= 1.0 and final["attack/lira_coop/clients_scored"] == 4


def test_two_attacks_inserting_into_one_batch_each_find_their_candidates(tmp_path: Path) -> None:
    exp = Experiment(
        compose(
            None,
            [
                *tiny(tmp_path),
                *SMALL,
                "attacks=[lira_coop,lira_distill]",
                "attack.lira_coop.insert=batch",
                "attack.lira_distill.insert=batch",
            ],
        )
    )
    candidates = len(exp.view.candidates)  # type: ignore[arg-type]
    final = exp.run()
    rows = [json.loads(line) for line in (tmp_path / "run" / "rounds.jsonl").read_text().splitlines()]
    assert rows[1]["comm/upload_bytes"] == 4 * (100 + 2 * candidates) * 10 * 4  # both blocks went out
    assert final["adversary/lira_coop/added_samples"] == final["adversary/lira_distill/added_samples"] == candidates
    assert final["attack/lira_coop/clients_scored"] == final["attack/lira_distill/clients_scored"] == 4


def test_membership_attacks_hold_the_candidates_but_not_whose_they_are(tmp_path: Path) -> None:
    exp = Experiment(compose(None, [*tiny(tmp_path), *SMALL, "attacks=[ldia,lira_coop,lira_distill]"]))
    exp.run()
    pool = exp.evaluator.scorers[MembershipScores].pool  # type: ignore[attr-defined]
    assert bool((pool.origin == -1).any()) and len(set(pool.origin.tolist())) == 5  # test samples and every client's
    assert abs(float(torch.corrcoef(torch.stack([pool.origin.float(), torch.arange(len(pool.origin)).float()]))[0, 1])) < 0.2  # shuffled
    private = [p.images.untyped_storage().data_ptr() for p in exp.data.split.private]
    members = {k: pool.origin == k for k in range(4)}
    for obj in reachable(*exp.attacks):
        assert not isinstance(obj, FORBIDDEN), f"an attack reaches a {type(obj).__name__}"
        if torch.is_tensor(obj) and obj.numel():
            assert obj.untyped_storage().data_ptr() not in private, "an attack reaches a private set"
            if obj.shape == pool.origin.shape and not obj.is_floating_point():
                assert not torch.equal(obj, pool.origin), "an attack holds the candidates' origin"
                assert not any(torch.equal(obj.bool(), m) for m in members.values()), "an attack holds a client's member mask"


def test_coop_references_follow_beta(tmp_path: Path) -> None:
    wide = Experiment(compose(None, [*tiny(tmp_path / "a"), *SMALL, "attacks=[lira_coop]", "attack.lira_coop.beta=1000"])).run()
    assert wide["attack/lira_coop/references_mean"] == 3 and wide["attack/lira_coop/fallback_clients"] == 0
    assert wide["attack/lira_coop/auc"] == wide["attack/lira_coop_all/auc"]  # every other client passes: the same test
    narrow = Experiment(
        compose(
            None, [*tiny(tmp_path / "b"), *SMALL, "attacks=[lira_coop]", "attack.lira_coop.beta=1e-9", "attack.lira_coop.min_references=2"]
        )
    ).run()
    assert narrow["attack/lira_coop/references_mean"] == 2 and narrow["attack/lira_coop/fallback_clients"] == 4


def test_coop_with_two_clients_and_lira_on_fedavg_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _one_line(capsys, ["run", *tiny(tmp_path), *SMALL, "protocol.num_clients=2", "attacks=[lira_coop]"], "lira_coop", "3 clients")
    _one_line(
        capsys, ["run", *tiny(tmp_path / "f"), "protocol=fedavg", "data.split=random", "data.partition=iid", "attacks=[ldia]"], "ldia"
    )


def test_students_are_kept_in_the_run_directory_and_reused_on_resume(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    trained: list[str] = []
    fit_many = LocalTrainer.fit_many

    def counting(self: LocalTrainer, jobs: list) -> list:
        trained.extend(job.handle.name for job in jobs)
        return fit_many(self, jobs)

    monkeypatch.setattr(LocalTrainer, "fit_many", counting)
    args = [*tiny(tmp_path), *SMALL, "attacks=[ldia,lira_distill]", "protocol.rounds=2", "keep_checkpoints=3"]
    reference = Experiment(compose(None, args)).run()
    students = [name for name in trained if name.startswith("lira_distill")]
    assert len(students) == 4 * 2
    cached = sorted((tmp_path / "run" / "attack_state" / "lira_distill" / "students").glob("round_0001_client_*.pt"))
    assert len(cached) == 4
    for r in (1, 2):  # resume from round 0's checkpoint: round 1 runs again
        (tmp_path / "run" / "checkpoints" / f"round_000{r}.pt").unlink()
    trained.clear()
    resumed = Experiment(compose(None, [*args, "resume=true"])).run()
    assert not [name for name in trained if name.startswith("lira_distill")], "the cached students were trained again"
    assert {k: v for k, v in resumed.items() if not k.startswith("time/")} == {
        k: v for k, v in reference.items() if not k.startswith("time/")
    }


def test_distillation_student_trains_with_a_plain_lightning_trainer() -> None:
    torch.manual_seed(0)
    student = DistillationStudent("pli_cnn", 10, loss="l1", in_channels=1, image_size=8)
    x = torch.randn(128, 1, 8, 8)
    teacher = torch.nn.Linear(64, 10)(x.flatten(1)).detach()
    loader = DataLoader([{"x": a, "target": b} for a, b in zip(x, teacher)], batch_size=32)
    before = float(student.objective(student(x), {"x": x, "target": teacher}))  # type: ignore[arg-type]
    L.Trainer(max_epochs=30, logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False).fit(
        student, loader
    )
    after = float(student.objective(student(x), {"x": x, "target": teacher}))  # type: ignore[arg-type]
    assert after < 0.75 * before and student.hparams["loss"] == "l1"


def test_stratified_public_rows_spread_over_the_labels(tmp_path: Path) -> None:
    exp = Experiment(compose(None, [*tiny(tmp_path), *SMALL, "attacks=[]", "protocol.public_stratified=true"]))
    counts = torch.bincount(exp.data.split.public.labels[exp.protocol.public_rows(1)], minlength=10)
    assert int(counts.sum()) == 100 and int(counts.max()) - int(counts.min()) <= 1
    exp.run_dir.release()


@pytest.mark.parametrize("experiment", PAPER_SCALE)
@pytest.mark.parametrize("protocol", ["fedmd_pdafd", "dsfl_pdafd", "cronus"])
def test_paper_scale_experiments_compose_to_the_papers_settings(tmp_path: Path, experiment: str, protocol: str) -> None:
    model, per_round, public = PAPER_SCALE[experiment]
    cfg = compose(
        str(REPO / "conf" / "experiment" / f"{experiment}.yaml"),
        [f"protocol={protocol}", f"data.root={tmp_path}", f"data.public_dataset.root={tmp_path}"],
    )
    assert cfg.model.name == model
    assert (cfg.protocol.num_clients, cfg.protocol.rounds, cfg.protocol.public_per_round, cfg.protocol.public_stratified) == (
        10,
        10,
        per_round,
        True,
    )
    assert cfg.data.public_fraction == 0.2 and cfg.data.partition == "dirichlet" and cfg.data.min_client_size == 64
    assert (None if cfg.data.public_dataset.name is None else (cfg.data.public_dataset.name, cfg.data.public_dataset.size)) == public
    assert list(cfg.attacks) == (["ldia", "lira_distill"] if public else ["ldia", "lira_coop", "lira_distill"])  # no co-op row in Table 4
    assert (cfg.attack.lira_distill.students, cfg.attack.lira_distill.epochs, cfg.attack.lira_coop.beta) == (32, 20, 0.1)
    assert cfg.protocol.optim.lr == 1e-3 and cfg.protocol.optim.weight_decay == 0.0
