"""PDA-FD's pure parts against hand-computed values: LDIA's estimate and distances (pdafd.md §5, §8.1), the
membership metrics (§8.2, against scikit-learn), the class-balanced public draw, and the evaluation side's
candidate pool, member/non-member sets and label-distribution baselines."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from sklearn.metrics import auc, roc_curve

from fdattack.attacks.results import LabelDistributions, MembershipScores
from fdattack.data.federated import FederatedSplit
from fdattack.data.imageset import ImageSet
from fdattack.data.partitions import balanced_sample
from fdattack.evaluation.candidates import NON_MEMBER, candidate_pool
from fdattack.evaluation.label_distribution import LabelDistributionScorer
from fdattack.evaluation.membership import MembershipScorer
from fdattack.functional.label_distribution import distances, estimate_from_outputs, label_proportions, random_distributions
from fdattack.functional.membership_metrics import dense_ranks, membership_metrics
from fdattack.tracking import attack_summary


def test_ldia_estimate_is_the_mean_softmax_and_probabilities_are_not_softmaxed_twice() -> None:
    logits = torch.tensor([[0.0, 0.0], [math.log(3.0), 0.0]])  # softmax rows (1/2, 1/2) and (3/4, 1/4)
    assert estimate_from_outputs(logits, "logits").tolist() == pytest.approx([0.625, 0.375])
    probs = torch.tensor([[0.9, 0.1], [0.5, 0.5]])
    assert estimate_from_outputs(probs, "probs").tolist() == pytest.approx([0.7, 0.3])
    top_k = torch.tensor([[1.0, 0.5, 0.0], [0.0, 0.25, 1.0]])  # LabelAvg's w ⊙ v rows (top weight 1, K = 2): scaled to sum 1
    assert estimate_from_outputs(top_k, "probs").tolist() == pytest.approx([(2 / 3 + 0) / 2, (1 / 3 + 0.2) / 2, (0 + 0.8) / 2])


def test_distances_hand_values_and_the_kl_direction() -> None:
    p = torch.tensor([0.5, 0.5, 0.0], dtype=torch.float64)  # a client without class 2
    q = torch.tensor([0.25, 0.5, 0.25], dtype=torch.float64)
    d = distances(p, q)
    assert float(d["kl"]) == pytest.approx(0.5 * math.log(2))  # KL(p || p^): the empty class costs nothing
    assert float(d["chebyshev"]) == pytest.approx(0.25)
    assert float(d["l1"]) == pytest.approx(0.5 / 3)
    assert float(d["tv"]) == pytest.approx(0.25)
    assert float(d["kl_eq7"]) > 5  # the printed direction KL(p^ || p) explodes on the empty class (A9)
    assert label_proportions(torch.tensor([0, 0, 1, 2]), 4).tolist() == [0.5, 0.25, 0.25, 0.0]


def test_random_baseline_draws_normalised_uniform_rows() -> None:
    q = random_distributions((1000,), 10, torch.Generator().manual_seed(0))
    assert q.shape == (1000, 10) and torch.allclose(q.sum(-1), torch.ones(1000, dtype=torch.float64))
    assert float(q.mean()) == pytest.approx(0.1, abs=1e-3) and float(q.max()) < 0.5


def test_membership_metrics_equal_scikit_learns_and_ignore_monotone_transforms() -> None:
    g = torch.Generator().manual_seed(1)
    members = torch.rand(2000, generator=g) < 0.5
    scores = torch.randn(2000, generator=g, dtype=torch.float64) + 1.2 * members
    ours = membership_metrics(members, scores)
    fpr, tpr, _ = roc_curve(members.numpy(), scores.numpy())
    assert ours["auc"] == pytest.approx(auc(fpr, tpr), abs=1e-6)
    assert ours["tpr_at_1pct_fpr"] == pytest.approx(tpr[fpr <= 0.01].max(), abs=1e-6)
    assert ours["tpr_at_0.1pct_fpr"] == pytest.approx(tpr[fpr <= 0.001].max(), abs=1e-6)
    assert ours["balanced_accuracy"] == pytest.approx((0.5 * (tpr + 1 - fpr)).max(), abs=1e-6)
    assert membership_metrics(members, 1e3 * scores + 50) == ours  # far outside [0, 1]: no sigmoid, no float32 ties


def test_dense_ranks_keep_ties_and_order() -> None:
    assert dense_ranks(torch.tensor([3.0, 1.0, 3.0, 2.0], dtype=torch.float64)).tolist() == [1.0, 0.0, 1.0, 0.5]


def test_a_perfect_and_a_useless_score() -> None:
    members = torch.tensor([True] * 200 + [False] * 200)
    perfect = membership_metrics(members, members.double())
    assert perfect["tpr_at_1pct_fpr"] == 1.0 and perfect["auc"] == 1.0 and perfect["balanced_accuracy"] == 1.0
    tied = membership_metrics(members, torch.zeros(400, dtype=torch.float64))  # every score equal: nothing below FPR 1
    assert tied["tpr_at_1pct_fpr"] == 0.0 and tied["auc"] == pytest.approx(0.5)


def test_balanced_public_draw_spreads_over_labels_and_fills_from_the_others() -> None:
    labels = np.array([0] * 50 + [1] * 5 + [2] * 30)
    rows = balanced_sample(labels, 40, np.random.default_rng(0))
    counts = np.bincount(labels[rows])
    assert len(set(rows.tolist())) == 40 and counts[1] == 5 and abs(int(counts[0]) - int(counts[2])) <= 1
    assert np.bincount(labels[balanced_sample(labels, 15, np.random.default_rng(1))]).tolist() == [5, 5, 5]


def _split() -> FederatedSplit:
    def imageset(labels: list[int], offset: int) -> ImageSet:
        y = torch.tensor(labels)
        return ImageSet(
            torch.arange(offset, offset + len(y)).float().view(-1, 1, 1, 1).expand(-1, 1, 2, 2).clone(),
            y,
            torch.zeros(len(y), dtype=torch.long),
            torch.arange(offset, offset + len(y)),
        )

    private = [imageset([0, 0, 0, 1], 0), imageset([1, 1, 2, 2, 2, 2], 10)]
    test = imageset([0, 1, 2] * 4, 100)
    return FederatedSplit(imageset([0, 1], 200), private, test, None, 3, [0, 1, 2], {}, (1, 2, 2))


def test_candidates_hide_their_origin_and_each_client_gets_label_matched_non_members() -> None:
    split = _split()
    pool = candidate_pool(split, None, seed=0)
    assert len(pool.labels) == 4 + 6 + 12 and sorted(pool.origin.tolist()) == [-1] * 12 + [0] * 4 + [1] * 6
    known = pool.as_known()
    assert known.source.tolist() == list(range(22)) and torch.equal(known.labels, pool.labels)
    scorer = MembershipScorer(pool, seed=0)
    columns, is_member = scorer.evaluation_set(0)
    assert int(is_member.sum()) == 4 and len(columns) == 8
    assert bool((pool.origin[columns[is_member]] == 0).all()) and bool((pool.origin[columns[~is_member]] == NON_MEMBER).all())
    assert sorted(pool.labels[columns[~is_member]].tolist()) == [0, 0, 0, 1]  # the members' labels, drawn from the test samples
    assert len(candidate_pool(split, 7, seed=0).labels) == 7


def test_membership_scorer_averages_over_clients_and_reports_the_paper_scores() -> None:
    split = _split()
    pool = candidate_pool(split, None, seed=0)
    oracle = torch.stack([(pool.origin == k).double() for k in (0, 1)])  # scores that know the truth
    result = MembershipScores((0, 1), oracle, paper_scores=torch.zeros_like(oracle), details={"references_mean": 2.0})
    metrics = MembershipScorer(pool, seed=0)("lira_x", result).metrics
    assert metrics["attack/lira_x/auc"] == 1.0 and metrics["attack/lira_x/tpr_at_1pct_fpr"] == 1.0
    assert metrics["attack/lira_x/paper_auc"] == pytest.approx(0.5) and metrics["attack/lira_x/references_mean"] == 2.0
    assert metrics["attack/lira_x/clients_scored"] == 2.0
    named = MembershipScorer(pool, seed=0)("lira_x", MembershipScores((0,), oracle[:1], name="lira_x_all"))
    assert "attack/lira_x_all/auc" in named.metrics and named.images["attack/lira_x_all/roc"].shape[0] == 3


def test_label_distribution_scorer_scores_estimates_and_baselines() -> None:
    split = _split()
    scorer = LabelDistributionScorer(split, seed=0)
    truth = torch.tensor([[0.75, 0.25, 0.0], [0.0, 1 / 3, 2 / 3]], dtype=torch.float64)
    assert torch.allclose(scorer.truth, truth)
    exact = scorer("ldia", LabelDistributions((0, 1), truth.clone())).metrics
    assert exact["attack/ldia/kl"] == pytest.approx(0.0, abs=1e-12) and exact["attack/ldia/chebyshev"] == 0.0
    uniform = scorer("ldia", LabelDistributions((0, 1), torch.full((2, 3), 1 / 3, dtype=torch.float64))).metrics
    assert uniform["attack/ldia/kl"] == pytest.approx(uniform["attack/ldia/uniform_kl"])
    assert exact["attack/ldia/random_kl"] > 0 and exact["attack/ldia/random_kl_mean1000"] > 0


def test_summary_prints_one_table_per_kind_of_attack() -> None:
    final = {
        "attack/ldia/kl": 0.1,
        "attack/ldia/random_kl": 0.7,
        "attack/lira_distill/tpr_at_1pct_fpr": 0.05,
        "attack/lira_distill/auc": 0.6,
        "attack/pli/accuracy": 0.5,
    }
    tables = attack_summary(final).split("\n\n")
    assert [t.splitlines()[1].split()[0] for t in tables] == ["pli", "ldia", "lira_distill"]
    assert tables[2].splitlines()[1].split() == ["lira_distill", "5.00%", "-", "0.600", "-"]
