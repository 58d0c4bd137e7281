"""``fdattack sweep SWEEP.yaml [--count N]``: run a W&B sweep file locally with W&B's own search engine.

The ``sweeps`` package (grid, random, bayes) proposes each trial from the finished ones; every trial is
``fdattack run`` with the sweep ``command``'s experiment file and the proposed ``key=value`` overrides,
in ``<root>/<sweep name>/trial_NNN``, logged to the sweep file's ``project`` with the sweep name as W&B
group, job type ``sweep-trial`` and the parameter values as run name (``tau=3,gamma=0.1``).

Re-running a sweep continues it: a trial folder whose ``config.yaml`` is the config that this call composes for
the trial (experiment, fixed overrides, parameter values, extra overrides; up to the keys that change no result,
:data:`~fdattack.tracking.results.RESULT_FREE_KEYS`) is the sweep's: with ``metrics.json`` it is read back
(:func:`~fdattack.tracking.results.read_result`) and fed to the engine as finished, not run again; without, it resumes
from its last checkpoint. A trial folder of another
config stops the sweep before any trial: one sweep's table holds one configuration. Online users run the same
file with ``wandb sweep`` + ``wandb agent``.
"""

from __future__ import annotations

import difflib
import itertools
import json
import logging
import math
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from omegaconf import DictConfig, OmegaConf

from fdattack.config.yaml_files import quote, read_yaml_file
from fdattack.errors import ConfigError, DataError, FdattackError
from fdattack.report.runs import short_names
from fdattack.tracking.results import first_difference, read_result, result_tree, shown

log = logging.getLogger("fdattack")

TRIAL_PREFIX = "trial_"
#: The first part of every key in ``metrics.json``; ``attack/``, ``adversary/`` and ``defense/`` name an attack or defense next.
METRIC_PREFIXES = ("protocol", "attack", "adversary", "defense", "comm", "diag", "time", "seeds")


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


@dataclass
class SweepPlan:
    """What every trial of one ``fdattack sweep`` call shares: the sweep file, its command and this call's overrides."""

    path: Path
    config: dict
    root: Path
    extra: list[str]

    @property
    def folder(self) -> Path:
        """``<root>/<sweep file stem>``: the trials' folders."""
        return self.root / self.path.stem

    @property
    def metric(self) -> str | None:
        """The sweep's ``metric.name``, if it names one."""
        return (self.config.get("metric") or {}).get("name")

    def compose(self, params: dict[str, Any], out: Path, resume: bool = False) -> DictConfig:
        """A trial's config: the experiment, the fixed overrides, the parameter values, its W&B identity and folder,
        then this call's overrides."""
        from fdattack.config import compose

        experiment, fixed = command_tokens(self.config)
        identity = {"project": self.config.get("project"), "group": self.path.stem, "job_type": "sweep-trial", "name": trial_label(params)}
        overrides = [
            *fixed,
            *(f"{k}={v}" for k, v in params.items()),
            *(f"logger.wandb.{k}={json.dumps(v)}" for k, v in identity.items() if v),
            f"output_dir={out}",
            *(["resume=true"] if resume else []),
            *self.extra,
        ]
        return compose(experiment, overrides)


def _sweeps() -> ModuleType:
    """W&B's sweeps engine (the optional ``sweeps`` extra: it caps numpy below 2, so it is not installed by default).

    Raises:
        ConfigError: it is not installed, with the command that installs it.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            import sweeps
        except ImportError:
            raise ConfigError(
                "fdattack sweep and sweep-file checks need W&B's sweeps engine, which is not installed: pip install 'fdattack[sweeps]'"
            ) from None
    return sweeps


def load_sweep(path: Path) -> dict:
    """Read and schema-check a sweep file (``sweeps.schema_violations_from_proposed_config``).

    Raises:
        ConfigError: the file cannot be read as YAML (:func:`~fdattack.config.yaml_files.read_yaml_file`) or is not a valid
            W&B sweep.
    """
    config = read_yaml_file(path, "sweep file")
    violations = _sweeps().schema_violations_from_proposed_config(config) if isinstance(config, dict) else ["not a mapping"]
    if violations:
        raise ConfigError(f"{path}: not a valid W&B sweep: {quote(str(violations[0]))}")
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


def _candidates(config: dict, stored: DictConfig) -> list[dict[str, Any]]:
    """The parameter values an earlier trial may have run with: of the points that combine each key's listed ``values``
    (or ``value``; a distribution's stored value), those that agree most with its stored values. A group name
    (``protocol: {values: [fedmd, dsfl]}``) or an interpolation reads back from ``config.yaml`` only as what it composed to."""
    stored_values = {key: _select(stored, key) for key in config["parameters"]}
    choices = []
    for key, spec in config["parameters"].items():
        listed = [spec["value"]] if "value" in spec else spec.get("values")
        choices.append(listed or [stored_values[key]])
    points = [dict(zip(config["parameters"], combo)) for combo in itertools.product(*choices)]
    agreement = [sum(point[key] == stored_values[key] for key in point) for point in points]
    return [point for point, agreed in zip(points, agreement) if agreed == max(agreement)]


def earlier_params(plan: SweepPlan, stored: DictConfig, old: dict, folder: Path) -> dict[str, Any]:
    """The parameter values with which this call composes the earlier trial in ``folder`` into its stored config
    (``stored``; ``old``, its :func:`_trial_tree`).

    Raises:
        ConfigError: none does (another experiment file, fixed override or extra override); names the first differing key,
            its stored value and this call's.
    """
    closest, error = None, None
    for params in _candidates(plan.config, stored):
        try:
            new = result_tree(plan.compose(params, folder))
        except ConfigError as err:  # parameter values that no longer compose are not this trial's
            error = error or err
            continue
        key = first_difference(old, new)
        if key is None:
            return params
        closest = closest or (key, new)
    remedy = "choose another --root or remove the old trials"
    if closest is None:
        raise ConfigError(f"{folder} was run with parameter values that this call cannot compose ({error}): {remedy}")
    key, new = closest
    raise ConfigError(f"{folder} was run with {key}={shown(old, key)}, this call gives {shown(new, key)}: {remedy}")


def earlier_trials(plan: SweepPlan) -> list[Trial]:
    """The trials that an earlier ``fdattack sweep`` left in the sweep's folder (``done`` or ``incomplete``), by folder name.

    Raises:
        ConfigError: a trial of another config (:func:`earlier_params`), before any trial runs.
    """
    trials = []
    for trial_dir in sorted(plan.folder.glob(f"{TRIAL_PREFIX}*")):
        try:
            stored = OmegaConf.load(trial_dir / "config.yaml")
        except Exception as err:  # an unreadable folder is not a finished trial: say so and leave it alone
            log.warning("%s: not read as an earlier trial (%s)", trial_dir, str(err).splitlines()[0] if str(err) else type(err).__name__)
            continue
        params = earlier_params(plan, stored, result_tree(stored), trial_dir)
        if not (trial_dir / "metrics.json").is_file():
            trials.append(Trial(trial_dir, params, "incomplete"))
            continue
        try:
            metrics = read_result(trial_dir, plan.compose(params, trial_dir))
        except DataError as err:  # a damaged metrics.json: not a finished trial
            log.warning("%s: not read as an earlier trial (%s)", trial_dir, err)
            continue
        trials.append(Trial(trial_dir, params, "done", {k: v for k, v in metrics.items() if not math.isnan(v)}))
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


def check_trial_config(sweeps: ModuleType, plan: SweepPlan) -> DictConfig | None:
    """Compose the first trial's config before any trial runs, so a misspelt parameter or override, or an experiment file
    not found from here, stops the sweep with one line instead of failing every trial.

    Returns:
        The first trial's config; None when the engine proposes no trial.
    """
    proposal = sweeps.next_run(plan.config, [])
    if proposal is None:
        return None
    return plan.compose({key: proposal.config[key]["value"] for key in plan.config["parameters"]}, plan.folder / "trial_check")


def check_metric(plan: SweepPlan, cfg: DictConfig) -> None:
    """The sweep's metric must be one that fdattack records (:data:`METRIC_PREFIXES`), and an ``attack/``, ``adversary/``
    or ``defense/`` metric must name an attack or defense of the first trial's ``cfg`` (unless the sweep varies them)."""
    metric = plan.metric
    if metric is None:
        return
    prefix, _, rest = metric.partition("/")
    if prefix not in METRIC_PREFIXES or not rest:
        begins = ", ".join(f"{p}/" for p in METRIC_PREFIXES)
        raise ConfigError(f"{plan.path}: metric.name {metric!r} is not a metric that a trial records (they begin with {begins})")
    group = {"attack": "attacks", "adversary": "attacks", "defense": "defenses"}.get(prefix)
    varied = {key for key, spec in plan.config["parameters"].items() if "value" not in spec}
    if group is None or group in varied:
        return
    name, running = rest.partition("/")[0], [str(n) for n in cfg[group]]
    if name not in running:
        raise ConfigError(
            f"{plan.path}: metric.name {metric!r} names {group[:-1]} {name!r}, which the trials do not run "
            f"({group}: [{', '.join(running)}])"
        )


def check_metric_recorded(plan: SweepPlan, trials: list[Trial]) -> None:
    """The first trial with metrics (an earlier call's, else this call's first to finish) must record the sweep's metric,
    or every trial would show ``nan`` for it.

    Raises:
        ConfigError: naming the metric and the closest keys that trial recorded.
    """
    first = next((t for t in trials if t.state in ("done", "finished")), None)
    if plan.metric is None or first is None or plan.metric in first.metrics:
        return
    close = difflib.get_close_matches(plan.metric, list(first.metrics), n=3, cutoff=0.4)
    raise ConfigError(
        f"{plan.path}: {first.folder} recorded no metric {plan.metric!r} (metric.name); "
        f"{'closest: ' + ', '.join(close) if close else 'none close to it'}; correct metric.name and run the sweep again"
    )


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
    from fdattack.experiment import run

    plan = SweepPlan(path, load_sweep(path), root, extra)
    config = plan.config
    count = check_before_trials(path, config, count)
    first = check_trial_config(sweeps, plan)
    if first is not None:
        check_metric(plan, first)
    earlier = earlier_trials(plan)
    trials = [trial for trial in earlier if trial.state == "done"]
    check_metric_recorded(plan, trials)
    finished = [_finished_run(sweeps, trial) for trial in trials]
    while count is None or len(trials) < count:
        proposal = sweeps.next_run(config, finished)
        if proposal is None:
            break
        params = {key: proposal.config[key]["value"] for key in config["parameters"]}  # in the sweep file's order
        cut_short = next((t for t in earlier if t.state == "incomplete" and t.params == params and _has_checkpoint(t.folder)), None)
        out = cut_short.folder if cut_short is not None else _next_folder(plan.folder)
        trial = Trial(out, params, "finished")
        try:
            trial.metrics = dict(run(plan.compose(params, out, resume=cut_short is not None)))
        except FdattackError as err:
            log.error("trial %s (%s) failed: %s", out.name, trial_label(params), err)
            trial.state = "failed"
        except Exception:  # a bug or a broken environment in one trial: keep its traceback, go on with the sweep
            log.exception("trial %s (%s) failed", out.name, trial_label(params))
            trial.state = "failed"
        trials.append(trial)
        finished.append(_finished_run(sweeps, trial))
        check_metric_recorded(plan, trials)
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
