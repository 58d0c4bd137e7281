"""``fdattack sweep SWEEP.yaml [--count N]``: run a W&B sweep file locally with W&B's own search engine.

The ``sweeps`` package (grid, random, bayes) proposes each trial from the finished ones; every trial is
``fdattack run`` with the sweep ``command``'s experiment file and the proposed ``key=value`` overrides,
in ``<root>/<sweep name>/trial_NNN``, logged to the sweep file's ``project`` with the sweep name as W&B
group, job type ``sweep-trial`` and the parameter values as run name (``tau=3,gamma=0.1``).

Re-running a sweep continues it: trials whose folder already holds ``metrics.json`` for the same
parameter values are fed to the engine as finished and not run again, and a trial cut short resumes
from its last checkpoint. Online users run the same file with ``wandb sweep`` + ``wandb agent``.
"""

from __future__ import annotations

import json
import logging
import math
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf

from fdattack.errors import ConfigError, FdattackError
from fdattack.tracking.report_runs import short_names

log = logging.getLogger("fdattack")

TRIAL_PREFIX = "trial_"


@dataclass
class Trial:
    """One trial of a sweep: its folder, parameter values, state and final metrics.

    ``state`` is ``done`` (finished by an earlier ``fdattack sweep``), ``finished``, ``failed``, or
    ``incomplete`` (a folder without ``metrics.json``: a trial cut short).
    """

    folder: Path
    params: dict[str, Any]
    state: str
    metrics: dict[str, Any] = field(default_factory=dict)


def _sweeps() -> ModuleType:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import sweeps
    return sweeps


def load_sweep(path: Path) -> dict:
    """Read and schema-check a sweep file (``sweeps.schema_violations_from_proposed_config``)."""
    if not path.is_file():
        raise ConfigError(f"sweep file not found: {path}")
    try:
        config = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML ({str(err).splitlines()[0]})") from None
    violations = _sweeps().schema_violations_from_proposed_config(config) if isinstance(config, dict) else ["not a mapping"]
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


def format_value(value: Any) -> str:
    """A number to 4 significant digits (other values as they print); NaN and missing as ``nan``."""
    if value is None:
        return "nan"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(format_value(v) for v in value) + "]"
    return str(value)


def trial_label(params: dict[str, Any]) -> str:
    """The run name of a trial: its parameter values under short keys, e.g. ``tau=3,gamma=0.1``."""
    short = short_names(list(params))
    return ",".join(f"{short[key]}={format_value(value)}" for key, value in params.items())


def _select(cfg: DictConfig, key: str) -> Any:
    value = OmegaConf.select(cfg, key, default=None)
    return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value


def earlier_trials(folder: Path, keys: list[str]) -> list[Trial]:
    """The trials under ``folder`` that an earlier ``fdattack sweep`` left (``done`` or ``incomplete``), by folder name."""
    trials = []
    for trial_dir in sorted(folder.glob(f"{TRIAL_PREFIX}*")):
        try:
            stored = OmegaConf.load(trial_dir / "config.yaml")
            metrics = json.loads((trial_dir / "metrics.json").read_text()) if (trial_dir / "metrics.json").is_file() else None
        except Exception as err:  # an unreadable folder is not a finished trial: say so and leave it alone
            log.warning("%s: not read as an earlier trial (%s)", trial_dir, str(err).splitlines()[0] if str(err) else type(err).__name__)
            continue
        params = {key: _select(stored, key) for key in keys}
        trials.append(Trial(trial_dir, params, "done" if isinstance(metrics, dict) else "incomplete", metrics or {}))
    return trials


def _next_folder(folder: Path) -> Path:
    """``trial_NNN`` after the highest one under ``folder``."""
    numbers = [int(p.name[len(TRIAL_PREFIX) :]) for p in folder.glob(f"{TRIAL_PREFIX}*") if p.name[len(TRIAL_PREFIX) :].isdigit()]
    return folder / f"{TRIAL_PREFIX}{max(numbers, default=-1) + 1:03d}"


def _has_checkpoint(folder: Path) -> bool:
    return any((folder / "checkpoints").glob("round_*.pt"))


def _finished_run(sweeps: ModuleType, trial: Trial) -> Any:
    """A trial as the engine's ``SweepRun`` (metrics without the NaNs recorded as null)."""
    return sweeps.SweepRun(
        name=trial.folder.name,
        state=sweeps.RunState.finished if trial.state in ("done", "finished") else sweeps.RunState.failed,
        config={key: {"value": value} for key, value in trial.params.items()},
        summary_metrics={k: v for k, v in trial.metrics.items() if v is not None},
    )


def check_before_trials(path: Path, config: dict, count: int | None) -> int | None:
    """What a sweep file must say before any trial runs (issue 30): random and bayes search never end on their own
    (``--count`` or the file's ``run_cap`` bounds them), bayes needs a metric, and a grid needs listed values.

    Returns:
        The number of trials in all: ``count``, else the file's ``run_cap``, else None (a grid's every point).
    """
    method = config.get("method")
    count = count if count is not None else config.get("run_cap")
    if method in ("random", "bayes") and count is None:
        raise ConfigError(f"{path}: method: {method} never ends on its own; give --count N (or run_cap: N in the sweep file)")
    if method == "bayes" and not (config.get("metric") or {}).get("name"):
        raise ConfigError(f"{path}: method: bayes needs a metric to model (metric: {{name: attack/<name>/<metric>, goal: maximize}})")
    if method == "grid":
        for key, spec in config["parameters"].items():
            if isinstance(spec, dict) and "values" not in spec and "value" not in spec:
                raise ConfigError(f"{path}: parameters.{key}: a grid takes listed values (values: [...] or value: x), not a distribution")
    return count


def check_trial_config(sweeps: ModuleType, config: dict, experiment: str | None, fixed: list[str], extra: list[str], folder: Path) -> None:
    """Compose the first trial's config before any trial runs, so a misspelt parameter or override, or an experiment file
    not found from here, stops the sweep with one line instead of failing every trial."""
    from fdattack.config import compose

    proposal = sweeps.next_run(config, [])
    if proposal is None:
        return
    params = [f"{key}={proposal.config[key]['value']}" for key in config["parameters"]]
    compose(experiment, [*fixed, *params, f"output_dir={folder / 'trial_check'}", *extra])  # in a trial's order


def run_sweep(path: Path, count: int | None, root: Path, extra: list[str]) -> list[Trial]:
    """Run the sweep until ``count`` trials (those already done included) or the whole grid are done.

    Args:
        path: the sweep file.
        count: trials in all, earlier ones included; None runs the whole grid (random and bayes need it).
        root: the folder of sweeps; trials go to ``root/<sweep file stem>/trial_NNN``.
        extra: ``key=value`` overrides for every trial (after the sweep's own).

    Returns:
        Every trial of the sweep: the earlier finished ones, then this call's in order.
    """
    sweeps = _sweeps()
    from fdattack.config import compose
    from fdattack.experiment import run

    config = load_sweep(path)
    experiment, fixed = command_tokens(config)
    count = check_before_trials(path, config, count)
    name, folder = path.stem, root / path.stem
    check_trial_config(sweeps, config, experiment, fixed, extra, folder)
    earlier = earlier_trials(folder, list(config["parameters"]))
    trials = [trial for trial in earlier if trial.state == "done"]
    finished = [_finished_run(sweeps, trial) for trial in trials]
    while count is None or len(trials) < count:
        proposal = sweeps.next_run(config, finished)
        if proposal is None:
            break
        params = {key: proposal.config[key]["value"] for key in config["parameters"]}  # in the sweep file's order
        cut_short = next((t for t in earlier if t.state == "incomplete" and t.params == params and _has_checkpoint(t.folder)), None)
        out = cut_short.folder if cut_short is not None else _next_folder(folder)
        identity = {"project": config.get("project"), "group": name, "job_type": "sweep-trial", "name": trial_label(params)}
        overrides = [
            *fixed,
            *(f"{k}={v}" for k, v in params.items()),
            *(f"logger.wandb.{k}={json.dumps(v)}" for k, v in identity.items() if v),
            f"output_dir={out}",
            *(["resume=true"] if cut_short is not None else []),
            *extra,
        ]
        trial = Trial(out, params, "finished")
        try:
            trial.metrics = dict(run(compose(experiment, overrides)))
        except FdattackError as err:
            log.error("trial %s (%s) failed: %s", out.name, identity["name"], err)
            trial.state = "failed"
        except Exception:  # a bug or a broken environment in one trial: keep its traceback, go on with the sweep
            log.exception("trial %s (%s) failed", out.name, identity["name"])
            trial.state = "failed"
        trials.append(trial)
        finished.append(_finished_run(sweeps, trial))
    return trials


def format_trials(trials: list[Trial], metric: str | None) -> str:
    """A plain table: trial, state, each parameter and the sweep's metric (numbers to 4 significant digits)."""
    if not trials:
        return "no trials"
    short = short_names(list(trials[0].params))
    keys = ["trial", "state", *short.values(), metric or "metric"]
    rows = [
        [
            t.folder.name,
            t.state,
            *(format_value(t.params.get(k)) for k in short),
            format_value(t.metrics.get(metric, math.nan)) if metric and t.state != "failed" else "-",
        ]
        for t in trials
    ]
    widths = [max(len(k), *(len(r[i]) for r in rows)) for i, k in enumerate(keys)]
    return "\n".join("  ".join(f"{v:<{w}}" for v, w in zip(row, widths)).rstrip() for row in [keys, *rows])


def main(path: Path, count: int | None, root: Path, extra: list[str]) -> int:
    """``fdattack sweep``: run the sweep, print the trials' table; exit status 1 when a trial failed, else 0."""
    config = load_sweep(path)
    trials = run_sweep(path, count, root, extra)
    print(format_trials(trials, (config.get("metric") or {}).get("name")))
    done = sum(trial.state == "done" for trial in trials)
    if done:
        print(f"fdattack: {done} trial(s) finished by an earlier call in {root / path.stem} were not run again")
    failed = sum(trial.state == "failed" for trial in trials)
    if failed:
        print(f"fdattack: {failed} of {len(trials)} trials failed (their errors are above)", file=sys.stderr)
    return 1 if failed else 0
