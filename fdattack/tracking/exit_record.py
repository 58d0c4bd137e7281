"""The exit record of a run stopped by a signal: ``exit.json`` in the run directory and one line on stderr.

While :func:`exit_record` is active, SIGTERM (what ``kill``, SLURM and container runtimes send) raises
:class:`Terminated` in the main thread, so the run unwinds like any error: the W&B run finishes with
exit code 143, the run lock and files close, ``rounds.jsonl`` and the checkpoints stay as they were
after the last completed round. Ctrl-C (SIGINT) is recorded the same way with exit code 130.
"""

from __future__ import annotations

import json
import logging
import signal
import threading
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Iterator

from fdattack.errors import Terminated, raise_terminated, stop_if_terminated
from fdattack.tracking.checkpoint import atomic_write
from fdattack.tracking.run_dir import EXIT_NAME, RunDirectory, recorded_rounds

log = logging.getLogger("fdattack")


@contextmanager
def exit_record(run_dir: RunDirectory) -> Iterator[None]:
    """Turn SIGTERM into :class:`Terminated` for the block; when a signal stops it, write ``exit.json`` and say so.

    ``exit.json`` holds ``signal``, ``exit_code``, ``last_round`` (the last round in ``rounds.jsonl``,
    which a ``resume=true`` run continues after) and ``time``. A Python SIGTERM handler already installed is kept (the
    CLI's raises :class:`Terminated`; a matrix worker's raises it once, :mod:`fdattack.matrix.stopping`); else
    :func:`raise_terminated` is the handler for the block, the previous one restored after it.

    A stop raised inside a library's callback can come out as that library's own error: ``torch.save`` writing a
    checkpoint through a Python file swallows it and fails with "unexpected pos". The block failing while a signal is
    pending (:func:`stop_if_terminated`) is therefore that stop, recorded and raised as such.
    """
    previous = None
    if threading.current_thread() is threading.main_thread() and not callable(signal.getsignal(signal.SIGTERM)):
        previous = signal.signal(signal.SIGTERM, raise_terminated)
    try:
        yield
    except (Terminated, KeyboardInterrupt) as stop:
        _record(run_dir, stop)
        raise
    except Exception as error:
        try:
            stop_if_terminated()
        except Terminated as stop:
            _record(run_dir, stop)
            raise stop from error
        raise
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _record(run_dir: RunDirectory, stop: Terminated | KeyboardInterrupt) -> None:
    """Write ``exit.json`` for ``stop`` and log its line (the writing rank only); mark a :class:`Terminated` recorded."""
    name, code = (stop.signal_name, int(stop.code)) if isinstance(stop, Terminated) else ("SIGINT", 130)
    if not run_dir.is_writer:
        return
    done = max(recorded_rounds(run_dir.rounds_path), default=None)
    record = {"signal": name, "exit_code": code, "last_round": done, "time": datetime.now(timezone.utc).isoformat()}
    atomic_write(run_dir.path / EXIT_NAME, lambda handle: handle.write((json.dumps(record, indent=2) + "\n").encode()))
    after = f"after round {done}" if done is not None else "before round 0 finished"
    latest = run_dir.checkpoints.latest()
    then = (
        f"resume=true continues from its last checkpoint (round {latest[0]})"
        if latest is not None
        else "it wrote no checkpoint: run it again (resume=true has nothing to continue)"
    )
    log.error("fdattack: terminated by %s %s (recorded in %s); %s", name, after, run_dir.path / EXIT_NAME, then)
    if isinstance(stop, Terminated):
        stop.recorded = True
