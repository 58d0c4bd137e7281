"""Configs: the run-wide schemas (:mod:`.schema`), self-documenting fields (:mod:`.knobs`), composition
(:mod:`.composition`), validation (:mod:`.validation`) and ``--help-config`` (:mod:`.help_text`).

Composition needs the registries (protocols, attacks, defenses own their config dataclasses), which
themselves import :mod:`.knobs` and :mod:`.schema`; so :func:`compose`, :func:`load_config`,
:func:`validate` and :func:`help_config` are loaded on first use.
"""

from __future__ import annotations

from typing import Any

from fdattack.config.schema import (
    DataConfig,
    EvaluationConfig,
    ExperimentConfig,
    LoggerConfig,
    ModelConfig,
    OptimConfig,
    ProtocolConfig,
    TrainerConfig,
    WandbConfig,
)

_LAZY = {"compose": "composition", "load_config": "composition", "validate": "validation", "help_config": "help_text"}

__all__ = ["DataConfig", "EvaluationConfig", "ExperimentConfig", "LoggerConfig", "ModelConfig", "OptimConfig", "ProtocolConfig",
           "TrainerConfig", "WandbConfig", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"fdattack.config.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'fdattack.config' has no attribute {name!r}")
