"""The scorer registry: each result type's scorer is registered in its own module and built from one ScoringContext;
a new result type is scored by registering its scorer, with no edit to the evaluator or to ``build_evaluator``."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Optional

import pytest
import torch
from torch import Tensor

import fdattack.fd.results as results
from fdattack.attacks import ATTACKS, Attack
from fdattack.config import compose
from fdattack.evaluation import SCORERS, Evaluator, Report, ScoringContext
from fdattack.evaluation.scoring import ScorerRegistry
from fdattack.experiment import Experiment
from fdattack.fd.results import RESULT_TYPES, MembershipScores
from fdattack.fd.threat import Capability
from fdattack.knobs import knob
from tests.conftest import tiny


@dataclass(frozen=True)
class Brightness:
    """A toy result type: images whose mean pixel value the evaluation side reports."""

    images: Tensor
    name: Optional[str] = None


class BrightnessScorer:
    """Scores :class:`Brightness` (and remembers the context it was built from)."""

    def __init__(self, context: ScoringContext) -> None:
        self.context = context

    def __call__(self, attack: str, result: Brightness) -> Report:
        return Report(metrics={f"attack/{result.name or attack}/brightness": float(result.images.mean())})


@pytest.fixture
def brightness(monkeypatch: pytest.MonkeyPatch) -> None:
    """Adds Brightness as the two real steps would (a result type in ``RESULT_TYPES``, its scorer on ``SCORERS``), for one test."""
    monkeypatch.setattr(results, "RESULT_TYPES", (*RESULT_TYPES, Brightness))
    monkeypatch.setattr(SCORERS, "_factories", dict(SCORERS._factories))
    SCORERS.register(Brightness)(BrightnessScorer)


@dataclass
class BrightSettings:
    level: float = knob(0.5, "the grey level of the images", ge=-1, le=1)


class BrightAttack(Attack):
    """A test attack that returns Brightness results (grey images of its level)."""

    name = "bright"
    Settings = BrightSettings
    needs = frozenset({Capability.public_data})
    produces = frozenset({Brightness})

    def on_round_end(self, round: int) -> list[Brightness]:
        return [Brightness(torch.full((2, *self.view.image_shape), self.settings.level))]


def test_every_result_type_has_a_registered_scorer() -> None:
    assert set(SCORERS.types()) == set(RESULT_TYPES)


def test_a_registered_result_type_is_scored_by_its_scorer(brightness: None) -> None:
    context = ScoringContext(cfg=None, oracle=None, seed=3)  # type: ignore[arg-type]
    evaluator = Evaluator(None, {Brightness: SCORERS.get(Brightness)(context)})  # type: ignore[arg-type]
    report = evaluator.score("toy", [Brightness(torch.full((2, 1, 4, 4), 0.25)), Brightness(torch.zeros(1, 1, 4, 4), name="dark")])
    assert report.metrics == {"attack/toy/brightness": 0.25, "attack/dark/brightness": 0.0}
    assert evaluator.scorers[Brightness].context is context  # type: ignore[attr-defined]


def test_the_registration_is_undone_after_the_test() -> None:
    assert Brightness not in SCORERS and Brightness not in results.RESULT_TYPES


def test_a_run_scores_a_new_result_type_through_its_registered_scorer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, brightness: None
) -> None:
    monkeypatch.setattr(ATTACKS, "_items", {**ATTACKS._items, "bright": BrightAttack})
    exp = Experiment(
        compose(
            None,
            tiny(
                tmp_path,
                "attacks=[bright]",
                "attack.bright.level=0.5",
                "protocol.rounds=1",
                "evaluation.classifier=null",
                "evaluation.confidence_gap.enabled=false",
                "protocol.transfer_public_epochs=1",
                "protocol.transfer_private_epochs=1",
            ),
        )
    )
    assert set(exp.evaluator.scorers) == {Brightness}  # only the declared types' scorers are built
    scorer = exp.evaluator.scorers[Brightness]
    assert isinstance(scorer, BrightnessScorer) and scorer.context.oracle is exp.oracle and scorer.context.candidates is None
    final = exp.run()
    assert final["attack/bright/brightness"] == 0.5
    assert json.loads((tmp_path / "run" / "metrics.json").read_text())["attack/bright/brightness"] == 0.5


def test_a_result_whose_scorer_was_not_built_is_refused_in_one_line(brightness: None) -> None:
    with pytest.raises(
        RuntimeError,
        match=r"^attack toy returned Brightness but does not declare them: "
        r"set produces = frozenset\(\{Brightness\}\) on its class$",
    ):
        Evaluator(None).score("toy", [Brightness(torch.zeros(1, 1, 4, 4))])  # type: ignore[arg-type]


def test_a_type_without_a_scorer_is_named_with_the_registered_ones() -> None:
    with pytest.raises(
        TypeError,
        match=r"^no scorer is registered for Brightness \(scorers: .*Reconstructions.*\); register one with "
        r"@SCORERS.register\(Brightness\)",
    ):
        SCORERS.get(Brightness)


def test_a_result_type_registers_once() -> None:
    registry = ScorerRegistry()
    registry.register(Brightness)(BrightnessScorer)
    with pytest.raises(ValueError, match="a scorer of Brightness is registered twice"):
        registry.register(Brightness)(BrightnessScorer)


def test_membership_scores_need_the_candidates() -> None:
    context = ScoringContext(cfg=SimpleNamespace(evaluation=SimpleNamespace(bootstrap_resamples=10)), oracle=None, seed=0)  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match=r"^MembershipScores are scored against the attacker's candidate set, but this run has none"):
        SCORERS.get(MembershipScores)(context)
