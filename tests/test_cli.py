"""Bad input gets one line on stderr naming the key or file, exit status 2, no traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from fdattack.cli import main
from tests.conftest import SHARED_DATA, error_of, tiny


def _error_line(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    code = main(argv)
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    err = error_of(err)
    assert "Traceback" not in err
    return err


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("protocol.num_clientz=3", "protocol.num_clientz"),
        ("protocol.num_clients=abc", "protocol.num_clients"),
        ("protocol.num_clients=0", "protocol.num_clients"),
        ("data.dirichlet_alpha=-1", "data.dirichlet_alpha"),
        ("protocol.rounds=-3", "protocol.rounds"),
        ("protocol.optim.lr=0", "protocol.optim.lr"),
        ("protocol.name=fedprox", "protocol.name"),
        ("protocol.era_temperature=0.1", "protocol.era_temperature"),
        ("logger.wandb.mode=sometimes", "logger.wandb.mode"),
        ("data.split=weird", "data.split"),
        ("protocol=nope", "conf/protocol/nope.yaml"),
        ("name=../../x", "name='../../x'"),
        ("name=/tmp/elsewhere", "name='/tmp/elsewhere'"),
        ("name=runs/x", "name='runs/x'"),
    ],
)
def test_bad_override_is_one_line_naming_the_key(capsys: pytest.CaptureFixture[str], override: str, named: str) -> None:
    err = _error_line(capsys, ["run", override, "--print-config"])
    assert named in err


def test_missing_experiment_file_is_named(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    assert str(missing) in _error_line(capsys, ["run", str(missing)])


def test_experiment_that_is_not_a_mapping_is_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("- just\n- a list\n")
    assert str(bad) in _error_line(capsys, ["run", str(bad)])


def test_missing_data_folder_is_named(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    err = _error_line(capsys, ["run", "data.name=att_faces", f"data.root={tmp_path / 'no_faces'}", *tiny(tmp_path)])
    assert "data.root" in err and "no_faces" in err


def test_more_clients_than_identities(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    err = _error_line(capsys, ["run", *tiny(tmp_path), "data.num_targets=3", "protocol.num_clients=4"])
    assert "protocol.num_clients" in err


def test_non_empty_output_dir_is_refused_and_left_untouched(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    keep = run_dir / "metrics.json"
    keep.write_text('{"earlier": 1}')
    err = _error_line(capsys, ["run", *tiny(tmp_path)])
    assert str(run_dir) in err and "resume=true" in err
    assert keep.read_text() == '{"earlier": 1}'
    assert sorted(p.name for p in run_dir.iterdir()) == ["metrics.json"]


def test_help_config_documents_every_key(capsys: pytest.CaptureFixture[str]) -> None:
    from fdattack.config import help_config

    assert main(["run", "--help-config"]) == 0
    out = capsys.readouterr().out
    for key in ("protocol.num_clients", "data.dirichlet_alpha", "protocol.era_temperature", "trainer.strategy", "logger.wandb.mode"):
        assert key in out
    undocumented = [line for line in help_config().splitlines() if line.startswith("  ") and len(line.split(None, 2)) < 3]
    assert not undocumented


def test_real_process_exit_status_and_stderr(tmp_path: Path) -> None:
    """A real ``python -m fdattack`` with a config error: its exit status and its whole stderr (nothing else written there
    at import or exit). The other bad-input tests call :func:`fdattack.cli.main` in the test process, a new process
    costing about 10 s of imports (tests/test_paper_configs.py keeps one more, started outside the repository)."""
    proc = subprocess.run([sys.executable, "-m", "fdattack", "run", "protocol.num_clients=0"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == ["fdattack: error: protocol.num_clients=0 is out of range; allowed: an integer >= 1"]


@pytest.mark.skipif(not (SHARED_DATA / "att_faces").is_dir(), reason="../shared/data/att_faces is not present")
def test_corrupt_image_file_is_named(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    import shutil

    faces = tmp_path / "faces"
    for subject in ("s1", "s2", "s3", "s4"):
        shutil.copytree(SHARED_DATA / "att_faces" / subject, faces / subject)
    corrupt = faces / "s2" / "3.pgm"
    corrupt.chmod(0o644)
    corrupt.write_bytes(b"P5\n92 112\n255\n" + b"\x00" * 10)
    err = _error_line(capsys, ["run", "data.name=att_faces", f"data.root={faces}", "data.num_targets=2", *tiny(tmp_path)])
    assert str(corrupt) in err


@pytest.mark.parametrize("relative", [True, False])
def test_group_token_that_is_a_path_reads_nothing_outside_conf(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, relative: bool
) -> None:
    (tmp_path / "conf" / "data").mkdir(parents=True)
    (tmp_path / "outside.yaml").write_text("name: digits\n")  # a valid group file, but outside conf/
    monkeypatch.chdir(tmp_path)
    name = "../../outside" if relative else str(tmp_path / "outside")
    err = _error_line(capsys, ["run", f"data={name}", "--print-config"])
    assert f"data={name!r}" in err and "available: att_faces, att_faces_fedinverse, digits" in err


def test_default_name_is_derived_from_protocol_data_and_attacks(capsys: pytest.CaptureFixture[str]) -> None:
    from fdattack.assembly import default_output_dir
    from fdattack.config import compose

    cfg = compose(None, ["protocol=dsfl", "data=att_faces"])
    assert cfg.name == "dsfl_att_faces_pli-tbi-ldia"
    assert default_output_dir(cfg).parent.name == "runs" and default_output_dir(cfg).name.startswith("dsfl_att_faces_pli-tbi-ldia-")
    assert compose(None, ["protocol=cronus", "attacks=[]"]).name == "cronus_digits"
    assert compose(None, ["name=mine"]).name == "mine"
    assert compose("conf/experiment/pli_dsfl_att_faces.yaml", ["protocol=fedmd"]).name == "pli_dsfl_att_faces"  # the file's own name wins
    assert main(["run", "protocol=dsfl", "data=att_faces", "--print-config"]) == 0
    assert "name: dsfl_att_faces_pli-tbi-ldia" in capsys.readouterr().out


def test_group_token_replaces_the_experiments_default(capsys: pytest.CaptureFixture[str]) -> None:
    from fdattack.config import compose

    cfg = compose("conf/experiment/fedmd_digits.yaml", ["protocol=dsfl"])
    assert cfg.protocol.name == "dsfl" and cfg.protocol.era_temperature == 0.1  # conf/protocol/dsfl.yaml, not fedmd.yaml
    assert cfg.protocol.num_clients == 4  # the experiment's own keys still merge
    assert main(["run", "conf/experiment/fedmd_digits.yaml", "protocol=dsfl", "--print-config"]) == 0


def test_experiment_key_the_new_protocol_lacks_names_the_experiment(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    experiment = tmp_path / "fedmd_long_digest.yaml"
    experiment.write_text("defaults: {protocol: fedmd, data: digits}\nprotocol: {digest_epochs: 3}\n")
    err = _error_line(capsys, ["run", str(experiment), "protocol=dsfl", "--print-config"])
    assert str(experiment) in err and "protocol.digest_epochs" in err
