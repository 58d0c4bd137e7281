"""An attack's worker process: ``python -m fdattack.isolation.worker <fd>``, started by the run for one attack.

It holds the attack and nothing of the simulation: its brief (the attack's own view, settings and seed), the records it
is sent as plain data, and a channel (descriptor ``<fd>``) by which it asks the run to answer queries and carry out its
adversary's actions. Hooks, frames, ``gc``, ``/proc/self`` and ``sys.argv`` show the attack only this process.
"""

from __future__ import annotations

import io
import logging
import pickle
import queue
import sys
import threading
import traceback
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
import torch

from fdattack.fd.boundary import plain_tensor, plain_value
from fdattack.fd.record import PublicQuery, Reply
from fdattack.fd.threat import Capability
from fdattack.isolation import codec
from fdattack.isolation.sandbox import confine
from fdattack.isolation.wire import REFUSALS, AdversaryShape, DeclarationBrief, WorkerBrief, record_from_wire
from fdattack.lifetime import die_with_parent
from fdattack.randomness import GlobalStreams, seed_globals

log = logging.getLogger("fdattack.worker")


class Channel:
    """The worker's end: it sends plain data (:mod:`~fdattack.isolation.codec`) and reads the run's pickles.

    Once :meth:`start_reading` (after the worker is confined: a thread started before would not be), a thread reads
    every message as it arrives, so the run never waits to send while the attack is busy: the run's calls queue up for
    :meth:`receive` and the answers to the worker's asks go to :meth:`ask`, wherever they fall among the calls (an
    overlapping worker's round end may ask while the next round's records arrive).
    """

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        self._answers: queue.SimpleQueue = queue.SimpleQueue()
        self._reader: threading.Thread | None = None

    def start_reading(self) -> None:
        self._reader = threading.Thread(target=self._read, name="fdattack-worker-reader", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                message = pickle.loads(self._conn.recv_bytes())
            except (EOFError, OSError):
                self._calls.put(None)
                self._answers.put(None)
                return
            (self._answers if message[0] in ("answer", "refused") else self._calls).put(message)

    def send(self, *message: Any) -> None:
        self._conn.send_bytes(codec.encode(list(message)))

    def receive(self) -> tuple:
        """The run's next call (raises EOFError once the run is gone)."""
        return self._next(self._calls)

    def _next(self, inbox: queue.SimpleQueue) -> tuple:
        if self._reader is None:
            return pickle.loads(self._conn.recv_bytes())
        message = inbox.get()
        if message is None:
            inbox.put(None)
            raise EOFError("the run closed the channel")
        return message

    def ask(self, what: str, *args: Any) -> Any:
        """The run's answer to ``what`` with ``args``; its refusal is raised here as the exception it names."""
        self.send("ask", what, [_plain(arg, f"an argument of {what}") for arg in args])
        reply = self._next(self._answers)
        if reply[0] == "refused":
            raise REFUSALS.get(reply[1], RuntimeError)(reply[2])
        return reply[1]


class RemoteLine:
    """A record's query line: each ask names the record it came with, so a handle kept past its phase stays stale."""

    __slots__ = ("_channel", "_serial")

    def __init__(self, channel: Channel, serial: int) -> None:
        self._channel, self._serial = channel, serial

    def ask(self, model: Any, public_indices: Any) -> Any:
        return self._channel.ask("query", self._serial, model, public_indices)


class RemoteAdversary:
    """The attack's side of its :class:`~fdattack.fd.adversary.Adversary`: every action is carried out, checked and
    counted by the run's adversary."""

    def __init__(self, shape: AdversaryShape, channel: Channel) -> None:
        self.powers: frozenset[Capability] = shape.powers
        self.num_public = shape.num_public
        self.image_shape = tuple(shape.image_shape)
        self._channel = channel

    def choose_public_rows(self, rows: Any) -> None:
        self._channel.ask("choose_public_rows", rows)

    def add_public_samples(self, images: Any) -> None:
        self._channel.ask("add_public_samples", images)

    def send_aggregate(self, client: int, aggregate: Any) -> None:
        self._channel.ask("send_aggregate", client, aggregate)

    def query(self, client: int, images: Any) -> Reply:
        return self._channel.ask("query_chosen", client, images)


def _plain(value: Any, what: str) -> Any:
    """An ask's argument as plain data, as the run's own checks would take it in process (a NumPy array as a tensor)."""
    return plain_tensor(value, what) if type(value) is np.ndarray else plain_value(value, what)


def build_attack(brief: WorkerBrief, channel: Channel) -> tuple[Any, int]:
    """The attack of ``brief``, as the run would build it in its own process (:func:`fdattack.assembly.build_attacks`):
    the worker is confined first (:func:`~fdattack.isolation.sandbox.confine`, while it has one thread), then starts its
    threads and engine, imports the plugins and makes the attack's settings from their plain dict, so that no thread and
    no code of a plugin runs unconfined; and the Landlock ABI that confines it (0: none)."""
    from fdattack.attacks import ATTACKS, AttackContext
    from fdattack.attacks.declaration import settings_of
    from fdattack.attacks.state_store import ClientStateStore
    from fdattack.engine import LocalTrainer, make_fabric
    from fdattack.plugins import load_plugins, plugin_sources
    from fdattack.tracking.artifact_cache import AttackCache

    t = brief.trainer
    own = Path(brief.state_root) / brief.attack
    cache = None if brief.cache is None else Path(brief.cache)
    if cache is not None:
        cache.mkdir(parents=True, exist_ok=True)
    writable = [own, *([cache] if cache is not None else [])]
    abi = confine(writable=writable, readable=plugin_sources(brief.plugins), devices=str(t["accelerator"]) != "cpu")
    torch.set_num_threads(brief.threads)  # its thread pool (and a GPU's driver threads, below) start confined
    engine = LocalTrainer(make_fabric(t["accelerator"], t["devices"], "auto", 1, t["precision"]), t["batch_size"], vectorise=t["vectorise"])
    load_plugins(list(brief.plugins))
    cls = ATTACKS.get(brief.attack)
    context = AttackContext(
        seed=brief.seed,
        store=ClientStateStore(own, keep=brief.keep),
        progress="never",
        engine=engine,
        adversary=None if brief.adversary is None else RemoteAdversary(brief.adversary, channel),  # type: ignore[arg-type]
        cache=None if cache is None else AttackCache(cache, brief.attack, "process"),
    )
    return cls(brief.view, settings_of(cls, brief.settings), context), abi


def declare_attacks(brief: DeclarationBrief) -> dict[str, dict[str, list[str]]]:
    """Each attack's declarations with its settings (:func:`~fdattack.attacks.declaration.declare`), read confined, by a
    worker that holds nothing of the run and writes nothing, as names for the run."""
    from fdattack.attacks import ATTACKS
    from fdattack.attacks.declaration import declare
    from fdattack.plugins import load_plugins, plugin_sources

    confine(writable=[], readable=plugin_sources(brief.plugins))
    load_plugins(list(brief.plugins))
    return {name: declare(ATTACKS.get(name), settings).to_names() for name, settings in brief.settings.items()}


def results_to_wire(results: Any, attack: str) -> list:
    """``on_round_end``'s results as ``(type name, fields)`` pairs of plain data (the run rebuilds them by type)."""
    from fdattack.fd.boundary import BoundaryError, type_name
    from fdattack.fd.results import RESULT_TYPES

    if type(results) is not list and type(results) is not tuple:
        raise BoundaryError(f"attack {attack} returned a {type_name(type(results))} from on_round_end; it must return a list")
    wire = []
    for result in results:
        if not any(type(result) is kind for kind in RESULT_TYPES):
            raise BoundaryError(f"attack {attack} returned a {type_name(type(result))}; results must be exactly one of the result types")
        fields = {name: getattr(result, name) for name in result.__dataclass_fields__}
        wire.append([type(result).__name__, plain_value(fields, f"attack {attack}'s {type(result).__name__}")])
    return wire


def serve(channel: Channel, attack: Any) -> None:
    """Answer the run's calls, in the order they came, until it says stop (or goes away)."""
    channel.start_reading()
    while True:
        try:
            message = channel.receive()
        except EOFError:
            return
        kind = message[0]
        if kind == "stop":
            return
        if kind == "record":
            _, seed, serial, fields, shape = message
            query = None
            if shape is not None:
                query = PublicQuery(
                    RemoteLine(channel, serial),
                    shape.round,
                    shape.phase,
                    shape.rows,
                    shape.clients,
                    shape.has_server,
                    shape.kind,
                    shape.temperature,  # type: ignore[arg-type]
                )
            with GlobalStreams(seed).active():
                attack.on_record(record_from_wire(fields, query))
            channel.send("done")
        elif kind == "round_end":
            _, seed, round_index = message
            with GlobalStreams(seed).active():
                results = attack.on_round_end(round_index)
            channel.send("results", results_to_wire(results, attack.name))
        elif kind == "state":
            channel.send("state", _saved(attack.state_dict()))
        elif kind == "load":
            state = message[1]
            attack.load_state_dict(torch.load(io.BytesIO(state), weights_only=False) if type(state) is bytes else state)
            channel.send("done")
        else:
            raise RuntimeError(f"the run sent a message of no known kind: {kind!r}")


def _saved(state: dict) -> bytes:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


def main(argv: list[str]) -> NoReturn:
    """Read the brief from descriptor ``argv[0]``, build the attack, serve; a failure is one line to the run."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    die_with_parent()
    channel = Channel(Connection(int(argv[0])))
    try:
        brief: WorkerBrief | DeclarationBrief = channel.receive()
        if isinstance(brief, DeclarationBrief):
            channel.send("declared", declare_attacks(brief))
            sys.exit(0)
        seed_globals(brief.globals_seed)
        attack, abi = build_attack(brief, channel)
        channel.send("ready", abi)
        serve(channel, attack)
    except (EOFError, BrokenPipeError, ConnectionResetError):
        sys.exit(0)  # the run is gone or stopped this worker
    except BaseException as err:  # noqa: BLE001 - the attack's failure, whatever it is, becomes one line for the run
        traceback.print_exc()
        line = (str(err).strip().splitlines() or [""])[0][:300]
        try:
            channel.send("failed", f"{type(err).__name__}: {line}" if line else type(err).__name__)
        except Exception:  # noqa: BLE001 - the run may be gone
            pass
        sys.exit(1)
    sys.exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])
