"""The run directory: one run at a time (a lock), stranded runs restart in place, checks before anything is built."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from fdattack.cli import main
from fdattack.config import compose
from fdattack.data.federated import FederatedData
from fdattack.errors import ConfigError
from fdattack.experiment import Experiment
from fdattack.tracking.run_dir import LOCK_NAME
from tests.conftest import error_of, own_messages, tiny

FAST = ("evaluation.confidence_gap.enabled=false", "protocol.transfer_public_epochs=1", "protocol.transfer_private_epochs=1")

#: another process holding the run directory's lock until it is killed
HOLDER = (
    "import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR); fcntl.flock(fd, fcntl.LOCK_EX); "
    "print('held', flush=True); sys.stdin.read()"
)


def _snapshot(folder: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(folder)): p.read_bytes() if p.is_file() else None for p in sorted(folder.rglob("*"))}


def _error_line(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    code = main(argv)
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    err = error_of(err)
    return err


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished tiny run (2 rounds, no attacks), copied by the tests that need one."""
    base = tmp_path_factory.mktemp("finished")
    assert main(["run", *tiny(base, *FAST)]) == 0
    return base / "run"


def test_a_second_run_on_a_locked_directory_fails_at_once_and_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    first = Experiment(compose(None, tiny(tmp_path, *FAST)))  # built: it holds the lock from now until its run ends
    for resume in ("false", "true"):
        err = _error_line(capsys, ["run", *tiny(tmp_path, *FAST), f"resume={resume}"])
        assert str(out) in err and "another fdattack run" in err
    assert [p.name for p in out.iterdir()] == [LOCK_NAME]
    first.run()
    before = _snapshot(out)

    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(out / LOCK_NAME)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "held"  # type: ignore[union-attr]
        err = _error_line(capsys, ["run", *tiny(tmp_path, *FAST), "resume=true"])
        assert str(out) in err and "another fdattack run" in err
        assert _snapshot(out) == before  # rounds.jsonl, checkpoints, config: untouched
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert main(["run", *tiny(tmp_path, *FAST), "resume=true"]) == 0  # a killed holder leaves no stale lock


@pytest.mark.parametrize("resume", ["false", "true"])
def test_a_run_stopped_before_its_first_checkpoint_restarts_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, resume: str
) -> None:
    out = tmp_path / "run"

    def failed_start(*args: object, **kwargs: object) -> None:
        raise ConfigError("logger.wandb.mode=online: W&B could not start")

    with monkeypatch.context() as patch:
        patch.setattr("fdattack.experiment.WandbRun.start", failed_start)
        assert main(["run", *tiny(tmp_path, *FAST)]) == 2
    assert (out / "config.yaml").is_file() and not list((out / "checkpoints").iterdir())  # stranded: nothing to resume from
    assert main(["run", *tiny(tmp_path, *FAST), f"resume={resume}"]) == 0
    assert any("starting from scratch" in m for m in own_messages(caplog))
    rounds = [json.loads(line)["round"] for line in (out / "rounds.jsonl").read_text().splitlines()]
    assert rounds == [0, 1, 2] and (out / "metrics.json").is_file()


def test_a_fresh_run_warns_of_nothing_and_keeps_what_its_build_wrote(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Issue 58: the build trains the evaluation classifier into ``artifacts/`` before the layout is made; the layout then
    took the fresh run for a stranded one, warned "clearing its files" and deleted the classifier a resume reads back."""
    overrides = ["attacks=[public_mean]", "protocol.rounds=1", "evaluation.epochs=1", "evaluation.confidence_gap.enabled=false"]
    assert main(["run", *tiny(tmp_path, *overrides)]) == 0
    assert not [m for m in own_messages(caplog) if "starting from scratch" in m or "clearing" in m]
    assert list((tmp_path / "run" / "artifacts").glob("identity_classifier_*.pt"))


def test_files_that_are_not_fdattacks_are_never_cleared(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    (out / "images").mkdir(parents=True)
    (out / LOCK_NAME).write_text("")
    (out / "config.yaml").write_text("name: earlier\n")
    (out / "notes.txt").write_text("mine")
    before = _snapshot(out)
    assert "notes.txt" in _error_line(capsys, ["run", *tiny(tmp_path, *FAST)])
    assert "no checkpoint to resume from" in _error_line(capsys, ["run", *tiny(tmp_path, *FAST), "resume=true"])
    assert _snapshot(out) == before


@pytest.mark.parametrize(
    ("case", "extra", "named"),
    [
        ("finished", ["resume=true", "seed=7"], "seed (stored "),
        ("finished", [], "resume=true"),
        ("foreign", [], "notes.txt"),
        ("fresh", ["logger.wandb.mode=online"], "logger.wandb.mode"),
        ("fresh", ["model.clients=[pli_cnn,nope]"], "model.clients[1]='nope'"),
        ("fresh", ["attacks=[tbi]", "evaluation.classifier=nope"], "evaluation.classifier='nope'"),
        ("under_a_file", [], "cannot be used"),
    ],
)
def test_checks_run_before_anything_is_built(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    finished_run: Path,
    case: str,
    extra: list[str],
    named: str,
) -> None:
    out = tmp_path / "run"
    if case == "finished":
        shutil.copytree(finished_run, out)
    elif case == "foreign":
        out.mkdir()
        (out / "notes.txt").write_text("mine")
    elif case == "under_a_file":
        (tmp_path / "a_file").write_text("")
        extra = [f"output_dir={tmp_path / 'a_file' / 'run'}"]
    before = _snapshot(out) if out.exists() else None

    def built(*args: object) -> None:
        raise AssertionError("the data was built before the checks")

    monkeypatch.setattr(FederatedData, "setup", built)
    err = _error_line(capsys, ["run", *tiny(tmp_path, *FAST), *extra])
    assert named in err
    assert (_snapshot(out) if out.exists() else None) == before  # nothing written, a new folder not left behind


def test_an_exit_record_is_fdattacks_own_and_is_removed_when_the_run_continues(tmp_path: Path) -> None:
    """A run stopped by SIGTERM before its first checkpoint restarts in place; a resumed run drops the stale record once
    its checkpoint is restored (a refused resume keeps it)."""
    from fdattack.tracking.run_dir import RunDirectory

    stranded = RunDirectory(tmp_path / "stranded")
    stranded.path.mkdir()
    for name in (LOCK_NAME, "config.yaml", "exit.json"):
        (stranded.path / name).write_text("{}")
    assert stranded.check(resume=False) == "restart"
    stranded.prepare(resume=False)
    assert not (stranded.path / "exit.json").exists()

    stopped = RunDirectory(tmp_path / "stopped")
    stopped.checkpoints.save(1, {"round": 1})
    (stopped.path / "exit.json").write_text('{"signal": "SIGTERM"}')
    assert stopped.check(resume=True) == "resume"
    stopped.prepare(resume=True)
    assert (stopped.path / "exit.json").exists()
    stopped.forget_stop()
    assert not (stopped.path / "exit.json").exists() and stopped.checkpoints.latest() is not None
