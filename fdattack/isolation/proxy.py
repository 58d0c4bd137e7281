"""The run's side of an isolated attack: it starts the worker, feeds it records, answers its asks, keeps its budget.

:class:`IsolatedAttack` stands in the run where the attack would: the orchestrator hands it each record with the
streams of that call, and it sends the worker the record as plain data (:func:`~fdattack.isolation.wire.record_to_wire`)
and the streams' seed, then answers what the worker asks (queries on the record's handle, its adversary's actions:
each carried out by the run's own objects, which check it) until the worker is done. Everything the worker sends is
read by :func:`fdattack.isolation.codec.decode` (plain data only, no pickle) and results are rebuilt by exact type on
the evaluation side as in process.

A worker that fails, goes past its wall seconds or memory (:class:`Budget`), or sends what is not plain data is
stopped with one line in the log; the run goes on without it, and the rounds after report
``attack/<name>/stopped/<why>`` (``failed``, ``seconds`` or ``memory``).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import pickle
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any, Optional, Sequence

from fdattack.attacks.declaration import Declaration, DeclarationError
from fdattack.errors import ConfigError, WorkerError
from fdattack.fd.adversary import Adversary
from fdattack.fd.observer import Observer
from fdattack.fd.record import PublicQuery, QueryRefusedError, RoundRecord, StaleQueryError
from fdattack.fd.results import RESULT_TYPES
from fdattack.isolation import codec, seccomp
from fdattack.isolation.framing import MessageError, MessageReader, read_message
from fdattack.isolation.sandbox import landlock_abi
from fdattack.isolation.wire import DeclarationBrief, WorkerBrief, record_to_wire
from fdattack.randomness import GlobalStreams

log = logging.getLogger(__name__)

#: environment variables a worker keeps (where Python, its packages and its threads are); nothing of the run
WORKER_ENVIRONMENT = (
    "PATH",
    "PYTHONPATH",
    "VIRTUAL_ENV",
    "LD_LIBRARY_PATH",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "TMPDIR",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "CUDA_VISIBLE_DEVICES",
    "SYSTEMROOT",
)
_POLL_S = 0.2  # how often a wait looks at the budgets
START_S = 600  # the longest a worker may take to start (import, build its attack) before it is stopped
MESSAGE_S = 60.0  # the longest one message may take to arrive in full once its first bytes have


def worker_environment(tmpdir: Path, import_roots: Sequence[Path] = ()) -> dict[str, str]:
    """A worker's (and the zygote's) environment: :data:`WORKER_ENVIRONMENT` from the run's, its own ``TMPDIR``, and
    ``import_roots`` (where the run imports its plugins from) ahead on ``PYTHONPATH``."""
    environment = {**{key: os.environ[key] for key in WORKER_ENVIRONMENT if key in os.environ}, "TMPDIR": str(tmpdir)}
    if import_roots:
        environment["PYTHONPATH"] = os.pathsep.join([*map(str, import_roots), *filter(None, [environment.get("PYTHONPATH")])])
    return environment


def bounded_line(text: str, limit: int = 300) -> str:
    """``text`` as one line of at most ``limit`` printable characters: a line break or control character is escaped
    (``\\n``), so a worker's text can forge no line of the run's log, and the rest is cut with "…"."""
    line = "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)
    return line if len(line) <= limit else line[: limit - 1] + "…"


def log_of(folder: Path) -> Path:
    """A worker's log: ``<state_root>/<attack>.log``, beside its folder, where no worker may write."""
    return folder.parent / f"{folder.name}.log"


def open_log(path: Path) -> int:
    """``path`` opened for appending and never through a symbolic link (``O_NOFOLLOW``): a worker's log lies beside its
    folder, where no worker writes, so a link there was planted; it is refused, not followed.

    Raises:
        WorkerError: it cannot be opened (a link, a folder, no permission), in one line.
    """
    try:
        return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as error:
        why = "a symbolic link there is refused" if error.errno == errno.ELOOP else error.strerror
        raise WorkerError(f"cannot open the worker log {path}: {why}") from None


class Zygote:
    """The run's handle on the workers' zygote (:mod:`fdattack.isolation.zygote`): started at once, it imports what the
    workers need while the run builds; :meth:`fork` then starts each worker in a fraction of a second. It imports
    ``plugins`` from where the run does.

    Raises:
        WorkerError: it did not start within :data:`START_S` or exited (the last line of its log says why).
    """

    def __init__(self, plugins: Sequence[str] = ()) -> None:
        from fdattack.plugins import plugin_roots

        self.folder = Path(tempfile.mkdtemp(prefix="fdattack-zygote-"))
        kind = socket.SOCK_SEQPACKET if hasattr(socket, "SOCK_SEQPACKET") else socket.SOCK_STREAM
        ours, theirs = socket.socketpair(socket.AF_UNIX, kind)
        with open(self.folder / "zygote.log", "ab") as output:
            self._process = subprocess.Popen(
                [sys.executable, "-m", "fdattack.isolation.zygote", str(theirs.fileno())],
                cwd=self.folder,
                env=worker_environment(self.folder, plugin_roots(plugins)),
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                pass_fds=(theirs.fileno(),),
                close_fds=True,
                start_new_session=True,  # a Ctrl-C reaches the run, which stops the zygote itself
            )
        theirs.close()
        self._control = ours
        self._ready = False

    def fork(self, folder: Path, log: Path) -> tuple[Connection, int]:
        """A new worker in ``folder`` writing to ``log`` (outside ``folder``): the run's end of its channel, and its pid."""
        output = open_log(log)
        try:
            self._wait_ready()
            ours, theirs = socket.socketpair()
            request = json.dumps({"folder": str(folder.resolve()), "tmpdir": str((folder / "tmp").resolve())}).encode()
            socket.send_fds(self._control, [request], [theirs.fileno(), output])
        finally:
            os.close(output)
        theirs.close()
        return Connection(ours.detach()), int(json.loads(self._reply())["pid"])

    def declare(self, plugins: Sequence[str], settings: dict[str, dict[str, Any]]) -> dict[str, Declaration]:
        """Each attack's declarations with its settings (``{attack: attack.<name> as a plain dict}``), read by a confined
        child that holds nothing of the run (:func:`~fdattack.isolation.worker.declare_attacks`): no attack code runs in
        the run for them.

        Raises:
            ConfigError: the child failed (a plugin that does not import, settings its ``Settings`` refuses, a
                declaration that is not plain) or sent what is not declarations, in one line.
        """
        conn, pid = self.fork(self.folder, self.folder / "declare.log")
        try:
            conn.send_bytes(pickle.dumps(DeclarationBrief(tuple(plugins), settings), protocol=pickle.HIGHEST_PROTOCOL))
            reply = codec.decode(read_message(MessageReader(conn.fileno(), 1 << 20), time.monotonic() + START_S))
            if type(reply) is list and len(reply) == 2 and reply[0] == "failed" and type(reply[1]) is str:
                raise ConfigError(f"the attacks' declarations could not be read: {bounded_line(reply[1])}")
            if type(reply) is not list or len(reply) != 2 or reply[0] != "declared" or type(reply[1]) is not dict:
                raise DeclarationError("a reply that is not declarations")
            if set(reply[1]) != set(settings):
                raise DeclarationError(f"declarations of {sorted(reply[1])} where the run asked for {sorted(settings)}")
            return {name: Declaration.from_names(names) for name, names in reply[1].items()}
        except (codec.CodecError, DeclarationError, MessageError, TimeoutError, EOFError, OSError) as err:
            raise ConfigError(f"the attacks' declarations could not be read: {bounded_line(str(err))}") from None
        finally:
            conn.close()
            _kill(pid)

    def close(self) -> None:
        """Stop the zygote (its workers are stopped by the run first) and remove its folder."""
        self._control.close()
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        shutil.rmtree(self.folder, ignore_errors=True)

    def _wait_ready(self) -> None:
        if not self._ready:
            self._reply()
            self._ready = True

    def _reply(self) -> bytes:
        self._control.settimeout(START_S)
        try:
            reply = self._control.recv(65536)
        except OSError:
            reply = b""
        if not reply:
            log_tail = (self.folder / "zygote.log").read_text(errors="replace").strip().splitlines()[-1:] or ["(empty log)"]
            raise WorkerError(f"the attack workers' zygote did not start or answer ({log_tail[0]}); run with isolation.mode=in_process")
        return reply


@dataclass(frozen=True)
class Budget:
    """An attack's limits (``isolation.seconds``, ``isolation.memory_mb``); None = none."""

    seconds: Optional[float] = None
    memory_mb: Optional[int] = None


class IsolatedAttack(Observer):
    """One attack in a worker process of its own.

    Args:
        brief: what the worker builds the attack from.
        adversary: the run's adversary granted to the attack (its actions are carried out on it), or None.
        budget: its wall seconds and memory.
        folder: its working directory and state folder (``<state_root>/<attack>``); its output goes to
            ``<state_root>/<attack>.log``, beside it, where no worker writes (the run reopens it on resume).
        overlaps: whether its round end may run while the next round simulates (``isolation.overlap``): its records that
            carry no query are then sent without waiting for the worker, and one that carries a query waits until the
            worker has done everything before it (the query must be answered while its phase is open).
    """

    def __init__(
        self, brief: WorkerBrief, adversary: Optional[Adversary], budget: Budget, folder: Path, zygote: Zygote, overlaps: bool = False
    ) -> None:
        self.name = brief.attack
        self.adversary = adversary
        self.budget = budget
        self.log_path = log_of(folder)
        self.spent_s = 0.0
        self.stopped: Optional[tuple[str, str]] = None  # (why: failed | seconds | memory, the one line)
        self.sandbox_abi = 0
        self.overlaps = overlaps
        self._queries: dict[int, PublicQuery] = {}
        self._serial = 0
        self._owed: deque[str] = deque()  # the replies the worker owes, in the order it sends them
        self._received: dict[str, list] = {}  # replies read but not yet taken (a round end's results, its state)
        self._started_at: Optional[float] = None  # since when the worker has owed a reply
        self._round_end_sent: Optional[float] = None  # when its round end was sent, until the run first waits for it
        self.overlap_s = 0.0  # how long the run went on beside the last round end before it waited for it
        self._over_memory = False
        (folder / "tmp").mkdir(parents=True, exist_ok=True)
        self._conn, self._pid = zygote.fork(folder, self.log_path)
        self._reader = MessageReader(self._conn.fileno(), message_limit(budget))
        self._post(brief, "ready")

    # ------------------------------------------------------------------ the calls the run makes
    @property
    def alive(self) -> bool:
        return self.stopped is None

    @property
    def waiting(self) -> bool:
        """Whether the worker owes the run a reply."""
        return self.alive and bool(self._owed)

    def owes(self, reply: str) -> bool:
        """Whether the worker still owes a reply of kind ``reply`` (False once it was stopped)."""
        return self.alive and reply in self._owed

    def fileno(self) -> int:
        """The channel's descriptor (what :func:`multiprocessing.connection.wait` waits on)."""
        return self._conn.fileno()

    def wait_ready(self) -> int:
        """Wait until the worker has built its attack; the Landlock ABI that confines it (0: none, or it failed). The
        run does not take the worker's word for it: the worker must show the seccomp filter that :func:`confine` sets
        last (``/proc/<pid>/status``), or it is stopped; the ABI is then the kernel's, as the run reads it."""
        reply = self._until("ready")
        self.spent_s = 0.0  # its start (Python, torch, its sandbox) is not the attack's to pay for
        if reply is None:
            return 0
        shown = seccomp.filtered(self._pid)
        if shown is False and seccomp.filter_supported():
            self.stop("failed", "its worker is not confined (no seccomp filter on it)")
            return 0
        reported = reply[1] if len(reply) == 2 and type(reply[1]) is int else 0
        self.sandbox_abi = landlock_abi() if shown else reported  # no seccomp on this machine: the worker's word
        return self.sandbox_abi

    def receive(self, record: RoundRecord, streams: GlobalStreams) -> None:
        """Send ``record`` and answer the worker's asks until it is done with it; an overlapping worker's record without
        a query is only sent (the worker takes it after what it is still doing)."""
        if not self.alive:
            return
        self._serial += 1
        if record.query is not None:
            self._queries[self._serial] = record.query
        fields, shape = record_to_wire(record)
        synchronous = record.query is not None or not self.overlaps
        if synchronous:
            self._settle()  # an earlier round end first: the query is answered while its phase is open
        self._post(("record", streams.seed, self._serial, fields, shape), "done")
        if synchronous:
            self._settle()

    def dispatch_round_end(self, round_index: int, streams: GlobalStreams, with_state: bool = False) -> None:
        """Start the worker's ``on_round_end`` (:func:`collect_round_ends` gathers the results); ``with_state``: ask for
        its state right after it (what a checkpoint of this round holds, taken before any record of the next round)."""
        if self.alive:
            self._round_end_sent, self.overlap_s = time.perf_counter(), 0.0
            self._post(("round_end", streams.seed, round_index), "results")
            if with_state:
                self._post(("state",), "state")

    def take_results(self) -> list:
        """The results of the round end collected last, rebuilt by type (:func:`results_from_wire`); [] when the worker
        was stopped, or sent what are not results (it is stopped then)."""
        reply = self._received.pop("results", None)
        if reply is None:
            return []
        try:
            return results_from_wire(reply[1] if len(reply) == 2 else None)
        except (TypeError, ValueError) as err:
            self.stop("failed", f"its worker sent results that are not results ({err})")
            return []

    def state_dict(self) -> dict:
        """The worker's state as bytes it alone reads back, with the seconds spent (and why it stopped, if it did)."""
        if self.alive and not self.owes("state") and "state" not in self._received:
            self._post(("state",), "state")
        reply = self._until("state")
        if not self.alive:
            assert self.stopped is not None
            return {"isolation": {"stopped": list(self.stopped), "spent_s": self.spent_s}}
        return {"isolation": {"state": None if reply is None else reply[1], "spent_s": self.spent_s}}

    def load_state_dict(self, state: dict) -> None:
        """Restore a checkpoint's state: a worker's bytes, or an in-process attack's state dict."""
        saved = state.get("isolation") if type(state) is dict else None
        if saved is None:
            self._post(("load", state), "done")
            self._settle()
            return
        self.spent_s = float(saved["spent_s"])
        if "stopped" in saved:
            why, line = saved["stopped"]
            self.stop(why, line, quiet=True)
            return
        self._post(("load", saved["state"]), "done")
        self._settle()

    def close(self) -> None:
        """Stop the worker (asked first, then killed after 10 s)."""
        if self._running():
            self._send(("stop",))
            if not self._gone_within(10.0):
                self._kill()
        self._conn.close()
        shutil.rmtree(self.log_path.parent / "tmp", ignore_errors=True)

    def overlap_metrics(self) -> dict[str, float]:
        """``time/<name>/overlap_s``: the seconds the run went on beside the worker's last round end (the next round's
        simulation, up to its first record that carries a query) before it waited for its results."""
        return {f"time/{self.name}/overlap_s": self.overlap_s}

    def stopped_metrics(self) -> dict[str, float]:
        """``attack/<name>/stopped/<why>`` = 1 once the worker was stopped; {} while it runs."""
        return {} if self.stopped is None else {f"attack/{self.name}/stopped/{self.stopped[0]}": 1.0}

    # ------------------------------------------------------------------ the channel
    def _send(self, message: Any) -> None:
        try:
            self._conn.send_bytes(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))
        except OSError:
            pass  # the worker is gone: the next wait reads why

    def _post(self, message: Any, reply: str) -> None:
        """Send ``message``, for which the worker owes a reply of kind ``reply``."""
        if not self._owed:
            self._started_at = time.perf_counter()
        self._owed.append(reply)
        self._send(message)

    def _until(self, reply: str) -> Optional[list]:
        """The worker's reply of kind ``reply``, answering its asks meanwhile; None when it was stopped instead."""
        while self.alive and reply not in self._received:
            wait([self._conn], timeout=_POLL_S)
            self.step()
        return self._received.pop(reply, None)

    def waits(self) -> None:
        """The run starts waiting for the worker: what ran beside the simulation of its round end ends here
        (:attr:`overlap_s`)."""
        if self._round_end_sent is not None:
            self.overlap_s = time.perf_counter() - self._round_end_sent
            self._round_end_sent = None

    def _settle(self) -> None:
        """Wait until the worker owes nothing, answering its asks meanwhile (replies other than ``done`` are kept)."""
        if self.waiting:
            self.waits()
        while self.waiting:
            wait([self._conn], timeout=_POLL_S)
            self.step()

    def step(self) -> None:
        """Read one message if there is one: answer an ask, or take the reply the worker owes next (kept for
        :meth:`_until` unless it is a record's ``done``). Stops the worker past its budget or off its protocol."""
        if not self.alive:
            return
        if self._over_memory:
            self.stop("memory", f"its worker went past isolation.memory_mb={self.budget.memory_mb} MiB")
            return
        elapsed = time.perf_counter() - (self._started_at or time.perf_counter())
        starting = bool(self._owed) and self._owed[0] == "ready"
        if starting and elapsed > START_S:
            self.stop("failed", f"its worker did not start within {START_S} s")
            return
        if not starting and self.budget.seconds is not None and self.spent_s + elapsed > self.budget.seconds:
            self.stop("seconds", f"it took more than isolation.seconds={self.budget.seconds:g} s")
            return
        try:
            raw = self._reader.read()
        except (EOFError, OSError):
            self._gone_within(10.0)
            if self._over_memory:
                self.stop("memory", f"its worker went past isolation.memory_mb={self.budget.memory_mb} MiB")
            else:
                self.stop("failed", "its worker exited")
            return
        except MessageError as err:
            self.stop("failed", f"its worker sent {err}")
            return
        if raw is None:
            begun = self._reader.begun
            if begun is not None and time.monotonic() - begun > MESSAGE_S:
                self.stop("failed", f"its worker began a message of {self._reader.size} bytes and did not finish it in {MESSAGE_S:g} s")
            return
        try:
            message = codec.decode(raw)
        except Exception as err:  # noqa: BLE001 - whatever a crafted message makes the decoder raise stops this attack only
            self.stop("failed", f"its worker sent something that is not plain data ({err})")
            return
        if type(message) is not list or not message or type(message[0]) is not str:
            self.stop("failed", "its worker sent a message of no known form")
            return
        kind = message[0]
        if kind == "ask" and len(message) == 3 and type(message[1]) is str and type(message[2]) is list:
            self._answer(message[1], message[2])
            return
        if kind == "failed" and len(message) == 2 and type(message[1]) is str:
            self.stop("failed", message[1])
            return
        if not self._owed or kind != self._owed[0]:
            waited = repr(self._owed[0]) if self._owed else "nothing"
            self.stop("failed", f"its worker sent {kind!r} where the run waited for {waited}")
            return
        self._owed.popleft()
        now = time.perf_counter()
        self.spent_s += now - (self._started_at or now)
        self._started_at = now if self._owed else None
        if kind != "done":
            self._received[kind] = message

    def _answer(self, what: str, args: list) -> None:
        """Carry out one ask on the run's own objects (each checks what it is given) and send the answer or refusal."""
        try:
            reply: tuple = ("answer", self._carry_out(what, args))
        except Exception as err:  # noqa: BLE001 - every refusal or failure goes back to the worker as type and message
            reply = ("refused", type(err).__name__, str(err))
        self._send(reply)

    def _carry_out(self, what: str, args: list) -> Any:
        if what == "query":
            serial, model, rows = args
            query = self._queries.get(serial) if type(serial) is int else None
            if query is None:
                raise StaleQueryError("this record's query handle answers nothing (the record had none, or its phase ended)")
            return query(model, rows)
        adversary = self.adversary
        if adversary is None:
            raise QueryRefusedError(f"attack {self.name} was granted no adversary")
        if what == "choose_public_rows":
            return adversary.choose_public_rows(*args)
        if what == "add_public_samples":
            return adversary.add_public_samples(*args)
        if what == "send_aggregate":
            return adversary.send_aggregate(*args)
        if what == "query_chosen":
            return adversary.query(*args)
        raise QueryRefusedError(f"the run carries out no {what!r}")

    def stop(self, why: str, line: str, quiet: bool = False) -> None:
        """Stop the worker for good: the run goes on without the attack (``line``, which may quote the worker, is
        bounded to one printable line first)."""
        line = bounded_line(line)
        self.stopped = (why, line)
        self._queries.clear()
        self._owed.clear()
        self._received.clear()
        self._kill()
        self._conn.close()
        if not quiet:
            log.warning("attack %s stopped: %s; the run goes on without it (its log: %s)", self.name, line, self.log_path)

    # ------------------------------------------------------------------ the process (a child of the zygote, by pid)
    def _running(self) -> bool:
        return _running(self._pid)

    def _kill(self) -> None:
        _kill(self._pid)

    def _gone_within(self, seconds: float) -> bool:
        return _gone_within(self._pid, seconds)

    # ------------------------------------------------------------------ memory
    def check_memory(self) -> None:
        """Kill the worker if the memory it holds alone (:func:`resident_mb`) is past its budget (called by :class:`MemoryWatch`)."""
        if not self.alive or not self._running():
            return
        if self.budget.memory_mb is not None and resident_mb(self._pid) > self.budget.memory_mb:
            self._over_memory = True
            self._kill()


def message_limit(budget: Budget) -> int:
    """The most one message of a worker may hold: its memory budget, or :data:`~fdattack.isolation.codec.MAX_MESSAGE_BYTES`."""
    return codec.MAX_MESSAGE_BYTES if budget.memory_mb is None else min(codec.MAX_MESSAGE_BYTES, budget.memory_mb << 20)


def _running(pid: int) -> bool:
    """Whether process ``pid`` (a worker, a child of the zygote) is still there."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kill(pid: int) -> None:
    """Kill worker ``pid`` and wait (up to 10 s) for the zygote to reap it."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    _gone_within(pid, 10.0)


def _gone_within(pid: int, seconds: float) -> bool:
    """Wait up to ``seconds`` for worker ``pid`` to be gone (the zygote reaps it); whether it is."""
    deadline = time.monotonic() + seconds
    while _running(pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    return not _running(pid)


def resident_mb(pid: int) -> float:
    """The resident memory process ``pid`` holds alone, in MiB: its unique set (``Private_Clean`` + ``Private_Dirty`` of
    ``/proc/<pid>/smaps_rollup``), net of the pages it still shares with the zygote (torch and the other imports); its
    whole ``VmRSS`` where that cannot be read (an old kernel, a worker that made itself undumpable); 0 when neither can."""
    kb = _fields_kb(f"/proc/{pid}/smaps_rollup", ("Private_Clean:", "Private_Dirty:"))
    if kb is None:
        kb = _fields_kb(f"/proc/{pid}/status", ("VmRSS:",))
    return (kb or 0) / 1024


def _fields_kb(path: str, names: tuple[str, ...]) -> Optional[int]:
    """The sum of the kB fields ``names`` of a ``/proc`` file; None when it cannot be read or lacks one."""
    try:
        values = [int(line.split()[1]) for line in Path(path).read_text().splitlines() if line.startswith(names)]
    except (OSError, ValueError, IndexError):
        return None
    return sum(values) if len(values) == len(names) else None


class MemoryWatch:
    """A thread that looks at every worker's resident memory five times a second."""

    def __init__(self, attacks: Sequence[IsolatedAttack]) -> None:
        self._attacks = list(attacks)
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="fdattack-memory-watch", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._done.wait(_POLL_S):
            for attack in self._attacks:
                attack.check_memory()

    def stop(self) -> None:
        self._done.set()
        self._thread.join()


def concurrent_workers(threads: int) -> int:
    """How many workers may end a round at once: as many as this process's cores give ``threads`` each (at least one),
    so that no worker trains with fewer threads than the run would (the same threads give the same float sums)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, cores // max(1, threads))


def worker_devices(run_device: str, gpus: int, workers: int) -> list[tuple[str, object]]:
    """Each worker's ``(accelerator, devices)``: the run's own device on a CPU or a one-GPU machine; with several GPUs,
    the GPUs the run does not simulate on, one per worker in turn (``run_device``: the run's, such as ``cuda:0``)."""
    kind, _, index = run_device.partition(":")
    if kind != "cuda" or gpus <= 1:
        return [(kind, 1 if kind == "cpu" else [int(index or 0)])] * workers
    others = [gpu for gpu in range(gpus) if gpu != int(index or 0)]
    return [("cuda", [others[worker % len(others)]]) for worker in range(workers)]


def collect_round_ends(attacks: Sequence[IsolatedAttack]) -> dict[str, list]:
    """Every dispatched worker's ``on_round_end`` results (:meth:`IsolatedAttack.take_results`); the workers run at
    once, and each one's asks are answered as they come. A worker stopped meanwhile gives no results."""
    pending = [a for a in attacks if a.owes("results")]
    for attack in pending:
        attack.waits()
    while pending:
        wait(pending, timeout=_POLL_S)
        for attack in list(pending):
            attack.step()
            if not attack.owes("results"):
                pending.remove(attack)
    return {attack.name: attack.take_results() for attack in attacks}


def results_from_wire(wire: Any) -> list:
    """``(type name, fields)`` pairs rebuilt as the result types they name (the evaluator checks each field again)."""
    types = {kind.__name__: kind for kind in RESULT_TYPES}
    if type(wire) is not list:
        raise TypeError("not a list")
    rebuilt = []
    for item in wire:
        if type(item) is not list or len(item) != 2 or type(item[0]) is not str or type(item[1]) is not dict or item[0] not in types:
            raise TypeError("an item that is not (result type, fields)")
        rebuilt.append(types[item[0]](**item[1]))
    return rebuilt
