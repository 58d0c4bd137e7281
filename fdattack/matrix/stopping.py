"""Stopping ``fdattack matrix`` by a signal: SIGTERM (``kill``, SLURM, container runtimes) or SIGINT (Ctrl-C), sent to
the matrix process alone or to its whole process group, ends the running simulations at their next safe point (each
writes ``exit.json`` and keeps its last checkpoint, :mod:`fdattack.tracking.exit_record`), starts no other, and leaves
no process behind; the matrix then writes what finished and exits 143 (SIGTERM) or 130 (SIGINT). Run again, it continues.

How, with ``--jobs N`` > 1 (a pool of spawned worker processes):

- The matrix process decides. While its simulations run, the first SIGTERM or SIGINT raises :class:`Terminated` in it
  (:func:`stops_raise`), and it ignores any further one until its workers are gone; it forwards the signal to each worker
  and shuts the pools down, queued simulations cancelled (:func:`stop_workers`).
- A worker acts on the first stop it receives, from the matrix process or from the terminal (Ctrl-C reaches the whole
  group, so each worker gets the signal twice), and ignores the rest: a second one would cut the first's unwinding short
  (``exit.json``, the W&B run's end). Workers do not ignore SIGINT: whichever copy comes first acts, so a stop needs no
  particular order of arrival. Inside a simulation the stop raises :class:`Terminated`; idle, the worker only notes it,
  and refuses the simulation it is given next (:func:`stoppable`). It then leaves at the pool's shutdown, as usual.
  ``exit_record`` keeps the worker's handler for the run (it installs its own only where none is). A signal to one
  worker alone stops the simulations that worker runs or is given, and the matrix reports them failed with that reason.
- Workers are born with both signals blocked (the matrix process blocks them while it starts the pool, and a spawned
  process inherits its signal mask, :func:`workers_born_blocked`); each unblocks them once its handler is set, so a stop
  while it imports torch waits for the handler instead of killing it with a traceback on the terminal. The pool's own
  threads in the matrix process, started there too, keep the mask: a process-wide signal reaches its main thread, which
  waits for the simulations' results and is woken at once.

- A worker dies with the matrix process, even one killed by SIGKILL, which runs no handler (:func:`die_with_parent`).

With ``--jobs 1`` the simulation runs in the matrix process, under the same once-only handler. Either way the command
ends with :class:`MatrixStopped`, whose one line the CLI prints after the simulation's output went back to the terminal.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from concurrent.futures import Executor
from contextlib import contextmanager
from types import FrameType
from typing import Callable, Iterator, Sequence, TypeVar

from fdattack import lifetime
from fdattack.errors import Terminated, forget_terminated, raise_terminated

#: the signals that stop the matrix
STOPS = (signal.SIGTERM, signal.SIGINT)
#: how often a pool worker checks that the matrix process is still its parent
PARENT_WATCH_S = 1.0

T = TypeVar("T")


class MatrixStopped(Terminated):
    """A signal stopped the matrix after ``finished`` of its ``total`` simulations had finished (before or in this call);
    ``failures`` maps the id of each simulation that failed before the stop to its one-line error."""

    def __init__(self, stop: Terminated, finished: int, total: int, failures: dict[str, str]) -> None:
        super().__init__(signal.Signals[stop.signal_name])
        self.finished, self.total, self.failures = finished, total, failures

    def __str__(self) -> str:
        return (
            f"matrix stopped by {self.signal_name} after {self.finished} of {self.total} simulations; "
            "run the same command again to continue"
        )


class WorkerStopped(Exception):
    """A worker's report that a stop ended (or refused) its simulation (:class:`Terminated` does not cross processes:
    it is rebuilt from its exit code, not its signal)."""


# ---------------------------------------------------------------------------------------------- the matrix process
def _stop_here(signum: int, frame: FrameType | None) -> None:
    """The matrix process's handler: the first stop raises :class:`Terminated`, any later one is ignored."""
    for stop in STOPS:
        signal.signal(stop, signal.SIG_IGN)
    raise_terminated(signum, frame)


@contextmanager
def stops_raise() -> Iterator[None]:
    """While the simulations run (in the main thread): the first SIGTERM or SIGINT raises :class:`Terminated` here and
    the next ones are ignored; the previous handlers are restored at the end, the stop forgotten once handled."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {stop: signal.signal(stop, _stop_here) for stop in STOPS}
    try:
        yield
    finally:
        for stop, handler in previous.items():
            signal.signal(stop, handler)
        forget_terminated()


@contextmanager
def workers_born_blocked() -> Iterator[None]:
    """Block SIGTERM and SIGINT in this thread while it starts pool workers (they inherit the mask; see the module's
    docstring); a stop sent meanwhile arrives here when the block ends."""
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, STOPS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


def stop_workers(pools: Sequence[Executor], stop: Terminated) -> None:
    """Forward ``stop``'s signal to the pools' workers (this process's only children) and shut the pools down, the
    queued simulations cancelled; returns once every worker has exited."""
    for worker in multiprocessing.active_children():
        os.kill(worker.pid, signal.Signals[stop.signal_name])  # type: ignore[arg-type]
    for pool in pools:
        pool.shutdown(wait=True, cancel_futures=True)


# ---------------------------------------------------------------------------------------------- a pool worker
#: the first stop this worker received, and whether it is running a simulation now
_received: int | None = None
_busy = False


def _stop_worker(signum: int, frame: FrameType | None) -> None:
    global _received
    if _received is None:
        _received = signum
        if _busy:
            raise_terminated(signum, frame)


def start_worker(parent: int) -> None:
    """A pool worker's first set-up step: it dies with the matrix process ``parent`` (:func:`die_with_parent`), sets its
    stop handler, then lets in the signals its parent blocked."""
    die_with_parent(parent)
    for stop in STOPS:
        signal.signal(stop, _stop_worker)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOPS)


def die_with_parent(parent: int) -> None:
    """End this process when the matrix process ``parent`` ends, however it ends (a ``kill -9`` runs none of its
    handlers, and its workers would finish their simulations under init): the kernel's death signal
    (:func:`fdattack.lifetime.die_with_parent`), and a watchdog thread that looks at the parent's pid every
    :data:`PARENT_WATCH_S` besides (the pool starts workers from a thread of its own, whose end would also send the
    signal, and a platform may have no death signal). Its simulation's zygote and attack workers end when their
    channels to it close."""
    lifetime.die_with_parent(parent)
    threading.Thread(target=_watch_parent, args=(parent,), name="fdattack-parent-watch", daemon=True).start()


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(PARENT_WATCH_S)
    os.kill(os.getpid(), signal.SIGKILL)


def stoppable(job: Callable[..., T], *args: object) -> T:
    """Run ``job(*args)`` in a pool worker, a stop ending it at its next safe point; refused once the worker was stopped.

    Raises:
        WorkerStopped: a stop ended the job or came before it.
    """
    global _busy
    try:
        if _received is not None:
            raise Terminated(_received)
        _busy = True
        try:
            return job(*args)
        finally:
            _busy = False
    except Terminated as stop:
        raise WorkerStopped(f"stopped by {stop.signal_name}; run the matrix again to continue it") from None
