"""Faults around a run that are not in its config (issue 30): the environment (a multi-node run without a launcher, a
``WANDB_MODE`` W&B refuses), a full disk mid-run, and SIGTERM before the rounds start. Each gives one line, never a
traceback or a hang, and loses nothing recorded before it."""

from __future__ import annotations

import errno
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fdattack.cli import main
from fdattack.errors import raise_terminated, stop_if_terminated
from fdattack.tracking import Progress
from fdattack.tracking.run_dir import RunDirectory
from tests.conftest import REPO, error_of, tiny

#: (environment variables, overrides, text the one error line names)
ENVIRONMENT_FAULTS = {
    "num_nodes=2, no launcher": ({}, ["trainer.num_nodes=2", "trainer.strategy=ddp"], "trainer.num_nodes=2 needs a launcher"),
    "WANDB_MODE=garbage, mode auto": ({"WANDB_MODE": "garbage"}, ["logger.wandb.mode=auto"], "WANDB_MODE='garbage' is not a W&B mode"),
    "WANDB_MODE=Offline, mode offline": (
        {"WANDB_MODE": "Offline"},
        ["logger.wandb.mode=offline"],
        "WANDB_MODE='Offline' is not a W&B mode",
    ),
}


@pytest.mark.parametrize("case", list(ENVIRONMENT_FAULTS))
def test_an_environment_that_cannot_work_is_one_line_before_anything_is_written(
    case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before issue 30 a two-node run without a launcher waited forever, and W&B failed on a bad WANDB_MODE with a
    traceback (or a message blaming credentials)."""
    environment, overrides, named = ENVIRONMENT_FAULTS[case]
    for variable in ("SLURM_NTASKS", "SLURM_JOB_NAME", "TORCHELASTIC_RUN_ID", "LOCAL_RANK", "NODE_RANK", "MASTER_ADDR", "LSB_JOBID"):
        monkeypatch.delenv(variable, raising=False)
    for variable, value in environment.items():
        monkeypatch.setenv(variable, value)
    args = [token for token in tiny(tmp_path) if not token.startswith("logger.wandb.mode")]
    assert main(["run", *args, *overrides]) == 2
    assert named in error_of(capsys.readouterr().err)
    assert not (tmp_path / "run").exists()


def test_a_full_disk_mid_run_is_one_line_and_the_run_resumes_from_what_was_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before issue 30 ENOSPC mid-run gave three chained tracebacks. Now one line (exit 1); rounds.jsonl and the
    checkpoint of round 1 stay, and resume=true finishes the run."""
    append_round = RunDirectory.append_round

    def disk_full_in_round_2(self: RunDirectory, record: dict) -> None:
        if record["round"] == 2:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self.rounds_path))
        append_round(self, record)

    monkeypatch.setattr(RunDirectory, "append_round", disk_full_in_round_2)
    assert main(["run", *tiny(tmp_path)]) == 1
    line = error_of(capsys.readouterr().err)
    assert "no space left on the device writing" in line and "rounds.jsonl" in line
    kept = f"what {tmp_path / 'run'} recorded up to its last checkpoint (round 1) is kept"
    assert line.endswith(f"{kept}: free some space, then resume=true continues it")
    run = tmp_path / "run"
    assert [json.loads(x)["round"] for x in (run / "rounds.jsonl").read_text().splitlines()] == [0, 1]
    assert (run / "checkpoints" / "round_0001.pt").is_file()
    monkeypatch.setattr(RunDirectory, "append_round", append_round)
    assert main(["run", *tiny(tmp_path), "resume=true"]) == 0
    assert [json.loads(x)["round"] for x in (run / "rounds.jsonl").read_text().splitlines()] == [0, 1, 2]


def test_a_full_disk_before_any_checkpoint_does_not_advise_resuming(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def disk_full(self: RunDirectory, record: dict) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self.rounds_path))

    monkeypatch.setattr(RunDirectory, "append_round", disk_full)
    assert main(["run", *tiny(tmp_path)]) == 1
    line = error_of(capsys.readouterr().err)
    assert f"the run in {tmp_path / 'run'} wrote no checkpoint" in line
    assert line.endswith("free some space and run it again (resume=true has nothing to continue)")


def test_sigterm_while_the_run_is_set_up_is_recorded_and_said(tmp_path: Path) -> None:
    """Before issue 30 SIGTERM while the data and the evaluation classifier were built exited 143 without a word or
    exit.json. Now it is recorded like a stop mid-round."""
    run = tmp_path / "run"
    # the evaluation classifier of PLI's reconstructions trains while the run is built: for long enough to be stopped
    args = [*tiny(tmp_path, "attacks=[pli]"), "evaluation.epochs=100000", "evaluation.classifier=mlp"]
    proc = subprocess.Popen([sys.executable, "-m", "fdattack", "run", *args], cwd=REPO, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    for line in proc.stderr:
        if re.sub(r"^\[\d{2}:\d{2}:\d{2}\] ", "", line).startswith("training the evaluation classifier"):  # stamped: no terminal
            break
    else:
        pytest.fail(f"the run ended (exit {proc.wait()}) before its evaluation classifier trained")
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    stderr = proc.stderr.read()
    assert proc.wait(timeout=120) == 143
    assert "terminated by SIGTERM before round 0 finished" in stderr and "Traceback" not in stderr
    assert json.loads((run / "exit.json").read_text())["last_round"] is None
    assert not (run / "rounds.jsonl").exists()


def test_sigterm_before_the_run_directory_exists_is_said(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A stop while the config is composed has no run directory to record it in: one line and exit status 143."""
    import fdattack.config

    monkeypatch.setattr(fdattack.config, "compose", lambda *args: os.kill(os.getpid(), signal.SIGTERM))
    previous = signal.getsignal(signal.SIGTERM)
    assert main(["run"]) == 143
    assert capsys.readouterr().err.strip() == "fdattack: terminated by SIGTERM"
    assert signal.getsignal(signal.SIGTERM) is previous


class _DropsItsException:
    """Receives the signal in ``__del__``, where Python prints the handler's exception as "Exception ignored" and drops it."""

    def __del__(self) -> None:
        raise_terminated(signal.SIGTERM, None)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the dropped exception, as meant
def test_a_sigterm_whose_exception_python_dropped_still_stops_the_run_at_the_next_phase(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A SIGTERM that arrived in a weakref callback went unnoticed: the run went on to its last round (seen in a clean-clone
    run under load). The signal is kept and raised again before the next phase; the stop is recorded as any other."""
    phase = Progress.phase
    signalled = []

    def phase_receiving_the_signal(self: Progress, round_index: int, name: str) -> None:
        if round_index == 1 and not signalled:
            signalled.append(name)
            _DropsItsException()
        phase(self, round_index, name)

    monkeypatch.setattr(Progress, "phase", phase_receiving_the_signal)
    assert main(["run", *tiny(tmp_path)]) == 143
    assert "terminated by SIGTERM after round 0" in capsys.readouterr().err
    run = tmp_path / "run"
    assert json.loads((run / "exit.json").read_text())["last_round"] == 0
    assert [json.loads(x)["round"] for x in (run / "rounds.jsonl").read_text().splitlines()] == [0]
    stop_if_terminated()  # raised once, then forgotten
