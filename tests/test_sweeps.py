"""Every sweep file is a valid W&B sweep whose keys exist in the composed config; a local sweep runs."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from fdattack.cli import main
from fdattack.config import compose
from fdattack.sweep import command_tokens, load_sweep
from tests.conftest import REPO

SWEEPS = sorted((REPO / "sweeps").glob("*.yaml"))


@pytest.mark.parametrize("path", SWEEPS, ids=[p.stem for p in SWEEPS])
def test_sweep_file_is_valid_and_maps_onto_config_keys(path: Path) -> None:
    config = load_sweep(path)
    assert config["command"][-1] == "${args_no_hyphens}" and "${program}" in config["command"] and config["program"] == "fdattack"
    experiment, fixed = command_tokens(config)
    assert experiment is not None and (REPO / experiment).is_file()
    cfg = compose(REPO / experiment, fixed)
    for key, spec in config["parameters"].items():
        assert OmegaConf.select(cfg, key, default="__missing__") != "__missing__", key
        for value in spec.get("values", []):
            compose(REPO / experiment, [*fixed, f"{key}={value}"])  # every grid point is a valid config
    assert config["metric"]["name"].startswith("attack/") and config["metric"]["name"].split("/")[1] in cfg.attacks


def test_invalid_sweep_file_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("method: sideways\nparameters: {attack.pli.tau: {values: [1]}}\n")
    assert main(["sweep", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert str(bad) in err and len(err.splitlines()) == 1


def test_two_point_local_sweep_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    code = main(["sweep", "sweeps/pli_tau_gamma.yaml", "--count", "2", "--root", str(tmp_path), "logger.wandb.mode=disabled",
                 "logger.progress=never", "protocol.rounds=1", "protocol.num_clients=2", "attacks=[pli]"])
    assert code == 0
    out = capsys.readouterr().out
    assert "trial_000" in out and "trial_001" in out and "attack/pli/accuracy" in out
    trials = sorted((tmp_path / "pli_tau_gamma").iterdir())
    assert [t.name for t in trials] == ["trial_000", "trial_001"]
    taus = [OmegaConf.load(t / "config.yaml").attack.pli.tau for t in trials]
    assert taus == [0.3, 1.0] and all((t / "metrics.json").is_file() for t in trials)
