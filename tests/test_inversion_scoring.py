"""Scoring of Inversions (fedinverse.md §6, lattack.md §5.1): top-1/top-5 per sample index with their sample std, chance,
diversity, FID, KNN distance and the L-Attack's feature cosine in the all-class evaluation classifier's features, the
grid, the tables and the report."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterator

import pytest
import torch
from PIL import Image
from torch import nn
from torchvision.models import inception_v3

from fdattack.attacks import ATTACKS, Attack
from fdattack.attacks.results import Inversions
from fdattack.cli import main
from fdattack.config import compose
from fdattack.data.federated import FederatedSplit, build_split
from fdattack.data.imageset import ImageSet
from fdattack.engine import LocalTrainer, ModelHandle, default_engine
from fdattack.evaluation import Evaluator
from fdattack.evaluation.inception import load_inception
from fdattack.evaluation.inversion import InversionScorer
from fdattack.evaluation.inversion_classifier import EvaluationClassifier, InversionEvaluationSettings, inversion_classifier, training_sets
from fdattack.experiment import Experiment
from fdattack.fd.record import RoundRecord
from fdattack.fd.threat import Capability, ViewPart
from fdattack.functional.inversion_metrics import feature_cosine, feature_diversity, inversion_grid, topk_per_sample
from fdattack.knobs import knob
from fdattack.report.page import write_report
from fdattack.statistics.intervals import rate_interval, wilson_interval
from fdattack.tracking.artifact_cache import ArtifactCache
from fdattack.tracking.summary import attack_summary
from tests.conftest import error_of, tiny
from tests.object_graph import reachable


@dataclass
class PriorSettings:
    samples: int = knob(3, "samples per target label", ge=1)


class PriorInversion(Attack):
    """A test attack that returns S images of the attacker's own (auxiliary) classes for every target label."""

    name = "prior_inversion"
    Settings = PriorSettings
    needs = frozenset({Capability.white_box})
    reads = frozenset({ViewPart.prior_data})
    produces = frozenset({Inversions})

    def on_round_end(self, round: RoundRecord) -> list[Inversions]:
        prior, targets = self.view.prior_data, torch.tensor(self.view.target_labels)
        s = self.settings.samples
        images = prior.images[: s * len(targets)].reshape(s, len(targets), *prior.images.shape[1:])
        return [Inversions(images, targets, details={"final_loss": 1.5})]


DIGITS = (
    "protocol=fedavg",
    "data=digits",
    "data.split=classes",
    "data.public_classes=[5,6,7,8,9]",
    "data.partition=iid",
    "data.label_space=targets",
    "protocol.fraction=1.0",
    "protocol.rounds=1",
    "model.name=pdafd_cnn",
    "evaluation.confidence_gap.enabled=false",
)
SEED = 42  # the runs' seed: the fixture's split is theirs


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def stand_in(monkeypatch: pytest.MonkeyPatch) -> None:
    """Registers ``prior_inversion`` for one test (the real registry is left as it was)."""
    monkeypatch.setattr(ATTACKS, "_items", {**ATTACKS._items, "prior_inversion": PriorInversion})


@pytest.fixture(scope="module")
def digits(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    """The digits split of a FedInverse-like run (targets 0-4, auxiliary 5-9) and its evaluation classifier, trained once."""
    cfg = compose(None, [*DIGITS, "protocol.num_clients=2", "attacks=[]"])
    split = build_split(cfg.data, 2, SEED)
    cache = tmp_path_factory.mktemp("classifier")
    with torch.random.fork_rng():
        torch.set_num_threads(1)
        settings = InversionEvaluationSettings(epochs=3)
        classifier = inversion_classifier(split, default_engine(), settings, SEED, ArtifactCache(cache, "in_process"))()
    return SimpleNamespace(split=split, classifier=classifier, checkpoint=next(cache.glob("inversion_classifier_*.pt")))


def scorer_for(digits: SimpleNamespace) -> InversionScorer:
    return InversionScorer(digits.split, lambda: digits.classifier, grid_samples=4)


def metrics_of(scorer: InversionScorer, images: torch.Tensor, labels: list[int]) -> dict[str, float]:
    report = scorer("inv", Inversions(images, torch.tensor(labels)))
    return {key.removeprefix("attack/inv/"): value for key, value in report.metrics.items()}


def of_labels(pool: ImageSet, labels: list[int], samples: int) -> torch.Tensor:
    """(samples, T, C, H, W): the first ``samples`` images of each label of ``pool``."""
    return torch.stack([pool.images[pool.labels == y][:samples] for y in labels], dim=1)


# ------------------------------------------------------------------ hand-computed scores on a fake classifier
J = 6
#: logits of S = 4 samples × T = 2 targets (labels 0 and 1); the images are the logits (the fake classifier is the identity)
HAND_LOGITS = torch.tensor(
    [
        [[0.9, 0.1, 0.2, 0.3, 0.4, 0.5], [0.1, 0.9, 0.2, 0.3, 0.4, 0.5]],  # s=0: both top-1 hits
        [[0.9, 0.1, 0.2, 0.3, 0.4, 0.5], [0.1, 0.8, 0.2, 0.9, 0.4, 0.5]],  # s=1: label 1 second -> top-1 1/2, top-5 2/2
        [[-0.9, 0.1, 0.2, 0.3, 0.4, 0.5], [0.6, 0.5, 0.3, 0.7, 0.8, 0.9]],  # s=2: label 0 last, label 1 fifth -> 0/2, 1/2
        [[0.2, 0.1, 0.9, 0.3, 0.4, 0.5], [0.9, 0.5, 0.2, 0.3, 0.4, 0.1]],  # s=3: both in the top-5 only -> 0/2, 2/2
    ]
)


def fake_split() -> FederatedSplit:
    generator = torch.Generator().manual_seed(0)
    private = ImageSet.from_images(torch.rand(12, 1, 1, J, generator=generator) * 2 - 1, torch.arange(12) % 3)
    empty = ImageSet.from_images(torch.zeros(0, 1, 1, J), torch.zeros(0, dtype=torch.long))
    return FederatedSplit(empty, [private], empty, None, J, [0, 1, 2], {}, (1, 1, J))


def identity_classifier() -> EvaluationClassifier:
    """Logits and features equal to the image's pixels."""
    net = nn.Sequential(nn.Flatten(), nn.Linear(J, J, bias=False))
    with torch.no_grad():
        net[1].weight.copy_(torch.eye(J))
    return EvaluationClassifier(net, torch.device("cpu"), test_accuracy=0.75, test_images=4)


def test_top1_top5_means_and_sample_stds_match_the_hand_computation() -> None:
    scores = metrics_of(InversionScorer(fake_split(), identity_classifier, grid_samples=2), HAND_LOGITS.view(4, 2, 1, 1, J), [0, 1])
    top1 = [1.0, 0.5, 0.0, 0.0]
    assert scores["top1"] == pytest.approx(0.375)
    assert scores["top1_std"] == pytest.approx(math.sqrt(sum((v - 0.375) ** 2 for v in top1) / 3))  # n - 1: 0.4787
    assert scores["top5"] == pytest.approx(0.875)
    assert scores["top5_std"] == pytest.approx(0.25)  # sqrt(3·0.125² + 0.375²) / sqrt(3)
    assert scores["chance"] == pytest.approx(1 / 2)
    assert scores["chance_top5"] == pytest.approx(5 / J)
    assert scores["fid_images"] == 8
    assert scores["eval_classifier_accuracy"] == 0.75
    torch.testing.assert_close(topk_per_sample(HAND_LOGITS, torch.tensor([0, 1]), 1), torch.tensor(top1))


def test_intervals_are_over_the_targets_and_none_for_a_single_target() -> None:
    """The target label is the unit, not the image. HAND_LOGITS' per-target top-1: label 0 hits at s = 0, 1 (2/4),
    label 1 at s = 0 (1/4), so the interval is rate_interval([0.5, 0.25]) with each label's 4 draws as its trials (n* at
    most the 8 draws), not Wilson over 8 images; top-5: 3/4 and 4/4.
    With one target (the L-Attack's c*) there is no unit to resample: NaN, the seeds are its interval. The classifier's
    accuracy, 0.75 of its 4 held-out images: Wilson(3, 4)."""
    scorer = InversionScorer(fake_split(), identity_classifier, grid_samples=2)
    scores = metrics_of(scorer, HAND_LOGITS.view(4, 2, 1, 1, J), [0, 1])
    assert (scores["top1_ci_low"], scores["top1_ci_high"]) == pytest.approx(rate_interval([0.5, 0.25], trials=[4, 4]))
    assert (scores["top5_ci_low"], scores["top5_ci_high"]) == pytest.approx(rate_interval([0.75, 1.0], trials=[4, 4]))
    assert scores["top1_trials"] == scores["top5_trials"] == 8
    assert (scores["eval_classifier_accuracy_ci_low"], scores["eval_classifier_accuracy_ci_high"]) == pytest.approx(wilson_interval(3, 4))
    for key in ("knn_dist", "diversity", "feature_cosine", "feature_cosine_raw", "feature_cosine_noise", "feature_cosine_noise_raw"):
        assert scores[f"{key}_ci_low"] <= scores[key] <= scores[f"{key}_ci_high"], key
    assert 0 < scores["fid_ci_low"] < scores["fid"] < scores["fid_ci_high"]
    one = metrics_of(scorer, HAND_LOGITS[:, :1].reshape(4, 1, 1, 1, J), [0])
    for key in ("top1", "top5", "knn_dist", "diversity", "feature_cosine", "feature_cosine_raw"):
        assert math.isnan(one[f"{key}_ci_low"]) and math.isnan(one[f"{key}_ci_high"]), key


def test_a_classifier_that_names_the_target_scores_top1_one_and_one_that_names_another_label_zero() -> None:
    scorer = InversionScorer(fake_split(), identity_classifier, grid_samples=2)
    right = torch.eye(J)[[0, 1]].view(1, 2, 1, 1, J).repeat(3, 1, 1, 1, 1)  # the logit of the target label is the largest
    wrong = torch.eye(J)[[2, 3]].view(1, 2, 1, 1, J).repeat(3, 1, 1, 1, 1)
    hits, misses = metrics_of(scorer, right, [0, 1]), metrics_of(scorer, wrong, [0, 1])
    assert (hits["top1"], hits["top1_std"], hits["top5"]) == (1.0, 0.0, 1.0)
    assert (misses["top1"], misses["top1_std"]) == (0.0, 0.0)


def test_with_one_attacked_label_chance_is_a_random_class_among_the_classifiers() -> None:
    """The L-Attack's one c*: a guess among the attacked labels is always right, so chance is 1/J, not 1/T = 1."""
    scores = metrics_of(InversionScorer(fake_split(), identity_classifier, grid_samples=2), HAND_LOGITS[:, :1].reshape(4, 1, 1, 1, J), [0])
    assert scores["chance"] == pytest.approx(1 / J)
    assert scores["chance_top5"] == pytest.approx(5 / J)


def test_a_single_sample_has_no_std_and_top5_is_capped_at_the_classes() -> None:
    scores = metrics_of(InversionScorer(fake_split(), identity_classifier, grid_samples=2), HAND_LOGITS[2:3].view(1, 2, 1, 1, J), [0, 1])
    assert scores["top1"] == 0.0 and math.isnan(scores["top1_std"]) and math.isnan(scores["diversity"])
    assert topk_per_sample(HAND_LOGITS[2:3, :, :3], torch.tensor([0, 1]), 5).item() == 1.0  # 3 classes: top-5 is every class


def test_diversity_is_zero_for_identical_samples_and_grows_with_their_spread() -> None:
    generator = torch.Generator().manual_seed(1)
    centre, offsets = torch.randn(2, 1, 1, J, generator=generator), torch.randn(5, 2, 1, 1, J, generator=generator)
    scorer = InversionScorer(fake_split(), identity_classifier, grid_samples=2)
    spreads = [metrics_of(scorer, centre + scale * offsets, [0, 1])["diversity"] for scale in (0.0, 0.1, 0.2, 0.4)]
    assert spreads[0] == 0.0
    assert spreads[1] > 0 and spreads[2:] == pytest.approx([2 * spreads[1], 4 * spreads[1]])  # Euclidean: linear in the spread
    same = torch.ones(3, 4)
    assert feature_diversity([same, torch.zeros(1, 4)]) == 0.0  # a one-row group has no pairs and does not count
    assert feature_diversity([torch.tensor([[0.0, 0.0], [3.0, 4.0]])]) == pytest.approx(5.0)


def test_fid_is_zero_for_the_private_images_themselves_and_the_squared_shift_for_shifted_ones() -> None:
    """Identity features: shifting every image by δ moves the mean by δ in each of the J dimensions and leaves the
    covariance, so FID = J·δ² (Eq. of §6.2)."""
    split = fake_split()
    private = split.private[0]
    own = of_labels(private, [0, 1], 4)  # the 4 private images of labels 0 and 1: the real side itself
    scorer = InversionScorer(split, identity_classifier, grid_samples=2)
    assert metrics_of(scorer, own, [0, 1])["fid"] == pytest.approx(0.0, abs=1e-6)
    assert metrics_of(scorer, own + 0.3, [0, 1])["fid"] == pytest.approx(J * 0.3**2, rel=1e-4)
    assert metrics_of(scorer, own[:1], [0, 1])["fid"] > 0  # two images: a (rank-1) Fréchet distance, not the real side's


def test_feature_cosine_matches_the_hand_computation() -> None:
    """Group means (0.5, 0.5), (2, 1), (-2, -1): μ = (1/6, 1/6), the real centroid − μ = (11/6, 5/6). Generated − μ:
    (5/6, -1/6) and (-1/6, 5/6), cosines 50/√3796 and 14/√3796; noise − μ: (-7/6, -7/6) and (-19/6, -7/6)."""
    generated, real, noise = (
        torch.tensor([[1.0, 0.0], [0.0, 1.0]]),
        torch.tensor([[2.0, 0.0], [2.0, 2.0]]),
        torch.tensor([[-1.0, -1.0], [-3.0, -1.0]]),
    )
    scores = feature_cosine(generated, real, noise)
    assert scores["feature_cosine"] == pytest.approx(32 / math.sqrt(3796))  # (50 + 14) / 2 / √(26·146)
    assert scores["feature_cosine_noise"] == pytest.approx(-(112 / math.sqrt(98 * 146) + 244 / math.sqrt(410 * 146)) / 2)
    assert scores["feature_cosine_raw"] == pytest.approx(1.5 / math.sqrt(5))  # cos((1,0), (2,1)) = 2/√5, cos((0,1), (2,1)) = 1/√5
    assert scores["feature_cosine_noise_raw"] == pytest.approx((-3 / math.sqrt(10) - 7 / math.sqrt(50)) / 2)
    # the centre weighs the three groups alike: more real images with the same centroid change nothing
    assert feature_cosine(generated, torch.cat([real] * 5), noise) == pytest.approx(scores)


def test_pre_activation_features_are_the_pooled_input_of_the_last_activation_before_the_head() -> None:
    """Conv → ReLU (in place, as ResNet's) → pool → head: the penultimate features are the pooled ReLU output (never
    negative), the pre-activation ones the pooled convolution output (negative too)."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(inplace=True), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 3)).eval()
    images = torch.randn(5, 1, 6, 6)
    penultimate, pre = EvaluationClassifier(net, torch.device("cpu"), 1.0, 1, batch_size=2).embed(images)
    with torch.no_grad():
        conv = net[0](images)
    torch.testing.assert_close(pre, conv.mean(dim=(2, 3)))
    torch.testing.assert_close(penultimate, conv.relu().mean(dim=(2, 3)))
    assert bool((pre < 0).any()) and bool((penultimate >= 0).all())
    linear = identity_classifier()  # no activation: the head's input
    torch.testing.assert_close(linear.embed(images[:, :, 0, :])[1], images[:, 0, 0, :])


def test_the_real_class_mean_scores_cosine_one_centred_and_uncentred() -> None:
    split = fake_split()
    private = split.private[0]
    means = torch.stack([private.images[private.labels == y].mean(dim=0) for y in (0, 1)]).unsqueeze(0).repeat(3, 1, 1, 1, 1)
    scores = metrics_of(InversionScorer(split, identity_classifier, grid_samples=2), means, [0, 1])
    assert scores["feature_cosine"] == pytest.approx(1.0) and scores["feature_cosine_raw"] == pytest.approx(1.0)
    assert -1.0 <= scores["feature_cosine_noise"] < 1.0 and -1.0 <= scores["feature_cosine_noise_raw"] < 1.0


class Pixels(nn.Module):
    """A stand-in FID feature extractor: the flattened pixels."""

    num_features = J

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return images.flatten(1)


def test_a_second_feature_extractor_gives_fid_inception_beside_fid() -> None:
    split = fake_split()
    own = of_labels(split.private[0], [0, 1], 4)
    scorer = InversionScorer(split, identity_classifier, grid_samples=2, inception=Pixels())
    assert metrics_of(scorer, own, [0, 1])["fid_inception"] == pytest.approx(0.0, abs=1e-6)
    shifted = metrics_of(scorer, own + 0.3, [0, 1])
    assert shifted["fid_inception"] == pytest.approx(J * 0.3**2, rel=1e-4) and shifted["fid"] == pytest.approx(shifted["fid_inception"])
    assert "fid_inception" not in metrics_of(InversionScorer(split, identity_classifier, grid_samples=2), own, [0, 1])


def test_inception_weights_on_disk_give_the_networks_2048_pool_features(tmp_path: Path) -> None:
    """torchvision's Inception-v3 state_dict as a user would copy it (here untrained, its auxiliary head left out,
    which the loader allows): the features are those of that network on the image resized to 299x299."""
    net = inception_v3(weights=None, aux_logits=False, init_weights=True, transform_input=False).eval()
    torch.save(net.state_dict(), tmp_path / "inception.pt")
    features = load_inception(str(tmp_path / "inception.pt"), torch.device("cpu"))
    images = torch.rand(2, 1, 8, 8, generator=torch.Generator().manual_seed(0)) * 2 - 1
    net.fc = nn.Identity()
    with torch.no_grad():
        expected = net(nn.functional.interpolate(images.expand(-1, 3, -1, -1), size=(299, 299), mode="bilinear", align_corners=False))
    got = features(images)
    assert got.shape == (2, 2048) and features.num_features == 2048
    torch.testing.assert_close(got, expected.double(), rtol=1e-5, atol=0)


def test_the_grid_has_a_row_per_label_and_a_column_per_shown_sample() -> None:
    images = torch.linspace(-1, 1, 5 * 3 * 2 * 4 * 4).view(5, 3, 2, 4, 4)
    grid = inversion_grid(images, samples=2)
    assert grid.shape == (2, 3 * 4, 2 * 4)
    torch.testing.assert_close(grid[:, 4:8, 4:8], images[1, 1] * 0.5 + 0.5)  # row = label 1, column = sample 1


def test_the_evaluator_refuses_inversions_an_attack_does_not_declare() -> None:
    evaluator = Evaluator(None)  # type: ignore[arg-type]  # scoring never reaches the oracle
    with pytest.raises(
        RuntimeError, match=r"attack gmi returned Inversions but does not declare them: set produces = frozenset\(\{Inversions\}\)"
    ):
        evaluator.score("gmi", [Inversions(torch.zeros(2, 1, 1, 4, 4), torch.tensor([0]))])


# ------------------------------------------------------------------ the all-class evaluation classifier on digits
def test_the_evaluation_classifier_learns_every_class_and_reports_held_out_accuracy(digits: SimpleNamespace) -> None:
    train, test = training_sets(digits.split, SEED)
    assert set(train.labels.tolist()) == set(range(10))  # targets 0-4 and the auxiliary 5-9
    assert set(test.labels.tolist()) == set(range(10))  # auxiliary classes held out where the test set has none
    assert len(test) > len(digits.split.test)
    pool = torch.cat([*(p.images for p in digits.split.private), digits.split.attacker.images])
    assert len(train) + len(test) - len(digits.split.test) == len(pool)  # held-out rows are not trained on
    assert digits.split.num_classes == 5 and digits.classifier.num_classes == 10  # the FL models know the targets only
    assert digits.classifier.test_accuracy >= 0.9


def test_private_images_of_the_targets_score_full_top1_and_a_low_fid(digits: SimpleNamespace) -> None:
    private = ImageSet.from_images(torch.cat([p.images for p in digits.split.private]), torch.cat([p.labels for p in digits.split.private]))
    targets = digits.split.target_labels
    real = metrics_of(scorer_for(digits), of_labels(private, targets, 8), targets)
    noise = metrics_of(
        scorer_for(digits),
        torch.rand(8, len(targets), *digits.split.image_shape, generator=torch.Generator().manual_seed(0)) * 2 - 1,
        targets,
    )
    assert real["top1"] >= 0.95 and real["top5"] == 1.0
    assert noise["top1"] <= noise["chance"] + 1e-9  # noise is one class at best: never above 1/T
    assert real["fid"] < noise["fid"] / 5
    assert real["knn_dist"] == pytest.approx(0.0, abs=1e-6) and noise["knn_dist"] > 1e-3  # each real image is its own nearest neighbour
    assert 0 < real["diversity"] and real["diversity_real"] > 0


def test_the_private_class_means_score_a_high_feature_cosine_and_noise_a_negative_one(digits: SimpleNamespace) -> None:
    """lattack.md §5.1 on real digits: a label's private mean image points to its centroid in the classifier's
    pre-activation features, uniform noise away from it (Table II: 0.96 against -0.62)."""
    private = ImageSet.from_images(torch.cat([p.images for p in digits.split.private]), torch.cat([p.labels for p in digits.split.private]))
    targets = digits.split.target_labels
    means = torch.stack([private.images[private.labels == y].mean(dim=0) for y in targets]).unsqueeze(0).repeat(4, 1, 1, 1, 1)
    own, images = metrics_of(scorer_for(digits), means, targets), metrics_of(scorer_for(digits), of_labels(private, targets, 8), targets)
    for scores in (own, images):
        assert scores["feature_cosine"] > 0.5 > 0 > scores["feature_cosine_noise"], scores
        assert scores["feature_cosine_raw"] > scores["feature_cosine_noise_raw"], scores
    assert own["feature_cosine"] > images["feature_cosine"]  # the mean image is closer to the centroid than single digits


def test_images_of_the_auxiliary_classes_score_no_top1(digits: SimpleNamespace) -> None:
    """The attacker's own classes, passed off as the targets, are misses: the classifier knows them (a classifier of the
    targets alone would put each in some target class, a hit one time in five)."""
    prior, targets = digits.split.attacker, digits.split.target_labels
    images = torch.stack([prior.images[prior.labels == y][:8] for y in (5, 6, 7, 8, 9)], dim=1)
    assert metrics_of(scorer_for(digits), images, targets)["top1"] <= 0.05


def test_a_checkpoint_is_loaded_not_trained(digits: SimpleNamespace, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = default_engine()
    monkeypatch.setattr(engine, "fit_module", lambda *args, **kwargs: pytest.fail("trained despite evaluation.inversion.checkpoint"))
    loaded = inversion_classifier(
        digits.split, engine, InversionEvaluationSettings(checkpoint=str(digits.checkpoint), epochs=50), SEED + 1, None
    )()
    for a, b in zip(loaded.net.state_dict().values(), digits.classifier.net.state_dict().values()):
        torch.testing.assert_close(a.cpu(), b.cpu())


def test_a_cached_classifier_is_reused_not_trained_again(digits: SimpleNamespace, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = default_engine()
    monkeypatch.setattr(engine, "fit_module", lambda *args, **kwargs: pytest.fail("trained again despite the cache"))
    cache = ArtifactCache(digits.checkpoint.parent, "in_process")
    again = inversion_classifier(digits.split, engine, InversionEvaluationSettings(epochs=3), SEED, cache)()
    for a, b in zip(again.net.state_dict().values(), digits.classifier.net.state_dict().values()):
        torch.testing.assert_close(a.cpu(), b.cpu())
    assert again.test_accuracy == pytest.approx(digits.classifier.test_accuracy)


# ------------------------------------------------------------------ in a run: metrics, grid, summary, report, bad checkpoint
def test_a_run_records_the_scores_the_grid_the_summary_and_the_report(
    stand_in: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run trains its evaluation classifier once and keeps it in artifacts/; resumed from round 1, it reuses it."""
    args = tiny(
        tmp_path,
        *DIGITS,
        "attacks=[prior_inversion]",
        "evaluation.inversion.classifier=pdafd_cnn",
        "evaluation.inversion.epochs=4",
        "evaluation.inversion.grid_samples=2",
        "protocol.rounds=2",
        "keep_checkpoints=2",
    )
    fitted: list[str] = []
    fit_module = LocalTrainer.fit_module

    def spy(self: LocalTrainer, handle: ModelHandle, *rest: Any, **kwargs: Any) -> Any:
        fitted.append(handle.name)
        return fit_module(self, handle, *rest, **kwargs)

    monkeypatch.setattr(LocalTrainer, "fit_module", spy)
    Experiment(compose(None, args)).run()
    assert fitted == ["inversion_classifier"]
    (cached,) = (tmp_path / "run" / "artifacts").glob("inversion_classifier_*.pt")
    (tmp_path / "run" / "checkpoints" / "round_0002.pt").unlink()
    fitted.clear()
    exp = Experiment(compose(None, [*args, "resume=true"]))
    metrics = exp.run()
    assert fitted == []  # round 2 again, its inversions scored by the cached classifier
    assert list((tmp_path / "run" / "artifacts").glob("inversion_classifier_*.pt")) == [cached]
    scorer = exp.evaluator.scorers[Inversions]
    assert isinstance(scorer, InversionScorer)
    walk = list(reachable(exp.attacks[0]))
    assert not any(isinstance(o, (InversionScorer, EvaluationClassifier)) for o in walk)
    assert all(o is not scorer.classifier().net for o in walk), "the attack reaches the evaluation classifier"
    run_dir = tmp_path / "run"
    stored = json.loads((run_dir / "metrics.json").read_text())
    keys = (
        "top1",
        "top1_std",
        "top5",
        "top5_std",
        "chance",
        "chance_top5",
        "diversity",
        "fid",
        "fid_images",
        "knn_dist",
        "feature_cosine",
        "feature_cosine_noise",
        "feature_cosine_raw",
        "feature_cosine_noise_raw",
        "eval_classifier_accuracy",
        "final_loss",
    )
    assert {f"attack/prior_inversion/{k}" for k in keys} <= set(stored)
    top1 = stored["attack/prior_inversion/top1"]
    assert top1 == metrics["attack/prior_inversion/top1"] < stored["attack/prior_inversion/chance"] / 2  # auxiliary digits: misses
    assert stored["attack/prior_inversion/fid_images"] == 3 * 5 and stored["attack/prior_inversion/final_loss"] == 1.5
    with Image.open(run_dir / "images" / "attack_prior_inversion_inversions_round_0002.png") as grid:
        assert grid.size == (2 * 8, 5 * 8)  # 2 of 3 samples by 5 labels of 8x8 digits
    table = attack_summary(stored).splitlines()
    assert table[0].split()[:4] == ["attack", "top-1", "top-1", "std"] and table[1].startswith("prior_inversion")
    assert "feature cos." in table[0] and "noise cos." in table[0] and f"{stored['attack/prior_inversion/feature_cosine']:.3f}" in table[1]
    page = write_report([run_dir], tmp_path / "report").read_text()
    assert "data-metric='attack/prior_inversion/top1' data-chance='1'" in page
    assert "data-metric='attack/prior_inversion/top5' data-chance='1'" in page
    assert "Inversions, latest round" in page and "sample 2</div>" in page and "sample 3" not in page and "label 4</div>" in page


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("evaluation.inversion.epochs=0", "evaluation.inversion.epochs=0 is out of range; allowed: an integer >= 1"),
        ("evaluation.inversion.lr=0", "evaluation.inversion.lr=0.0 is out of range; allowed: a number > 0"),
        ("evaluation.inversion.batch_size=0", "evaluation.inversion.batch_size=0 is out of range"),
        ("evaluation.inversion.grid_samples=0", "evaluation.inversion.grid_samples=0 is out of range"),
        ("evaluation.inversion.classifier=nope", "evaluation.inversion.classifier='nope' is not a known classifier; choose one of: "),
    ],
)
def test_a_bad_evaluation_inversion_value_is_one_line_and_exit_2(
    override: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["run", *tiny(tmp_path, *DIGITS, override)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"fdattack: error: {message}")
    assert not (tmp_path / "run").exists()


def test_a_weights_file_that_is_missing_or_does_not_fit_is_one_line_and_exit_2(
    digits: SimpleNamespace, stand_in: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["run", *tiny(tmp_path, *DIGITS, "attacks=[prior_inversion]")]
    assert main([*args, f"evaluation.inversion.checkpoint={tmp_path / 'nope.pt'}"]) == 2
    err = error_of(capsys.readouterr().err)
    assert err.startswith("fdattack: error: evaluation.inversion.checkpoint=") and "file not found" in err
    assert main([*args, f"evaluation.inversion.checkpoint={digits.checkpoint}", "evaluation.inversion.classifier=pdafd_cnn"]) == 2
    assert "does not fit classifier 'pdafd_cnn'" in error_of(capsys.readouterr().err)
    (tmp_path / "garbage.pt").write_bytes(b"not a torch file")
    checkpoint = f"evaluation.inversion.checkpoint={digits.checkpoint}"
    assert main([*args, checkpoint, f"evaluation.inversion.inception_weights={tmp_path / 'garbage.pt'}"]) == 2
    err = error_of(capsys.readouterr().err)
    assert err.startswith("fdattack: error: evaluation.inversion.inception_weights=") and "not a readable torch file" in err
    assert main([*args, checkpoint, f"evaluation.inversion.inception_weights={digits.checkpoint}"]) == 2
    assert "does not fit torchvision's Inception-v3 (size mismatch for fc.bias" in error_of(capsys.readouterr().err)
    assert not (tmp_path / "run").exists()  # stopped before anything was written
