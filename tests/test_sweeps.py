"""Every sweep file is a valid W&B sweep whose keys exist in the composed config; a local sweep runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from fdattack.cli import main
from fdattack.config import compose
from fdattack.config.packaged import PACKAGE_CONF_DIR, PACKAGE_SWEEPS_DIR, experiment_file
from fdattack.report.runs import short_names
from fdattack.sweep import command_tokens, format_value, load_sweep, trial_label
from fdattack.tracking.run_dir import RunDirectory
from tests.conftest import REPO, SHARED_DATA, error_of

SWEEPS = sorted(PACKAGE_SWEEPS_DIR.glob("*.yaml"))


@pytest.mark.parametrize("path", SWEEPS, ids=[p.stem for p in SWEEPS])
def test_sweep_file_is_valid_and_maps_onto_config_keys(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """From any folder: the command names its experiment, found in the package's ``conf/experiment``."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FDATTACK_DATA", str(SHARED_DATA))
    config = load_sweep(path)
    assert config["project"] == "fdattack"  # `wandb sweep` and `fdattack sweep` log the trials there
    assert config["command"][-1] == "${args_no_hyphens}" and "${program}" in config["command"] and config["program"] == "fdattack"
    experiment, fixed = command_tokens(config)
    assert experiment is not None and experiment_file(experiment) == PACKAGE_CONF_DIR / "experiment" / f"{experiment}.yaml"
    cfg = compose(experiment, fixed)
    constants = [f"{key}={spec['value']}" for key, spec in config["parameters"].items() if "value" in spec]
    for key, spec in config["parameters"].items():
        assert OmegaConf.select(cfg, key, default="__missing__") != "__missing__", key
        for value in spec.get("values", []):
            # every grid point is a valid config, with the constants (interpolations included) resolved against it
            point = compose(experiment, [*fixed, *constants, f"{key}={value}"])
            OmegaConf.to_container(point, resolve=True)
    metric = config["metric"]["name"]
    if metric.startswith("protocol/"):  # the protocol's utility, measured every round
        assert metric in {"protocol/client_acc_mean", "protocol/client_acc_min", "protocol/client_acc_max", "protocol/server_acc"}, metric
    else:
        assert metric.startswith("attack/") and metric.split("/")[1] in cfg.attacks, metric


def test_invalid_sweep_file_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("method: sideways\nparameters: {attack.pli.tau: {values: [1]}}\n")
    assert main(["sweep", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert str(bad) in err and len(err.splitlines()) == 1


def test_two_point_local_sweep_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    sweep = tmp_path / "pli_tau_gamma.yaml"  # the shipped file with the protocol's metric: attacks=[] keeps the trials fast
    sweep.write_text((REPO / "sweeps" / "pli_tau_gamma.yaml").read_text().replace("attack/pli/accuracy", "protocol/client_acc_mean"))
    code = main(
        [
            "sweep",
            str(sweep),
            "--count",
            "2",
            "--root",
            str(tmp_path / "sweeps"),
            "logger.wandb.mode=disabled",
            "logger.progress=never",
            "protocol.rounds=1",
            "protocol.num_clients=2",
            "attacks=[]",
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    assert "trial_000" in out and "trial_001" in out and "protocol/client_acc_mean" in out and " nan" not in out
    trials = sorted((tmp_path / "sweeps" / "pli_tau_gamma").iterdir())
    assert [t.name for t in trials] == ["trial_000", "trial_001"]
    taus = [OmegaConf.load(t / "config.yaml").attack.pli.tau for t in trials]
    assert taus == [0.3, 1.0] and all((t / "metrics.json").is_file() for t in trials)
    wandb = OmegaConf.load(trials[1] / "config.yaml").logger.wandb
    assert (wandb.project, wandb.group, wandb.job_type, wandb.name) == ("fdattack", "pli_tau_gamma", "sweep-trial", "tau=1,gamma=0")


def test_trial_names_use_the_shortest_distinct_key_tails_and_4_significant_digits() -> None:
    assert trial_label({"attack.pli.tau": 3.0, "attack.pli.gamma": 0.1}) == "tau=3,gamma=0.1"
    assert short_names(["attack.pli.lr", "attack.tbi.lr", "seed"]) == {"attack.pli.lr": "pli.lr", "attack.tbi.lr": "tbi.lr", "seed": "seed"}
    assert [format_value(v) for v in (0.123456789, 1234567.0, 3, None, "sgd", [1, 0.5])] == [
        "0.1235",
        "1.235e+06",
        "3",
        "nan",
        "sgd",
        "[1,0.5]",
    ]


SWEEP = """program: fdattack
project: sweep-test
method: grid
metric: {name: protocol/digest_loss, goal: minimize}
parameters:
  protocol.num_clients: {values: [2, 0]}
command: ["${env}", "${interpreter}", "-m", "${program}", run, "${args_no_hyphens}"]
"""
#: Overrides that make a trial of SWEEP (or of the default experiment) take seconds, QUIET leaving its rounds alone.
QUIET = ["logger.wandb.mode=disabled", "logger.progress=never", "attacks=[]", "evaluation.confidence_gap.enabled=false"]
FAST = [*QUIET, "protocol.rounds=1"]


def _table(out: str) -> list[list[str]]:
    """The cells of the trials' table that ends ``fdattack sweep``'s output (the trials print their own lines first)."""
    return [line.split() for line in out[out.index("trial  ") :].splitlines() if not line.startswith("fdattack:")]


def test_sweep_exits_1_on_a_failed_trial_then_resumes_and_skips_finished_ones(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sweep = tmp_path / "clients.yaml"
    sweep.write_text(SWEEP)
    root = tmp_path / "sweeps"
    args = ["sweep", str(sweep), "--root", str(root), *FAST]
    trial = root / "clients" / "trial_000"

    assert main(args) == 1  # num_clients=0 fails
    out, err = capsys.readouterr()
    assert "fdattack: 1 of 2 trials failed" in err
    loss = json.loads((trial / "metrics.json").read_text())["protocol/digest_loss"]
    assert f"{loss:.4g}" in out and repr(loss) not in out
    assert _table(out) == [
        ["trial", "state", "num_clients", "protocol/digest_loss"],
        ["trial_000", "finished", "2", f"{loss:.4g}"],
        ["trial_001", "failed", "0", "-"],
    ]
    wandb = OmegaConf.load(trial / "config.yaml").logger.wandb
    assert (wandb.project, wandb.group, wandb.job_type, wandb.name) == ("sweep-test", "clients", "sweep-trial", "num_clients=2")

    (trial / "metrics.json").unlink()  # cut short after its last checkpoint: the next call resumes it in place
    rounds = (trial / "rounds.jsonl").read_text()
    assert main(args) == 1
    assert (
        json.loads((trial / "metrics.json").read_text())["protocol/digest_loss"] == loss and (trial / "rounds.jsonl").read_text() == rounds
    )
    capsys.readouterr()

    finished_at = (trial / "metrics.json").stat().st_mtime_ns
    assert main(args) == 1
    out = capsys.readouterr().out
    assert (trial / "metrics.json").stat().st_mtime_ns == finished_at  # not run again
    assert _table(out)[1] == ["trial_000", "done", "2", f"{loss:.4g}"] and "fdattack: 1 trial(s) finished by an earlier call" in out
    assert sorted(p.name for p in (root / "clients").iterdir()) == ["trial_000"]


LAUGHS = "".join(f"{c}: &{c} [{', '.join([f'*{p}'] * 9)}]\n" for p, c in zip("abcde", "bcdef"))  # 9**6 values in 300 bytes
BAD_SWEEPS = [  # (sweep file body, extra command-line tokens, what the one line must name)
    ("method: random\nparameters: {attack.pli.tau: {min: 0.5, max: 5.0}}\n", [], "method: random never ends on its own; give --count N"),
    ("method: bayes\nparameters: {attack.pli.tau: {min: 0.5, max: 5.0}}\n", ["--count", "2"], "method: bayes needs a metric"),
    ("method: grid\nparameters: {attack.pli.tau: {min: 0.5, max: 5.0}}\n", [], "parameters.attack.pli.tau: a grid takes listed values"),
    ("method: grid\nparameters: {attack.pli.taux: {values: [1.0]}}\n", [], "unknown config key 'attack.pli.taux'"),
    ("method: grid\nparameters: {attack.pli.tau: {values: [1.0]}}\n", ["protocol.roundz=2"], "unknown config key 'protocol.roundz'"),
    (
        "method: grid\nparameters: {attack.pli.tau: {values: [1.0]}}\n"
        "command: [fdattack, run, conf/experiment/nope.yaml, '${args_no_hyphens}']\n",
        [],
        "experiment file not found: conf/experiment/nope.yaml",
    ),
    (  # a misspelt metric showed nan for every trial
        "method: grid\nmetric: {name: protocl/client_acc_mean}\nparameters: {protocol.num_clients: {values: [2]}}\n",
        FAST,
        "metric.name 'protocl/client_acc_mean' is not a metric that a trial records (they begin with protocol/, attack/",
    ),
    (
        "method: grid\nmetric: {name: attack/pli/accuracy}\nparameters: {protocol.num_clients: {values: [2]}}\n",
        FAST,
        "metric.name 'attack/pli/accuracy' names attack 'pli', which the trials do not run (attacks: [])",
    ),
    (  # printed 68 MB: the schema violation quoted the expanded aliases
        f"a: &a [x, x, x, x, x, x, x, x, x]\n{LAUGHS}method: *f\n",
        [],
        "more than 10000 values once its YAML aliases (*name) are written out",
    ),
    ("method: grid\nparameters: &p {seed: {values: [*p]}}\n", [], "more than 10000 values once its YAML aliases"),
    ("method: grid\nparameters: " + "[" * 1000 + "]" * 1000 + "\n", [], "nested too deeply to be a sweep file"),  # a RecursionError
    ("method: " + "x" * 5000 + "\nparameters: {seed: {values: [0]}}\n", [], "not a valid W&B sweep: 'xxx"),  # a 5,000-character line
    (b"\xff\xfe method: grid", [], "not UTF-8 text (byte 0xff at offset 0); save it as UTF-8"),  # a UnicodeDecodeError
]


@pytest.mark.parametrize(("body", "extra", "named"), BAD_SWEEPS, ids=[named[:50] for *_, named in BAD_SWEEPS])
def test_a_sweep_that_cannot_work_stops_before_any_trial_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, body: str | bytes, extra: list[str], named: str
) -> None:
    """Issue 30: a random sweep without --count never stopped; a misspelt parameter or override, or an experiment not
    found from here, failed every trial with the same error (exit 1); a grid over a distribution or bayes without a
    metric raised a traceback; a misspelt metric showed nan; a file of YAML aliases printed 68 MB, one not UTF-8 a
    traceback. Each now stops before the first trial, with one short line and exit 2."""
    monkeypatch.chdir(REPO)
    sweep = tmp_path / "bad.yaml"
    sweep.write_bytes(body if isinstance(body, bytes) else body.encode())
    assert main(["sweep", str(sweep), "--root", str(tmp_path / "sweeps"), *extra]) == 2
    line = error_of(capsys.readouterr().err)
    assert named in line and len(line) < 600
    assert not (tmp_path / "sweeps").exists()


@pytest.mark.parametrize("kind", ["folder", "unreadable"])
def test_a_sweep_file_that_is_a_folder_or_unreadable_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """A folder was reported as not found, a file that cannot be read raised a traceback."""
    sweep = tmp_path / "bad.yaml"
    if kind == "folder":
        sweep.mkdir()
    else:  # chmod 000 does not stop root, who may run the tests
        sweep.write_text(SWEEP)
        opened = Path.open

        def refused(self: Path, *args: Any, **kwargs: Any) -> Any:
            if self == sweep:
                raise PermissionError(13, "Permission denied", str(self))
            return opened(self, *args, **kwargs)

        monkeypatch.setattr(Path, "open", refused)
    assert main(["sweep", str(sweep), "--root", str(tmp_path / "sweeps")]) == 2
    named = "is a folder; give the sweep file itself" if kind == "folder" else "cannot be read: Permission denied"
    assert f"sweep file {sweep} {named}" in error_of(capsys.readouterr().err)


def _earlier_trial(folder: Path, overrides: list[str], metrics: dict[str, float]) -> None:
    """A finished trial as an earlier ``fdattack sweep`` leaves it (config.yaml and metrics.json), without running it."""
    cfg = compose(None, [*overrides, f"output_dir={folder}"])
    folder.mkdir(parents=True)
    RunDirectory(folder).write_config(cfg)
    (folder / "metrics.json").write_text(json.dumps(metrics))


ONE_POINT = """method: grid
project: {project}
metric: {{name: protocol/digest_loss, goal: minimize}}
parameters:
  protocol.num_clients: {{values: [2]}}
command: [fdattack, run, {fixed}, "${{args_no_hyphens}}"]
"""
RERUNS = [  # (the sweep command's fixed override, this call's extra overrides, what the one line must name; None: the trial is done)
    ("protocol.rounds=2", [], "trial_000 was run with protocol.rounds=1, this call gives 2: choose another --root or remove the old"),
    ("protocol.rounds=1", ["protocol.rounds=2"], "trial_000 was run with protocol.rounds=1, this call gives 2"),
    ("protocol.rounds=1", ["seed=7"], "trial_000 was run with seed=42, this call gives 7"),
    ("protocol.rounds=1", ["logger.progress=always", "logger.level=DEBUG"], None),  # how a run reports: not its results
]


@pytest.mark.parametrize(("fixed", "extra", "named"), RERUNS, ids=[" ".join([fixed, *extra]) for fixed, extra, _ in RERUNS])
def test_an_earlier_trial_is_done_only_under_the_same_fixed_overrides(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], fixed: str, extra: list[str], named: str | None
) -> None:
    """Trials matched by parameter values only: a sweep run again with another fixed override (in its command or on the
    command line) showed the old trials as done. A trial of another config now stops the sweep before any trial; one
    that differs only in the W&B identity the sweep sets (another project) or in how a run reports is done."""
    trial = tmp_path / "sweeps" / "one" / "trial_000"
    _earlier_trial(trial, ["protocol.num_clients=2", *FAST], {"protocol/digest_loss": 0.5})
    sweep = tmp_path / "one.yaml"
    sweep.write_text(ONE_POINT.format(project="another-project", fixed=fixed))
    code = main(["sweep", str(sweep), "--root", str(tmp_path / "sweeps"), *QUIET, *extra])
    out, err = capsys.readouterr()
    if named is None:
        assert code == 0 and _table(out)[1] == ["trial_000", "done", "2", "0.5"]
    else:
        assert code == 2 and named in error_of(err)
    assert sorted(p.name for p in trial.parent.iterdir()) == ["trial_000"]


def test_an_earlier_trial_of_a_group_and_an_interpolated_parameter_is_done(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A group name (``protocol: fedmd``) and an interpolation read back from config.yaml as what they composed to: such a
    trial was fed to the engine with values it did not know, and run again."""
    trial = tmp_path / "sweeps" / "group" / "trial_000"
    _earlier_trial(trial, ["protocol=fedmd", "attack.tbi.lr=${attack.pli.lr}", *FAST], {"protocol/digest_loss": 0.5})
    sweep = tmp_path / "group.yaml"
    sweep.write_text(
        "method: grid\nmetric: {name: protocol/digest_loss}\n"
        'parameters: {protocol: {values: [fedmd]}, attack.tbi.lr: {value: "${attack.pli.lr}"}}\n'
    )
    assert main(["sweep", str(sweep), "--root", str(tmp_path / "sweeps"), *FAST]) == 0
    assert _table(capsys.readouterr().out)[1] == ["trial_000", "done", "fedmd", "${attack.pli.lr}", "0.5"]
    assert sorted(p.name for p in trial.parent.iterdir()) == ["trial_000"]


def test_a_metric_that_the_first_trial_does_not_record_stops_the_sweep(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A misspelt metric.name showed nan for every trial of the sweep, silently. The first trial to finish now stops the
    sweep, naming the closest keys it recorded; run again, its finished trial stops it before any trial."""
    sweep = tmp_path / "clients.yaml"
    sweep.write_text(SWEEP.replace("protocol/digest_loss", "protocol/digest_los").replace("[2, 0]", "[2, 3]"))
    args = ["sweep", str(sweep), "--root", str(tmp_path / "sweeps"), *FAST]
    for _ in range(2):
        assert main(args) == 2
        line = error_of(capsys.readouterr().err)
        assert "trial_000 recorded no metric 'protocol/digest_los' (metric.name); closest: protocol/digest_loss" in line
        assert sorted(p.name for p in (tmp_path / "sweeps" / "clients").iterdir()) == ["trial_000"]
