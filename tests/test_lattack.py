"""The L-Attack (lattack.md §2): the generator step against the chain rule by hand, its losses and views on hand-made
answers (LabelAvg's strong view blind where c* is top-1 or outside the top K), the gradient check against autograd,
and runs on digits: the victim distils toward its own upload, queries and their encoded bytes are counted, the decoy
reaches the victim alone and the injected fakes as Algorithm 1 says, nothing private is reachable, resume restores the generator,
bad settings exit 2; on real digits the generator trained on FedMD makes its victim far surer of c* than an untrained one
(whether its 8x8 images are 0s depends on the seed, see that test), and on real MNIST the attack as Algorithm 1 prints
it draws images an independent classifier calls c*."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import pytest
import torch
from torch import Tensor, nn

from fdattack.attacks.base import Attack, AttackContext
from fdattack.attacks.lattack import LAttack, answer_loss
from fdattack.attacks.results import AttackResult, GradientProbe, Inversions
from fdattack.cli import main
from fdattack.config import compose
from fdattack.defenses import Release
from fdattack.defenses.labelavg import LabelAvgUpload, LabelAvgUploadSettings
from fdattack.engine import default_engine
from fdattack.evaluation.evaluator import Evaluator
from fdattack.evaluation.gradient_check import gradient_cosines, true_gradient
from fdattack.experiment import Experiment
from fdattack.fd.protocols.fedmd import consensus
from fdattack.fd.protocols.labelavg import vote_smoothing
from fdattack.fd.record import RoundRecord
from fdattack.fd.threat import ServerAggregation
from fdattack.functional import smooth_labels, target_class_loss
from fdattack.functional.zeroth_order import forward_difference_gradient
from fdattack.lit.lattack import LAttackGenerator
from fdattack.randomness import derive_seed
from tests.conftest import REPO, tiny
from tests.object_graph import reachable
from tests.test_bad_input import _one_line
from tests.test_threat_model import _assert_nothing_private

#: 8x8 digits: classes 5-9 public, client k holds classes k and k+1; the L-Attack and the evaluation at their smallest
DIGITS = [
    "data.split=classes",
    "data.public_classes=[5,6,7,8,9]",
    "data.partition=two_classes",
    "evaluation.classifier=null",
    "evaluation.confidence_gap.enabled=false",
    "evaluation.inversion.epochs=1",
    "attacks=[lattack]",
    "attack.lattack.width=8",
    "attack.lattack.samples=4",
]
#: FedMD's (and LabelAvg's) transfer phase at its shortest
SHORT = ["protocol.transfer_public_epochs=1", "protocol.transfer_private_epochs=1"]
FEDMD_LOGITS = ServerAggregation(consensus, "logits")
LABELAVG_K3 = ServerAggregation(partial(vote_smoothing, k=3, mix_alpha=0.5, ground_truth=True, renorm=False), "probs")


# ---------------------------------------------------------------------------------------------------- the generator
def test_generator_step_is_the_chain_rule_and_one_adam_step_by_hand() -> None:
    torch.manual_seed(0)
    module = LAttackGenerator((1, 8, 8), z_dim=6, width=4, lr=1e-2)
    before = {k: v.clone() for k, v in module.generator.named_parameters()}
    handle = default_engine().setup("generator", module)
    z, g_hat = torch.randn(5, 6), torch.randn(5, 1, 8, 8)
    x = handle.wrapped(z)
    assert x.shape == (5, 1, 8, 8) and float(x.detach().min()) >= -1 and float(x.detach().max()) <= 1  # the clients' image range
    # Eq. 5 by autograd on the surrogate mean_b <ĝ_b, x_b>, then Adam's first step: θ - η g / (|g| + 1e-8)
    grads = dict(zip(before, torch.autograd.grad((g_hat * x).sum() / 5, list(module.generator.parameters()), retain_graph=True)))
    module.apply_estimate(x, g_hat)
    for name, p in module.generator.named_parameters():
        torch.testing.assert_close(p.grad, grads[name])  # ∇_θ L = ĝ/B · ∂x/∂θ_g
        torch.testing.assert_close(p.detach(), before[name] - 1e-2 * grads[name] / (grads[name].abs() + 1e-8), rtol=1e-5, atol=1e-6)
    assert LAttackGenerator((3, 12, 28)).generator(torch.randn(2, 100)).shape == (2, 3, 12, 28)
    with pytest.raises(ValueError, match="multiples of 4"):
        LAttackGenerator((1, 10, 10))


# ---------------------------------------------------------------------------------------------------- losses and views
def test_losses_on_hand_made_logits_and_probabilities() -> None:
    logits = torch.tensor([[2.0, 0.0, -1.0]])
    p = torch.softmax(logits, dim=-1)
    torch.testing.assert_close(target_class_loss(logits, 1, "ce", "logits"), -torch.log(p[:, 1]))
    torch.testing.assert_close(target_class_loss(logits, 1, "neg_logit", "logits"), torch.tensor([0.0]))
    torch.testing.assert_close(target_class_loss(logits, 0, "neg_prob", "logits"), -p[:, 0])
    q = torch.tensor([[0.5, 0.0, 0.25]])
    torch.testing.assert_close(target_class_loss(q, 1, "ce", "probs"), torch.tensor([-torch.log(torch.tensor(1e-8))]))
    torch.testing.assert_close(target_class_loss(q, 2, "neg_prob", "probs"), torch.tensor([-0.25]))
    with pytest.raises(ValueError, match="needs logits"):
        target_class_loss(q, 0, "neg_logit", "probs")
    # under FedMD both views read the logits: the mean of one upload is itself
    for view in ("paper", "strong"):
        torch.testing.assert_close(answer_loss(logits, 1, "ce", view, FEDMD_LOGITS), -torch.log(p[:, 1]))


def test_labelavg_views_on_hand_made_label_vectors() -> None:
    # w ⊙ v with K = 3: c* = 1 second (β = 0.5); c* = 0 top-1; c* = 3 outside the top 3
    answers = torch.tensor([[1.0, 0.5, 0.25, 0.0], [1.0, 0.5, 0.25, 0.0], [1.0, 0.5, 0.25, 0.0]])
    strong = answer_loss(answers, 1, "ce", "strong", LABELAVG_K3)
    torch.testing.assert_close(strong, torch.full((3,), -torch.log(torch.tensor(0.5 + 1e-8))))
    # paper: Eqs. 11-12 with N = 1, v_main the max vote (the top-1 label): (1 - α) [c* = 0] + α β_c* / K
    paper = answer_loss(answers, 1, "ce", "paper", LABELAVG_K3)
    torch.testing.assert_close(paper, torch.full((3,), -torch.log(torch.tensor(0.5 * 0.5 / 3 + 1e-8))))
    torch.testing.assert_close(paper, -torch.log(smooth_labels(answers[None], 3, 0.5)[:, 1] + 1e-8))
    torch.testing.assert_close(answer_loss(answers, 0, "neg_prob", "paper", LABELAVG_K3), torch.full((3,), -(0.5 + 0.5 / 3)))


@pytest.mark.parametrize("view", ["strong", "paper"])
def test_labelavg_answers_give_zero_differences_unless_c_star_is_in_the_top_k_below_the_top(view: str) -> None:
    """A linear victim with logits (3, 1, 0, -3) · s(x): c* = 0 is top-1, c* = 3 outside the top 3, c* = 1 in between."""
    torch.manual_seed(0)
    direction = torch.randn(1, 4, 4)
    scale = torch.tensor([3.0, 1.0, 0.0, -3.0])
    upload = LabelAvgUpload(LabelAvgUploadSettings(k=3), seed=0)

    def answers(points: Tensor) -> Tensor:
        logits = (1 + (points * direction).flatten(1).sum(1, keepdim=True)) * scale
        return upload.transform(logits, Release(0, 1, "upload", "logits", b""))

    x = torch.zeros(6, 1, 4, 4)
    for target, blind in ((0, True), (3, True), (1, False)):
        loss = lambda points, target=target: answer_loss(answers(points), target, "ce", view, LABELAVG_K3)  # noqa: E731
        estimate, used = forward_difference_gradient(loss, x, 8, 0.1, torch.Generator().manual_seed(1))
        assert used == 6 * 9 and bool((estimate == 0).all()) == blind, (target, view)


# ---------------------------------------------------------------------------------------------------- the gradient check
def test_zeroth_order_estimates_approach_the_true_gradient_with_many_directions() -> None:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Flatten(), nn.Linear(16, 8), nn.Tanh(), nn.Linear(8, 3))
    points = torch.rand(8, 1, 4, 4) * 2 - 1
    loss = lambda x: target_class_loss(net(x), 2, "ce", "logits").detach()  # noqa: E731
    truth = true_gradient(net, points, 2, "ce")
    assert not any(p.grad is not None for p in net.parameters())  # the truth leaves the victim's parameters alone
    cosine = {
        m: float(gradient_cosines(forward_difference_gradient(loss, points, m, 0.01, torch.Generator().manual_seed(m))[0], truth).mean())
        for m in (5, 2000)
    }
    # small d, large m (spec §9): near the truth; m = 5 at d = 16: E cos ≈ sqrt(5/21) ≈ 0.5
    assert cosine[2000] > 0.9 and cosine[5] < 0.75, cosine


# ---------------------------------------------------------------------------------------------------- runs
@pytest.fixture
def results(monkeypatch: pytest.MonkeyPatch) -> list[AttackResult]:
    """The L-Attack's results, in order, as the evaluator receives them."""
    kept: list[AttackResult] = []
    score = Evaluator.score

    def keep(self: Evaluator, attack: str, found: list[AttackResult]):  # type: ignore[no-untyped-def]
        kept.extend(found)
        return score(self, attack, found)

    monkeypatch.setattr(Evaluator, "score", keep)
    return kept


@pytest.fixture
def unscored_inversions(monkeypatch: pytest.MonkeyPatch) -> None:
    """Inversions are left out of the evaluator (no evaluation classifier to train where a test checks other things)."""
    score = Evaluator.score
    monkeypatch.setattr(
        Evaluator, "score", lambda self, attack, found: score(self, attack, [r for r in found if not isinstance(r, Inversions)])
    )


class _Spy(Attack):
    """Runs after the L-Attack: keeps the victim's upload and the aggregate, walks what the L-Attack reaches."""

    name = "spy"

    def __init__(self, exp: Experiment) -> None:
        super().__init__(exp.view, None, AttackContext(seed=0))
        self.exp = exp  # the test's own handle on the run (never given to an attack)
        self.uploads: dict[int, Tensor] = {}
        self.aggregate: Tensor | None = None
        self.walks = 0

    def _walk(self, *extra: object) -> None:
        lattack = [a for a in self.exp.attacks if isinstance(a, LAttack)]
        _assert_nothing_private(list(reachable(*lattack, *extra)), self.exp.data.split, self.exp.engine)
        self.walks += 1

    def on_record(self, record: RoundRecord) -> None:
        if record.phase == "upload":
            self.uploads = {k: u.outputs for k, u in record.uploads.items()}  # type: ignore[misc]
        if record.phase == "aggregate":
            self.aggregate = record.aggregate
        self._walk(record)

    def on_round_end(self, round: int) -> list[AttackResult]:
        self._walk()
        return []


def _spied(exp: Experiment) -> tuple[_Spy, dict[int, Tensor]]:
    """A :class:`_Spy` after the run's attacks, and the soft targets each client last trained toward (filled as it runs)."""
    spy = _Spy(exp)
    exp.observe(spy)
    targets: dict[int, Tensor] = {}
    fit_many = exp.engine.fit_many

    def record_targets(jobs):  # type: ignore[no-untyped-def]
        for job in jobs:
            if job.targets is not None:
                targets[int(job.handle.name.removeprefix("client"))] = job.targets
        return fit_many(jobs)

    exp.engine.fit_many = record_targets  # type: ignore[method-assign]
    return spy, targets


@pytest.mark.parametrize("protocol", ["fedmd", "labelavg"])
@pytest.mark.usefixtures("unscored_inversions")
def test_victim_distils_toward_its_own_upload_and_queries_are_counted(tmp_path: Path, protocol: str) -> None:
    exp = Experiment(
        compose(
            None,
            tiny(
                tmp_path,
                *DIGITS,
                f"protocol={protocol}",
                *SHORT,
                "protocol.num_clients=3",
                "protocol.rounds=1",
                "attack.lattack.victim=1",
                "attack.lattack.target_class=1",
                "attack.lattack.m=3",
                "attack.lattack.batch_size=4",
                "attack.lattack.steps_per_round=2",
            ),
        )
    )
    spy, targets = _spied(exp)
    exp.run()
    assert spy.walks >= 5 and spy.aggregate is not None
    # the victim digests the server's aggregate of its own upload alone, the others the real aggregate
    own = spy.uploads[1]
    if protocol == "labelavg":  # vote smoothing of its w ⊙ v alone, v_main the public label
        own = smooth_labels(own[None], 3, 0.5, exp.data.split.public.labels[exp.protocol.public_rows(1)])
    torch.testing.assert_close(targets[1], own)
    torch.testing.assert_close(targets[0], spy.aggregate)
    assert not torch.allclose(targets[1], spy.aggregate)
    # 2 steps of B(m + 1) = 16 query images; bytes as encoded: C logits, or K labels and K weights, 4 bytes each
    row = [json.loads(line) for line in (tmp_path / "run" / "rounds.jsonl").read_text().splitlines()][1]
    per_image = 2 * 3 * 4 if protocol == "labelavg" else exp.data.split.num_classes * 4
    assert row["adversary/lattack/queries"] == 2 and row["adversary/lattack/query_samples"] == 32
    assert row["adversary/lattack/query_bytes"] == 32 * per_image and row["adversary/lattack/sent_aggregates"] == 1
    assert 0 <= row["attack/lattack/grad_cosine"] <= 1


@pytest.mark.parametrize("protocol", ["fedmd", "labelavg"])
@pytest.mark.usefixtures("unscored_inversions")
def test_decoy_images_join_the_next_batch_and_the_victim_alone_is_told_they_are_the_decoy(tmp_path: Path, protocol: str) -> None:
    """§2.1's optional Hitaj decoy: the images added after round 1's steps are the last rows of round 2's batch; the victim's
    targets there are the decoy class (logits 10 at it under FedMD, one-hot under LabelAvg), the others' the real aggregate."""
    exp = Experiment(
        compose(
            None,
            tiny(
                tmp_path,
                *DIGITS,
                f"protocol={protocol}",
                *SHORT,
                "protocol.num_clients=3",
                "attack.lattack.m=2",
                "attack.lattack.batch_size=4",
                "attack.lattack.steps_per_round=1",
                "attack.lattack.decoy_class=6",
                "attack.lattack.decoy_samples=5",
            ),
        )
    )
    spy, targets = _spied(exp)
    exp.run()
    rows = len(exp.protocol.public_rows(2))
    assert targets[0].shape[0] == rows + 5  # round 2: its public rows, then the five decoys
    decoy = torch.tensor([0.0] * 6 + [10.0 if protocol == "fedmd" else 1.0] + [0.0] * 3)
    torch.testing.assert_close(targets[0][rows:], decoy.expand(5, 10))
    torch.testing.assert_close(targets[1], spy.aggregate)  # the others distil on the real aggregate, decoys included
    assert not torch.allclose(targets[1][rows:], targets[0][rows:])
    row = [json.loads(line) for line in (tmp_path / "run" / "rounds.jsonl").read_text().splitlines()]
    assert row[1]["adversary/lattack/added_samples"] == 5 and row[2]["adversary/lattack/added_samples"] == 5


@pytest.mark.parametrize("every", [1, 2])
@pytest.mark.usefixtures("unscored_inversions")
def test_injected_images_join_the_next_batch_and_the_victim_digests_the_real_aggregate_on_them_between_attack_rounds(
    tmp_path: Path, every: int
) -> None:
    """Algorithm 1's D_pub ∪ x_fake (``inject_samples``): the images added after round 1's steps are the last rows of
    round 2's batch. Round 2 an attack round (every 1): the victim gets its own upload back, fakes included; round 2 a
    normal round (every 2): the victim digests the real aggregate, the federation's view of the fakes."""
    exp = Experiment(
        compose(
            None,
            tiny(
                tmp_path,
                *DIGITS,
                *SHORT,
                "protocol.num_clients=3",
                "attack.lattack.m=2",
                "attack.lattack.batch_size=4",
                "attack.lattack.steps_per_round=1",
                "attack.lattack.inject_samples=5",
                f"attack.lattack.every={every}",
            ),
        )
    )
    spy, targets = _spied(exp)
    exp.run()
    rows = len(exp.protocol.public_rows(2))
    assert targets[0].shape[0] == targets[1].shape[0] == rows + 5  # round 2: its public rows, then the five fakes
    torch.testing.assert_close(targets[1], spy.aggregate)  # another client: the real aggregate, fakes included
    torch.testing.assert_close(targets[0], spy.uploads[0] if every == 1 else spy.aggregate)
    assert not torch.allclose(spy.uploads[0][rows:], spy.aggregate[rows:])  # the two cases differ on the fakes
    row = [json.loads(line) for line in (tmp_path / "run" / "rounds.jsonl").read_text().splitlines()]
    assert [r.get("adversary/lattack/added_samples") for r in row[1:]] == [5, 5 if every == 1 else None]  # after steps only


def test_run_scores_the_attack_checks_its_gradients_and_resumes_the_same_generator(tmp_path: Path, results: list[AttackResult]) -> None:
    # many directions on a tiny input: the estimates follow the victim's true gradient at the round's end (its state at the attack point)
    args = [
        "run",
        *tiny(
            tmp_path,
            *DIGITS,
            *SHORT,
            "attack.lattack.m=1000",
            "attack.lattack.batch_size=2",
            "attack.lattack.steps_per_round=2",
            "keep_checkpoints=3",
        ),
    ]
    assert main(args) == 0  # `fdattack run`
    rounds = [json.loads(line) for line in (tmp_path / "run" / "rounds.jsonl").read_text().splitlines()]
    for t, row in enumerate(rounds[1:], start=1):  # 2 steps a round, B(m + 1) = 2002 query images each
        assert {"attack/lattack/loss", "attack/lattack/loss_round", "attack/lattack/top1", "attack/lattack/fid"} <= set(row)
        assert row["attack/lattack/steps"] == 2 * t and row["attack/lattack/queries_total"] == 2 * t * 2002
        assert row["attack/lattack/grad_cosine"] > 0.9, row["attack/lattack/grad_cosine"]
    assert (tmp_path / "run" / "images" / "attack_lattack_inversions_round_0002.png").is_file()
    inversions = [r for r in results if isinstance(r, Inversions)]
    assert len(inversions) == 2 and inversions[1].images.shape == (4, 1, 1, 8, 8) and inversions[1].labels.tolist() == [0]
    assert sum(isinstance(r, GradientProbe) for r in results) == 2

    checkpoints = tmp_path / "run" / "checkpoints"
    first = torch.load(checkpoints / "round_0002.pt", weights_only=True)["attacks"]["lattack"]
    (checkpoints / "round_0002.pt").unlink()  # resume from round 1: round 2 runs again
    results.clear()
    assert main([*args, "resume=true"]) == 0
    again = torch.load(checkpoints / "round_0002.pt", weights_only=True)["attacks"]["lattack"]
    assert again["steps"] == first["steps"] == 4 and again["queries"] == first["queries"] == 4 * 2 * 1001
    assert first["generator"].keys() == again["generator"].keys()
    assert all(torch.equal(first["generator"][k], again["generator"][k]) for k in first["generator"])
    assert torch.equal(inversions[1].images, next(r for r in results if isinstance(r, Inversions)).images)


def lattack_on_digits(tmp_path: Path, *extra: str, scored: bool = True) -> tuple[Experiment, LAttack, Inversions]:
    """conf/experiment/lattack_fedmd_digits.yaml as shipped (3 rounds of 50 steps), W&B off: the run and its last images
    (left out of the run's own scoring unless ``scored``)."""
    exp = Experiment(
        compose(
            str(REPO / "conf" / "experiment" / "lattack_fedmd_digits.yaml"),
            [f"output_dir={tmp_path / 'run'}", "logger.wandb.mode=disabled", "logger.progress=never", *extra],
        )
    )
    kept: list[Inversions] = []
    score = exp.evaluator.score

    def keep(attack: str, found: list[AttackResult]):  # type: ignore[no-untyped-def]
        kept.extend(r for r in found if isinstance(r, Inversions))
        return score(attack, found if scored else [r for r in found if not isinstance(r, Inversions)])

    exp.evaluator.score = keep  # type: ignore[method-assign]
    exp.run()
    attack = next(a for a in exp.attacks if isinstance(a, LAttack))
    return exp, attack, kept[-1]


def victim_certainty(tmp_path: Path, seed: int) -> tuple[float, float]:
    """The shipped digits run at ``seed`` (FedMD, 3 rounds of 50 steps, its images left unscored): the victim's mean
    softmax probability of c* on the attack's last 64 images, and on the same generator's before its first step (its
    initial weights, the same noise). The victim's outputs are read by the evaluation side (the oracle), not the attack."""
    fedmd, attack, trained = lattack_on_digits(tmp_path, f"seed={seed}", scored=False)
    s = attack.settings
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derive_seed(attack.context.seed, attack.name, "init"))
        untrained = LAttackGenerator(fedmd.data.split.image_shape, s.z_dim, s.width, s.lr)
    z = untrained.noise(s.samples, torch.Generator().manual_seed(derive_seed(attack.context.seed, attack.name, "samples")))

    def p_target(images: Tensor) -> float:
        logits = fedmd.oracle.predict(fedmd.oracle.clients[s.victim], images.reshape(-1, *images.shape[-3:]))
        return float(logits.float().softmax(-1)[:, s.target_class].mean())

    return p_target(trained.images), p_target(untrained.sample(z).unsqueeze(1))


@pytest.mark.parametrize("seed", [42, 0, 1])
def test_on_real_digits_the_attack_makes_its_victim_far_surer_of_c_star_than_an_untrained_generator_does(tmp_path: Path, seed: int) -> None:
    """lattack.md §5.1 on the shipped digits run (FedMD, 3 rounds of 50 steps), on three seeds: the attack does what it
    optimises. Its victim's mean probability of c* on the generator's 64 images rises by more than 0.3 over the same
    generator left untrained.

    Measured on one AMD EPYC core (victim's mean p(c*): trained / untrained, rise), seeds 42, 0, 1: 0.71 / 0.14 (0.57),
    0.86 / 0.24 (0.62), 0.84 / 0.20 (0.64). Spread of the rise across seeds 0.07 (range); margin over the bound 0.27 at
    the worst seed, about 4x the spread. Seed 42 with ``trainer.vectorise=false`` (another float summation order) moves
    it by less than 1e-4. About 20 s a seed.

    What is not asserted, because it does not hold across seeds or machines (same seeds; FedMD / untrained / LabelAvg's
    generator, all scored by the FedMD run's all-digit SCNN): feature cosine -0.40 / -0.69 / -0.60, -0.62 / -0.76 /
    -0.74, -0.75 / -0.88 / -0.84 (the FedMD-untrained gap 0.29, 0.14, 0.13: a spread as large as the gap, and on an
    Intel Xeon the order reversed at seed 42, -0.51 against the untrained -0.49); SCNN top-1 0.91 / 0 / 0.27,
    0.02 / 0 / 0, 0.84 / 0 / 0.05 (bimodal: on seed 0 the generator fools the victim with patterns no other classifier
    calls 0). Nor that LabelAvg stops it on digits: LabelAvg's victim (smoothed, its top probability about 0.24) already
    ranks c* first on the untrained images at seeds 0 and 1 (p 0.19 -> 0.24 and 0.16 -> 0.20 after the attack), while at
    seed 42 the attack takes its top-1 on them from 0 to 0.91 (p 0.12 -> 0.24). So on 8x8 digits the plain attack
    fools its victim, reliably, but recovers a recognisable 0 only on some seeds (see the README)."""
    p_trained, p_untrained = victim_certainty(tmp_path, seed)
    assert p_trained > p_untrained + 0.3, (p_trained, p_untrained)


@pytest.mark.parametrize("seed", [42, 0, 1])
def test_on_real_digits_a_victim_keeps_the_public_digits_only_when_its_private_phases_include_them(tmp_path: Path, seed: int) -> None:
    """Why the plain attack fools its victim with textures (docs/attacks.md): a client of the class-disjoint cut that
    revisits its two private digits alone forgets the public ones, so "c*" means "not my other digit" to it. With
    ``protocol.private_with_public`` (lattack.md §1.2) it still knows them after the round's revisit. Client 0 after one
    FedMD round of the shipped digits run, on the public digits 7-9: measured accuracy without / with, 0.00 / 0.974,
    0.00 / 0.968, 0.00 / 0.968 at seeds 42, 0, 1 (AMD EPYC); 10 to 20 s a seed."""
    accuracy = {}
    for with_public in (False, True):
        exp = Experiment(
            compose(
                str(REPO / "conf" / "experiment" / "lattack_fedmd_digits.yaml"),
                [
                    f"output_dir={tmp_path / str(with_public)}",
                    "logger.wandb.mode=disabled",
                    "logger.progress=never",
                    f"seed={seed}",
                    "protocol.rounds=1",
                    "attacks=[]",
                    f"protocol.private_with_public={with_public}",
                ],
            )
        )
        exp.run()
        public = exp.data.split.public
        logits = exp.oracle.predict(exp.oracle.clients[0], public.images)
        accuracy[with_public] = float((logits.argmax(-1) == public.labels).float().mean())
    assert accuracy[False] < 0.1 and accuracy[True] > 0.8, accuracy


#: lattack_fedmd_mnist.yaml (Algorithm 1: attack rounds 1, 3, 5 between normal ones, 200 fakes a round in the public
#: batch) shrunk to about 75 s on one core: 200 images a digit, 100 steps a round, width 32 (the small matrix's size)
SMALL_MNIST_LATTACK = [
    "logger.wandb.mode=disabled",
    "logger.progress=never",
    "data.max_per_class=200",
    "protocol.rounds=5",
    "attack.lattack.steps_per_round=100",
    "attack.lattack.width=32",
    "attack.lattack.samples=32",
]


def test_on_mnist_the_plain_attack_between_normal_rounds_draws_what_an_independent_classifier_calls_c_star(tmp_path: Path) -> None:
    """lattack.md §2.1 on real MNIST, no decoy: the attack as Algorithm 1 prints it (the victim, client 0, gets its own
    logits in attack rounds and the real average in the rounds between, and the fakes join the public batch) draws
    images the evaluation SCNN, trained on all ten digits and never seen by the attack, calls 0, with features nearer
    the real 0s' than uniform noise's (§5.1's feature cosine, centred).

    Measured on one AMD EPYC core (AVX-512), seeds 42 / 0 / 1 / 2, about 75 s each: SCNN top-1 0.97 / 0.88 / 0.91 /
    0.56 (chance 0.1; the bound 0.35 holds at every seed, 0.21 above the worst); feature cosine minus the noise's
    0.91 / 0.78 / 0.64 / 0.62 (the bound 0.25 leaves 0.37 at the worst seed). At 300 images a digit and 150 steps a
    round, half as long again, the top-1 was 0.84 / 1.00 / 0.97 / 0.97. The full-size run
    (lattack_fedmd_mnist.yaml, 2,000 steps) and the isolated victim it is compared with are in docs/attacks.md. Seed 42
    runs here."""
    cfg = compose(str(REPO / "conf" / "experiment" / "lattack_fedmd_mnist.yaml"), [f"output_dir={tmp_path / 'run'}", *SMALL_MNIST_LATTACK])
    metrics = Experiment(cfg).run()
    assert metrics["attack/lattack/chance"] == pytest.approx(0.1)
    assert metrics["attack/lattack/top1"] > 0.35, metrics
    assert metrics["attack/lattack/feature_cosine"] > metrics["attack/lattack/feature_cosine_noise"] + 0.25, metrics


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        (["attack.lattack.victim=4"], ["attack.lattack.victim=4", "0 to 1"]),
        (["attack.lattack.target_class=10"], ["attack.lattack.target_class=10", "0 to 9"]),
        (["protocol=labelavg", "attack.lattack.loss=neg_logit"], ["attack.lattack.loss=neg_logit", "probs"]),
        (["protocol=cronus"], ["lattack", "protocol.name=cronus", "aggregation_rule"]),
        (["attack.lattack.decoy_class=0"], ["attack.lattack.decoy_class=0", "target_class=0"]),
        (
            ["attack.lattack.decoy_class=3", "attack.lattack.return_own_outputs=false"],
            ["attack.lattack.decoy_class", "return_own_outputs=true"],
        ),
        (
            ["attack.lattack.decoy_class=3", "attack.lattack.inject_samples=50"],
            ["attack.lattack.inject_samples=50", "decoy_samples"],
        ),
    ],
    ids=[
        "victim",
        "target_class",
        "neg_logit_on_labels",
        "no_server_rule",
        "decoy_is_the_target",
        "decoy_without_own_outputs",
        "decoy_with_injection",
    ],
)
def test_bad_lattack_settings_exit_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], named: list[str]
) -> None:
    _one_line(capsys, ["run", *tiny(tmp_path, *DIGITS, *extra)], *named)


# ------------------------------------------------------------------ the shipped experiments
LATTACK_EXPERIMENTS = {  # experiment -> (dataset, m, public classes, the paper's (target, victim) pairs)
    "lattack_fedmd_digits": ("digits", 5, [7, 8, 9], [(0, 0)]),
    "lattack_fedmd_mnist": ("mnist", 5, [7, 8, 9], [(0, 0), (1, 1), (6, 6)]),
    "lattack_decoy_fedmd_mnist": ("mnist", 5, [7, 8, 9], [(0, 0)]),
    "lattack_fedmd_fashion_mnist": ("fashion_mnist", 10, [6, 7, 8], [(0, 0), (3, 3), (9, 6)]),
    "lattack_fedmd_cifar10": ("cifar10", 20, [7, 8, 9], [(0, 0), (1, 1), (6, 6)]),
    "lattack_fedmd_celeba": ("celeba", 20, [], [(0, 0)]),  # public: dummy noise (§2.6)
    "lattack_fedmd_att_faces": ("att_faces", 20, [], [(0, 0)]),
}
#: the experiments whose clients train on their private classes with the labelled public set, as the paper's (§1.2)
PAPER_SETTING = {"lattack_fedmd_mnist", "lattack_fedmd_fashion_mnist", "lattack_fedmd_cifar10"}
#: the experiments whose data does not ship (composed with a stand-in root)
PAPER_SCALE = {"lattack_fedmd_fashion_mnist", "lattack_fedmd_cifar10", "lattack_fedmd_celeba"}


@pytest.mark.parametrize("experiment", sorted(LATTACK_EXPERIMENTS))
def test_lattack_experiments_compose_to_the_specs_setting(tmp_path: Path, experiment: str) -> None:
    """lattack.md §2.6, §8 items 4 and 9: FedMD with 7 clients on class pairs, a public set without the targets, m per dataset;
    each paper target's victim holds it (two_classes gives client k the k-th and (k+1)-th private classes)."""
    dataset, m, public, pairs = LATTACK_EXPERIMENTS[experiment]
    root = [f"data.root={tmp_path}"] if experiment in PAPER_SCALE else []
    cfg = compose(str(REPO / "conf" / "experiment" / f"{experiment}.yaml"), root)
    assert (cfg.data.name, cfg.data.partition, cfg.data.label_space, list(cfg.data.public_classes)) == (
        dataset,
        "two_classes",
        "all",
        public,
    )
    assert (cfg.protocol.name, cfg.protocol.num_clients, cfg.protocol.server_model) == ("fedmd", 7, False)
    assert (list(cfg.attacks), cfg.attack.lattack.m, cfg.attack.lattack.epsilon) == (["lattack"], m, 0.1)
    assert (cfg.data.public_dataset.name == "noise") == (not public)  # no public classes: the server sends dummy noise
    # the paper's clients train on their private data and on D_pub (§1.2); the digits run and the decoy keep FedMD's own
    assert cfg.protocol.private_with_public == (experiment in PAPER_SETTING)
    private = [c for c in range(10) if c not in public]
    for target, victim in pairs:
        assert target not in public and target in (private[victim], private[(victim + 1) % 7])
