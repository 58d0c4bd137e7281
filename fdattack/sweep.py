"""``fdattack sweep SWEEP.yaml [--count N]``: run a W&B sweep file locally with W&B's own search engine.

The ``sweeps`` package (grid, random, bayes) proposes each trial from the finished ones; every trial is
``fdattack run`` with the sweep ``command``'s experiment file and the proposed ``key=value`` overrides,
in ``<root>/<sweep name>/trial_NNN``. Online users run the same file with ``wandb sweep`` + ``wandb agent``.
"""

from __future__ import annotations

import logging
import math
import warnings
from pathlib import Path

import yaml

from fdattack.errors import ConfigError, FdattackError

log = logging.getLogger("fdattack")


def load_sweep(path: Path) -> dict:
    """Read and schema-check a sweep file (``sweeps.schema_violations_from_proposed_config``)."""
    if not path.is_file():
        raise ConfigError(f"sweep file not found: {path}")
    try:
        config = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML ({str(err).splitlines()[0]})") from None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import sweeps
    violations = sweeps.schema_violations_from_proposed_config(config) if isinstance(config, dict) else ["not a mapping"]
    if violations:
        raise ConfigError(f"{path}: not a valid W&B sweep: {violations[0]}")
    return config


def command_tokens(config: dict) -> tuple[str | None, list[str]]:
    """The experiment file and fixed overrides between ``run`` and ``${args_no_hyphens}`` in ``command``."""
    command = [str(t) for t in config.get("command", [])]
    if "run" not in command:
        return None, []
    tokens = [t for t in command[command.index("run") + 1 :] if not t.startswith("${")]
    if tokens and "=" not in tokens[0]:
        return tokens[0], tokens[1:]
    return None, tokens


def run_sweep(path: Path, count: int | None, root: Path, extra: list[str]) -> list[dict]:
    """Run up to ``count`` trials (all of a grid when None); returns one row per trial with its metric."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import sweeps
    from fdattack.config import compose
    from fdattack.experiment import run

    config = load_sweep(path)
    experiment, fixed = command_tokens(config)
    metric = config.get("metric", {}).get("name")
    done: list = []
    rows: list[dict] = []
    while count is None or len(done) < count:
        proposal = sweeps.next_run(config, done)
        if proposal is None:
            break
        params = {k: v["value"] for k, v in proposal.config.items()}
        out = root / path.stem / f"trial_{len(done):03d}"
        overrides = [*fixed, *(f"{k}={v}" for k, v in params.items()), f"output_dir={out}", *extra]
        try:
            metrics = run(compose(experiment, overrides))
            proposal.state = sweeps.RunState.finished
        except FdattackError as err:
            log.error("trial %d failed: %s", len(done), err)
            metrics, proposal.state = {}, sweeps.RunState.failed
        proposal.summary_metrics = dict(metrics)
        proposal.name = out.name
        done.append(proposal)
        rows.append({"trial": out.name, **params, metric or "metric": metrics.get(metric, math.nan) if metric else math.nan})
    return rows


def format_rows(rows: list[dict]) -> str:
    """A plain table of the trials."""
    if not rows:
        return "no trials"
    keys = list(rows[0])
    widths = [max(len(k), *(len(f"{r.get(k)}") for r in rows)) for k in keys]
    line = lambda values: "  ".join(f"{v!s:<{w}}" for v, w in zip(values, widths))  # noqa: E731
    return "\n".join([line(keys)] + [line([r.get(k) for k in keys]) for r in rows])
