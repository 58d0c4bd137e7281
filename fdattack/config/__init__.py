"""The run config, on top of every component: the run-wide schema (:mod:`.schema`), composition (:mod:`.composition`),
validation (:mod:`.validation`) and ``--help-config`` (:mod:`.help_text`).

Contract: the top floor. Components keep their settings beside them (:mod:`fdattack.knobs` is their ground floor)
and never import this package; it imports their registries (:mod:`.registries`) to compose a run.
"""

from fdattack.config.composition import compose, load_config
from fdattack.config.help_text import help_config
from fdattack.config.schema import DataConfig, EvaluationConfig, ExperimentConfig, LoggerConfig, ModelConfig, TrainerConfig, WandbConfig
from fdattack.config.validation import validate

__all__ = [
    "DataConfig",
    "EvaluationConfig",
    "ExperimentConfig",
    "LoggerConfig",
    "ModelConfig",
    "TrainerConfig",
    "WandbConfig",
    "compose",
    "help_config",
    "load_config",
    "validate",
]
