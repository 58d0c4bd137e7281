"""A run's exit record (:mod:`fdattack.tracking.exit_record`): a stop that a library turns into its own error is still
recorded as the stop, and a SIGTERM handler the caller installed (the CLI's, a matrix worker's) is kept (issue 46)."""

from __future__ import annotations

import io
import json
import signal
from pathlib import Path
from types import FrameType

import pytest
import torch

from fdattack.errors import Terminated, forget_terminated, raise_terminated
from fdattack.tracking.exit_record import exit_record
from fdattack.tracking.run_dir import RunDirectory


class SignalledOnWrite(io.BytesIO):
    """A file whose ``at``-th write receives SIGTERM (its handler runs there, in the Python callback of torch's C++ writer)."""

    def __init__(self, at: int) -> None:
        super().__init__()
        self.at, self.calls = at, 0

    def write(self, data: bytes) -> int:  # type: ignore[override]
        self.calls += 1
        if self.calls == self.at:
            raise_terminated(signal.SIGTERM, None)
        return super().write(data)


def run_dir(tmp_path: Path) -> RunDirectory:
    (tmp_path / "run").mkdir()
    return RunDirectory(tmp_path / "run")


def test_a_stop_that_torch_save_turns_into_its_own_error_is_recorded_as_the_stop(tmp_path: Path) -> None:
    """SIGTERM while ``torch.save`` wrote a checkpoint through a Python file: torch's writer swallowed the
    :class:`Terminated` and failed with "unexpected pos", and the run ended with that error, no ``exit.json`` (a matrix
    worker's simulation was then neither recorded as stopped nor reported)."""
    with pytest.raises(RuntimeError, match="unexpected pos"):  # what torch makes of it on its own
        torch.save({"w": torch.zeros(1000)}, SignalledOnWrite(2))
    forget_terminated()
    record_dir = run_dir(tmp_path)
    with pytest.raises(Terminated) as stopped, exit_record(record_dir):
        torch.save({"w": torch.zeros(1000)}, SignalledOnWrite(2))
    assert stopped.value.signal_name == "SIGTERM" and stopped.value.recorded
    assert isinstance(stopped.value.__cause__, RuntimeError)
    record = json.loads((record_dir.path / "exit.json").read_text())
    assert (record["signal"], record["exit_code"], record["last_round"]) == ("SIGTERM", 143, None)


def test_a_stop_advises_resume_only_where_a_checkpoint_is(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Issue 57: a run stopped before its first checkpoint was told that resume=true continues it."""
    record_dir = run_dir(tmp_path)
    with pytest.raises(Terminated), exit_record(record_dir):
        raise_terminated(signal.SIGTERM, None)
    assert caplog.records[-1].getMessage().endswith("it wrote no checkpoint: run it again (resume=true has nothing to continue)")
    record_dir.checkpoints.save(1, {"round": 1})
    forget_terminated()
    with pytest.raises(Terminated), exit_record(record_dir):
        raise_terminated(signal.SIGTERM, None)
    forget_terminated()
    assert caplog.records[-1].getMessage().endswith("resume=true continues from its last checkpoint (round 1)")


def test_an_error_with_no_stop_pending_stays_that_error(tmp_path: Path) -> None:
    record_dir = run_dir(tmp_path)
    with pytest.raises(RuntimeError, match="unexpected pos"), exit_record(record_dir):
        raise RuntimeError("unexpected pos 30 vs 0")
    assert not (record_dir.path / "exit.json").exists()


def test_a_sigterm_handler_the_caller_installed_is_kept_and_none_gets_raise_terminated(tmp_path: Path) -> None:
    def callers(signum: int, frame: FrameType | None) -> None:
        """A handler of the caller (a matrix worker's acts on the first stop only)."""

    record_dir = run_dir(tmp_path)
    previous = signal.signal(signal.SIGTERM, callers)
    try:
        with exit_record(record_dir):
            assert signal.getsignal(signal.SIGTERM) is callers
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        with exit_record(record_dir):
            assert signal.getsignal(signal.SIGTERM) is raise_terminated
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    finally:
        signal.signal(signal.SIGTERM, previous)
