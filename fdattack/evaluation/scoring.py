"""The scorer registry: every result type of :mod:`fdattack.fd.results` has one scorer, ``scorer(attack, result) -> Report``.

Each scorer's module registers a factory that builds it from a :class:`ScoringContext`; a run builds the scorers of the
result types its attacks declare in ``produces`` (:func:`fdattack.assembly.build_evaluator`). A new result type: its
dataclass in ``fdattack/fd/results.py`` (listed in ``RESULT_TYPES``), one module here with its scorer and
``@SCORERS.register(NewResult)`` on a ``factory(context) -> scorer``, and one line importing that module in ``__init__.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional, Protocol, Sequence, TypeVar

from omegaconf import DictConfig

from fdattack.evaluation.candidates import CandidatePool
from fdattack.evaluation.oracle import Oracle
from fdattack.evaluation.report import Report
from fdattack.fd.results import Inversions, Reconstructions
from fdattack.tracking.artifact_cache import ArtifactCache

if TYPE_CHECKING:
    from fdattack.tracking.progress import Progress


class Scorer(Protocol):
    """Turns one result of its type into ``attack/<name>/...`` metrics, images and artifacts, from ground truth."""

    def __call__(self, attack: str, result: Any) -> Report: ...


@dataclass(frozen=True)
class ScoringContext:
    """Everything a scorer factory may build from: the run's config and its ground truth.

    Attributes:
        cfg: the run's composed config (``cfg.evaluation`` holds the scorers' settings; ``cfg.seed`` the run seed).
        oracle: the ground truth (split, models, engine).
        seed: the evaluation seed, derived from the run seed (``derive_seed(cfg.seed, "evaluation")``).
        progress: where a factory names a long activity (the evaluation classifier's training), or None.
        candidates: the membership candidates and their origin, or None where no attack reads candidates.
        cache_dir: folder where the evaluation classifiers are kept and found again (:attr:`cache`), or None.
    """

    cfg: DictConfig
    oracle: Oracle
    seed: int
    progress: Optional[Progress] = None
    candidates: Optional[CandidatePool] = None
    cache_dir: Optional[Path] = None

    @property
    def announce(self) -> Optional[Callable[[str], None]]:
        """``progress.activity``, or None without a progress bar."""
        return self.progress.activity if self.progress is not None else None

    @property
    def cache(self) -> Optional[ArtifactCache]:
        """The evaluation side's cache in ``cache_dir``, written and read as the run's ``isolation.mode`` allows
        (:mod:`fdattack.tracking.artifact_cache`), or None."""
        return None if self.cache_dir is None else ArtifactCache(self.cache_dir, str(self.cfg.isolation.mode))


ScorerFactory = Callable[[ScoringContext], Scorer]
F = TypeVar("F", bound=ScorerFactory)


class ScorerRegistry:
    """Result type -> the factory of its scorer; each type registered once, by its scorer's module."""

    def __init__(self) -> None:
        self._factories: dict[type, ScorerFactory] = {}
        self._on_round_models: set[type] = set()

    def register(self, result_type: type, on_round_models: bool = False) -> Callable[[F], F]:
        """Decorator that registers ``factory(context) -> scorer`` for exactly ``result_type`` (not its subclasses);
        ``on_round_models``: its scorer reads the networks as they are at the round's end, so results of this type are
        scored before the next round simulates (an attack producing them never ends rounds beside it)."""

        def add(factory: F) -> F:
            if result_type in self._factories:
                raise ValueError(f"a scorer of {result_type.__name__} is registered twice")
            self._factories[result_type] = factory
            if on_round_models:
                self._on_round_models.add(result_type)
            return factory

        return add

    def on_round_models(self, result_type: type) -> bool:
        """Whether ``result_type``'s scorer reads the networks as they are at the round's end."""
        return result_type in self._on_round_models

    def get(self, result_type: type) -> ScorerFactory:
        """The factory of ``result_type``'s scorer.

        Raises:
            TypeError: no scorer is registered for it (an attack declares a result type the evaluation side cannot score).
        """
        try:
            return self._factories[result_type]
        except KeyError:
            known = ", ".join(t.__name__ for t in self)
            raise TypeError(
                f"no scorer is registered for {result_type.__name__} (scorers: {known}); register one with "
                f"@SCORERS.register({result_type.__name__}) in a module of fdattack/evaluation/"
            ) from None

    def types(self) -> list[type]:
        """The registered result types, in registration order."""
        return list(self._factories)

    def __contains__(self, result_type: object) -> bool:
        return result_type in self._factories

    def __iter__(self) -> Iterator[type]:
        return iter(self.types())


#: every result type's scorer factory (filled by importing :mod:`fdattack.evaluation`)
SCORERS = ScorerRegistry()


def check_labels(attack: str, result: Reconstructions | Inversions, target_labels: Sequence[int]) -> None:
    """Refuse a result whose labels are not the split's targets (an attack bug, never scored).

    :class:`Reconstructions` carry one image per target label: their labels are the target labels, each once, in
    any order. :class:`Inversions` carry distinct labels, each a target label (GMI, KED-MI, VMI invert every
    target; the L-Attack the one class c* its settings name, which must be a private class).

    Raises:
        RuntimeError: one line naming the attack, the labels it returned and the targets.
    """
    kind = type(result).__name__
    labels = [int(y) for y in result.labels.reshape(-1).tolist()]
    targets = sorted(int(j) for j in target_labels)
    column = 0 if isinstance(result, Reconstructions) else 1
    if isinstance(result, Reconstructions):
        wrong = sorted(labels) != targets
        rule = "one image per target label"
    else:
        wrong = len(set(labels)) != len(labels) or not set(labels) <= set(targets)
        rule = "distinct target labels"
    if wrong or result.labels.dim() != 1 or result.images.shape[column] != len(labels):
        shape = f"{len(labels)} labels for images of shape {tuple(result.images.shape)}"
        raise RuntimeError(
            f"attack {attack} returned {kind} for labels {labels} ({shape}), but they must be {rule}: the target labels are {targets}"
        )
