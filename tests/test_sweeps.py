"""Every sweep file is a valid W&B sweep whose keys exist in the composed config; a local sweep runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from fdattack.cli import main
from fdattack.config import compose
from fdattack.sweep import command_tokens, format_value, load_sweep, trial_label
from fdattack.tracking.report_runs import short_names
from tests.conftest import REPO, error_of

SWEEPS = sorted((REPO / "sweeps").glob("*.yaml"))


@pytest.mark.parametrize("path", SWEEPS, ids=[p.stem for p in SWEEPS])
def test_sweep_file_is_valid_and_maps_onto_config_keys(path: Path) -> None:
    config = load_sweep(path)
    assert config["project"] == "fdattack"  # `wandb sweep` and `fdattack sweep` log the trials there
    assert config["command"][-1] == "${args_no_hyphens}" and "${program}" in config["command"] and config["program"] == "fdattack"
    experiment, fixed = command_tokens(config)
    assert experiment is not None and (REPO / experiment).is_file()
    cfg = compose(REPO / experiment, fixed)
    constants = [f"{key}={spec['value']}" for key, spec in config["parameters"].items() if "value" in spec]
    for key, spec in config["parameters"].items():
        assert OmegaConf.select(cfg, key, default="__missing__") != "__missing__", key
        for value in spec.get("values", []):
            # every grid point is a valid config, with the constants (interpolations included) resolved against it
            point = compose(REPO / experiment, [*fixed, *constants, f"{key}={value}"])
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
    code = main(
        [
            "sweep",
            "sweeps/pli_tau_gamma.yaml",
            "--count",
            "2",
            "--root",
            str(tmp_path),
            "logger.wandb.mode=disabled",
            "logger.progress=never",
            "protocol.rounds=1",
            "protocol.num_clients=2",
            "attacks=[]",
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    assert "trial_000" in out and "trial_001" in out and "attack/pli/accuracy" in out
    trials = sorted((tmp_path / "pli_tau_gamma").iterdir())
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


def _table(out: str) -> list[list[str]]:
    """The cells of the trials' table that ends ``fdattack sweep``'s output (the trials print their own lines first)."""
    return [line.split() for line in out[out.index("trial  ") :].splitlines() if not line.startswith("fdattack:")]


def test_sweep_exits_1_on_a_failed_trial_then_resumes_and_skips_finished_ones(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sweep = tmp_path / "clients.yaml"
    sweep.write_text(SWEEP)
    root = tmp_path / "sweeps"
    args = [
        "sweep",
        str(sweep),
        "--root",
        str(root),
        "logger.wandb.mode=disabled",
        "logger.progress=never",
        "protocol.rounds=1",
        "attacks=[]",
        "evaluation.confidence_gap.enabled=false",
    ]
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
]


@pytest.mark.parametrize(("body", "extra", "named"), BAD_SWEEPS)
def test_a_sweep_that_cannot_work_stops_before_any_trial_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, body: str, extra: list[str], named: str
) -> None:
    """Issue 30: a random sweep without --count never stopped; a misspelt parameter or override, or an experiment not
    found from here, failed every trial with the same error (exit 1); a grid over a distribution or bayes without a
    metric raised a traceback. Each now stops before the first trial, with one line and exit 2."""
    monkeypatch.chdir(REPO)
    sweep = tmp_path / "bad.yaml"
    sweep.write_text(body)
    assert main(["sweep", str(sweep), "--root", str(tmp_path / "sweeps"), *extra]) == 2
    assert named in error_of(capsys.readouterr().err)
    assert not (tmp_path / "sweeps").exists()
