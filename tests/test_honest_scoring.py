"""Scoring that cannot be fooled by a buggy or cheating attack, and a diagnostic key that is read (issue 27 item 2):
the evaluator refuses results whose labels are not the split's targets, and ``evaluation.confidence_gap.bins`` sets
the bins of the entropy histograms that reach W&B."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import wandb

from fdattack.attacks import ATTACKS, Attack
from fdattack.attacks.results import Inversions, Reconstructions
from fdattack.config import compose
from fdattack.evaluation.evaluator import Evaluator
from fdattack.evaluation.inversion import InversionScorer
from fdattack.evaluation.reconstruction import ReconstructionScorer
from fdattack.evaluation.report import Report
from fdattack.experiment import Experiment
from fdattack.fd.threat import Capability
from fdattack.knobs import knob
from fdattack.tracking.wandb_run import WandbRun
from tests.conftest import tiny

TARGETS = [0, 3, 4, 5, 7]


class _StandInReconstructions(ReconstructionScorer):
    """The reconstruction scorer (its label check and report) with stand-in metrics."""

    def measure(self, recon: torch.Tensor, labels: torch.Tensor) -> tuple[dict[str, float], torch.Tensor]:
        return {"accuracy": 1.0}, torch.zeros(1, 1, 1)


class _StandInInversions(InversionScorer):
    """The inversion scorer (its label check) with a stand-in report (no evaluation classifier)."""

    def measure(self, attack: str, result: Inversions) -> Report:
        return Report(metrics={f"attack/{attack}/top1": 1.0})


def _evaluator() -> Evaluator:
    """An evaluator over targets 0, 3, 4, 5, 7 whose scorers check the labels as the real ones and stand in for the rest."""
    none = SimpleNamespace(images=torch.zeros(0, 1, 8, 8), labels=torch.zeros(0, dtype=torch.long))
    split = SimpleNamespace(private=[none], public=none, num_classes=8, target_labels=TARGETS)
    scorers = {
        Reconstructions: _StandInReconstructions(split),  # type: ignore[arg-type]
        Inversions: _StandInInversions(split, lambda: None, grid_samples=1),
    }  # type: ignore[arg-type]
    return Evaluator(SimpleNamespace(split=split), scorers)  # type: ignore[arg-type]


def _images(*shape: int) -> torch.Tensor:
    return torch.zeros(*shape, 1, 8, 8)


@pytest.mark.parametrize("labels", [[7, 5, 4, 3, 0], TARGETS], ids=["any_order", "in_order"])
def test_reconstructions_of_every_target_once_are_scored(labels: list[int]) -> None:
    for role in ("attack", "prior"):
        report = _evaluator().score("pli", [Reconstructions(_images(5), torch.tensor(labels), role=role)])  # type: ignore[arg-type]
        assert report.metrics


@pytest.mark.parametrize(
    ("labels", "n"),
    [
        ([0, 3, 4, 5, 1], 5),  # a public (non-target) label in place of target 7
        ([0, 3, 4, 5], 4),  # a target left out
        ([0, 3, 4, 5, 5, 7], 6),  # a target twice (the best of two tries)
        ([0, 3, 4, 5, 7], 4),  # five labels for four images
    ],
    ids=["non_target", "missing", "duplicate", "shape"],
)
def test_reconstructions_whose_labels_are_not_the_targets_are_refused(labels: list[int], n: int) -> None:
    with pytest.raises(RuntimeError) as refused:
        _evaluator().score("cheat", [Reconstructions(_images(n), torch.tensor(labels))])
    message = str(refused.value)
    assert "\n" not in message and "attack cheat returned Reconstructions" in message
    assert f"for labels {labels}" in message and "one image per target label" in message and f"the target labels are {TARGETS}" in message


@pytest.mark.parametrize("labels", [TARGETS, [3], [7, 0]], ids=["every_target", "one_class_c_star", "some_targets"])
def test_inversions_of_distinct_target_labels_are_scored(labels: list[int]) -> None:
    report = _evaluator().score("gmi", [Inversions(_images(2, len(labels)), torch.tensor(labels))])
    assert report.metrics == {"attack/gmi/top1": 1.0}


@pytest.mark.parametrize("labels", [[1], [0, 3, 3], [0, 3, 4, 5, 7, 9]], ids=["non_target", "duplicate", "one_too_many"])
def test_inversions_of_other_labels_are_refused(labels: list[int]) -> None:
    with pytest.raises(
        RuntimeError,
        match=rf"^attack lattack returned Inversions for labels \[{', '.join(map(str, labels))}\] .*"
        r"distinct target labels: the target labels are \[0, 3, 4, 5, 7\]$",
    ):
        _evaluator().score("lattack", [Inversions(_images(1, len(labels)), torch.tensor(labels))])


@dataclass
class RelabelSettings:
    level: float = knob(0.0, "the grey level of the reconstructions", ge=-1, le=1)


class RelabellingAttack(Attack):
    """A buggy (or cheating) attack: its last reconstruction claims a label that is not a target."""

    name = "relabel"
    Settings = RelabelSettings
    needs = frozenset({Capability.public_data})
    produces = frozenset({Reconstructions})

    def on_round_end(self, round: int) -> list[Reconstructions]:
        labels = torch.tensor(self.view.target_labels)
        labels[-1] = next(c for c in range(self.view.num_classes) if c not in self.view.target_labels)
        return [Reconstructions(torch.full((len(labels), *self.view.image_shape), self.settings.level), labels)]


def test_a_run_stops_at_an_attack_that_relabels_its_reconstructions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ATTACKS, "_items", {**ATTACKS._items, "relabel": RelabellingAttack})
    exp = Experiment(
        compose(
            None,
            tiny(
                tmp_path,
                "attacks=[relabel]",
                "protocol.rounds=1",
                "evaluation.classifier=null",
                "evaluation.confidence_gap.enabled=false",
                "protocol.transfer_public_epochs=1",
                "protocol.transfer_private_epochs=1",
            ),
        )
    )
    targets = sorted(exp.data.split.target_labels)
    with pytest.raises(
        RuntimeError,
        match=rf"attack relabel returned Reconstructions for labels .*the target labels are \[{', '.join(map(str, targets))}\]$",
    ):
        exp.run()


# ---------------------------------------------------------------------------------------------------- confidence gap bins
class _FakeRun:
    id, dir = "fake", "/nonexistent/files"

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def log(self, row: dict[str, Any], step: int) -> None:
        self.rows.append(row)


@pytest.mark.parametrize("bins", [2, 7])
def test_confidence_gap_histograms_have_the_configured_bins_over_0_to_log_j(tmp_path: Path, bins: int) -> None:
    exp = Experiment(
        compose(
            None, tiny(tmp_path, "protocol.rounds=1", f"evaluation.confidence_gap.bins={bins}", "evaluation.confidence_gap.max_samples=40")
        )
    )
    (diagnostic,) = exp.evaluator.diagnostics
    report = diagnostic.report()
    top = math.log(exp.data.split.num_classes)
    assert set(report.histograms) == {
        f"diag/confidence_gap/{k}_entropy" for k in ("client_public", "client_private", "server_public", "server_private")
    }
    samples = {"client_public": 40 * 2, "client_private": 40 * 2, "server_public": 40, "server_private": 40 * 2}  # 2 clients
    for key, (counts, edges) in report.histograms.items():
        assert counts.shape == (bins,) and edges.shape == (bins + 1,)
        assert float(edges[0]) == 0.0 and float(edges[-1]) == pytest.approx(top)
        assert int(counts.sum()) == samples[key.split("/")[-1].removesuffix("_entropy")]  # every entropy lands in a bin
    fake = _FakeRun()
    WandbRun(fake, "offline").log_round(1, report.metrics, report.histograms)
    (row,) = fake.rows
    histogram = row["diag/confidence_gap/server_private_entropy"]
    assert isinstance(histogram, wandb.Histogram) and len(histogram.histogram) == bins and len(histogram.bins) == bins + 1
    assert histogram.bins[-1] == pytest.approx(top)
