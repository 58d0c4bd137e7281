"""Membership ground truth: the candidate samples the attacker holds, whose members they are, and the scoring of
:class:`~fdattack.fd.results.MembershipScores` (Shi et al., PoPETs 2025, §4.1.4).

The attacker holds one candidate set (images and labels, :meth:`CandidatePool.as_known`): every client's
private samples and the test samples, or a seeded random part of them, in a shuffled order. It never learns
whose members they are, so membership attacks score every candidate for every target client. For client n the
evaluator takes its members (its private samples among the candidates) and as many label-matched non-members,
drawn with replacement from the test candidates (the authors' protocol), computes the metrics of
:func:`~fdattack.functional.membership_metrics.membership_metrics`, and averages them over the clients (as the paper reports them).
"""

from __future__ import annotations

import io

import numpy as np
import torch
from torch import Tensor

from fdattack.evaluation.candidates import NON_MEMBER, CandidatePool
from fdattack.evaluation.report import Report
from fdattack.evaluation.scoring import SCORERS, ScoringContext
from fdattack.fd.results import MembershipScores
from fdattack.functional.membership_metrics import FPR_LEVELS, membership_metrics, roc
from fdattack.statistics.intervals import BOOTSTRAP_RESAMPLES, interval_keys
from fdattack.statistics.membership_bootstrap import ClientScores, membership_bootstrap

#: the metrics of each client, in the order of :func:`~fdattack.statistics.membership_bootstrap.membership_points`
METRICS = (*FPR_LEVELS, "auc", "balanced_accuracy")


class MembershipScorer:
    """Scores membership results against the pool's ground truth, one evaluation set per target client.

    Each metric (and each ``paper_`` one) comes with its 95 % interval (``_ci_low``, ``_ci_high``): the percentile
    bootstrap of the mean over clients that resamples the candidates, the independent units: each client's members
    apart, and the test candidates drawn as non-members once for all clients, within each label
    (:func:`~fdattack.statistics.membership_bootstrap.membership_bootstrap`).

    Args:
        pool: the candidates and their origin.
        seed: seeds the draw of each client's non-members (fixed for the run, so rounds compare) and the bootstrap.
        resamples: bootstrap resamples of the intervals.
    """

    def __init__(self, pool: CandidatePool, seed: int, resamples: int = BOOTSTRAP_RESAMPLES) -> None:
        self.pool = pool
        self.seed = seed
        self.resamples = resamples
        self._sets: dict[int, tuple[Tensor, Tensor]] = {}

    def evaluation_set(self, client: int) -> tuple[Tensor, Tensor]:
        """(candidate columns, is_member) of ``client``: its members, then label-matched non-members (with replacement)."""
        if client not in self._sets:
            members = torch.nonzero(self.pool.origin == client).flatten()
            outsiders = torch.nonzero(self.pool.origin == NON_MEMBER).flatten()
            rng = np.random.default_rng([self.seed, client])
            picked = []
            for label, count in zip(*torch.unique(self.pool.labels[members], return_counts=True)):
                same = outsiders[self.pool.labels[outsiders] == label].numpy()
                if len(same):
                    picked.append(torch.as_tensor(rng.choice(same, size=int(count), replace=True)))
            non_members = torch.cat(picked) if picked else torch.empty(0, dtype=torch.long)
            columns = torch.cat([members, non_members])
            self._sets[client] = (columns, torch.arange(len(columns)) < len(members))
        return self._sets[client]

    def __call__(self, attack: str, result: MembershipScores) -> Report:
        """``attack/<name>/...``: the mean over target clients of each metric with its interval, and a log-log ROC figure."""
        name = result.name or attack
        per_client: list[dict[str, float]] = []
        paper: list[dict[str, float]] = []
        curves = []
        samples: list[ClientScores] = []
        paper_samples: list[ClientScores] = []
        for row, client in enumerate(result.clients):
            columns, is_member = self.evaluation_set(client)
            if is_member.all() or not is_member.any():
                continue  # no member (or no non-member) of this client among the candidates
            scores = result.scores[row, columns]
            per_client.append(membership_metrics(is_member, scores))
            curves.append(roc(is_member, scores))
            samples.append(client_scores(scores, is_member, columns))
            if result.paper_scores is not None:
                paper.append(membership_metrics(is_member, result.paper_scores[row, columns]))
                paper_samples.append(client_scores(result.paper_scores[row, columns], is_member, columns))
        metrics: dict[str, float] = {}
        for prefix, scored, sets in (("", per_client, samples), ("paper_", paper, paper_samples)):
            if not scored:
                continue
            intervals = membership_bootstrap(sets, self.strata(sets), list(FPR_LEVELS.values()), resamples=self.resamples, seed=self.seed)
            for key, interval in zip(METRICS, intervals):
                metrics[f"attack/{name}/{prefix}{key}"] = float(np.mean([m[key] for m in scored]))
                metrics.update(interval_keys(f"attack/{name}/{prefix}{key}", interval))
        metrics[f"attack/{name}/clients_scored"] = float(len(per_client))
        metrics.update({f"attack/{name}/{key}": float(value) for key, value in result.details.items()})
        images = {f"attack/{name}/roc": roc_figure(curves, name)} if curves else {}
        return Report(metrics=metrics, images=images)

    def strata(self, sets: list[ClientScores]) -> list[np.ndarray]:
        """The candidates drawn as non-members for any of ``sets``, one array per label."""
        ids = np.unique(np.concatenate([c.non_member_ids for c in sets]))
        labels = self.pool.labels[torch.as_tensor(ids)].numpy()
        return [ids[labels == label] for label in np.unique(labels)]


def client_scores(scores: Tensor, is_member: Tensor, columns: Tensor) -> ClientScores:
    """One client's member and non-member scores (float64) and the candidate of each non-member draw."""
    return ClientScores(scores[is_member].double().numpy(), scores[~is_member].double().numpy(), columns[~is_member].numpy())


@SCORERS.register(MembershipScores)
def build_membership_scorer(context: ScoringContext) -> MembershipScorer:
    """The scorer against the run's candidate pool, its non-member draws seeded with the evaluation seed.

    Raises:
        RuntimeError: the run has no candidates (no attack reads them), so membership cannot be scored.
    """
    if context.candidates is None:
        raise RuntimeError(
            "MembershipScores are scored against the attacker's candidate set, but this run has none: the attack "
            "that produces them must read it (reads = frozenset({ViewPart.candidates}) on its class)"
        )
    return MembershipScorer(context.candidates, context.seed, context.cfg.evaluation.bootstrap_resamples)


def roc_figure(curves: list[tuple[Tensor, Tensor]], title: str) -> Tensor:
    """Every target client's ROC on log-log axes with the chance diagonal (as the paper's Fig. 9): (3, H, W) in [0, 1]."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from PIL import Image

    fig, ax = plt.subplots(figsize=(4, 4), dpi=100)
    floor = 1e-4
    for k, (fpr, tpr) in enumerate(curves):
        ax.plot(fpr.clamp_min(floor).numpy(), tpr.clamp_min(floor).numpy(), linewidth=1, label=f"client {k}" if len(curves) <= 10 else None)
    ax.plot([floor, 1], [floor, 1], "k--", linewidth=0.8, label="chance")
    ax.set(
        xscale="log", yscale="log", xlim=(floor, 1), ylim=(floor, 1), xlabel="false positive rate", ylabel="true positive rate", title=title
    )
    ax.legend(fontsize=6, loc="lower right")
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", bbox_inches="tight")
    plt.close(fig)
    image = np.asarray(Image.open(buffer).convert("RGB"), dtype=np.float32) / 255.0
    return torch.from_numpy(image).permute(2, 0, 1).contiguous()
