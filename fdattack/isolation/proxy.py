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

import logging
import pickle
import shutil
import threading
import time
from collections import deque
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any, Optional, Sequence

from fdattack.fd.adversary import Adversary
from fdattack.fd.observer import Observer
from fdattack.fd.record import PublicQuery, QueryRefusedError, RoundRecord, StaleQueryError
from fdattack.fd.results import RESULT_TYPES
from fdattack.isolation import codec, seccomp
from fdattack.isolation.budgets import Budget, message_limit, resident_mb
from fdattack.isolation.framing import MessageError, MessageReader
from fdattack.isolation.processes import START_S, Zygote, bounded_line, gone_within, kill, log_of, running
from fdattack.isolation.sandbox import landlock_abi
from fdattack.isolation.wire import WorkerBrief, record_to_wire
from fdattack.randomness import GlobalStreams

log = logging.getLogger(__name__)

_POLL_S = 0.2  # how often a wait looks at the budgets
MESSAGE_S = 60.0  # the longest one message may take to arrive in full once its first bytes have


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
        return running(self._pid)

    def _kill(self) -> None:
        kill(self._pid)

    def _gone_within(self, seconds: float) -> bool:
        return gone_within(self._pid, seconds)

    # ------------------------------------------------------------------ memory
    def check_memory(self) -> None:
        """Kill the worker if the memory it holds alone (:func:`resident_mb`) is past its budget (called by :class:`MemoryWatch`)."""
        if not self.alive or not self._running():
            return
        if self.budget.memory_mb is not None and resident_mb(self._pid) > self.budget.memory_mb:
            self._over_memory = True
            self._kill()


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
