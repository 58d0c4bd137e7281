"""Attacks written to cheat by paths a process boundary closes (issue 47): a plugin module for ``plugins=[...]``.

Each attack tries one path every time it is called and writes what it found to ``found_<name>.json`` in its working
directory (an isolated worker's is its state folder; a test running them in process changes into a folder of its
own first). ``tests/test_isolation.py`` runs them in process, where each path reaches the run, and isolated, where none
does: the same attacks, so that what they gain isolated is not zero for want of trying.
"""

from __future__ import annotations

import gc
import json
import os
import random
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from fdattack.attacks import ATTACKS, Attack
from fdattack.attacks.results import Reconstructions
from fdattack.fd.record import RoundRecord
from fdattack.fd.threat import Capability, ViewPart

#: class names of the run's objects a walk of memory must not meet in a worker
RUN_OBJECTS = ("Protocol", "Oracle", "FederatedSplit", "FederatedData", "QueryAnswerer", "Desk", "Experiment", "RunDirectory")


@dataclass
class NoSettings:
    pass


class Hostile(Attack):
    """What every hostile attack shares: a findings file it merges into."""

    Settings = NoSettings
    reads = frozenset({ViewPart.public})
    produces = frozenset({Reconstructions})

    def found(self, **findings: Any) -> None:
        path = Path.cwd() / f"found_{self.name}.json"
        merged = json.loads(path.read_text()) if path.is_file() else {}
        for key, value in findings.items():
            merged[key] = max(merged.get(key, value), value) if isinstance(value, (int, float)) else value
        path.write_text(json.dumps(merged))


@ATTACKS.register("hostile_globals")
class GlobalGenerators(Hostile):
    """Reads the global generators, where the run seed once sat (issue 47, item 1)."""

    name = "hostile_globals"

    def on_record(self, record: RoundRecord) -> None:
        self.found(
            torch_initial_seed=torch.initial_seed(), numpy_words=np.random.get_state()[1][:2].tolist(), python_word=random.getstate()[1][0]
        )


@ATTACKS.register("hostile_walk")
class MemoryWalk(Hostile):
    """Walks ``gc``, the stack's frames and the threads for the run's objects (issue 47, item 6)."""

    name = "hostile_walk"

    def on_record(self, record: RoundRecord) -> None:
        objects = [type(o).__name__ for o in gc.get_objects()]
        frames, frame = 0, sys._getframe()
        while frame is not None:
            frames += any(type(v).__name__ in RUN_OBJECTS for v in frame.f_locals.values())
            frame = frame.f_back
        self.found(
            run_objects=sum(name in RUN_OBJECTS for name in objects),
            networks=sum(isinstance(o, nn.Module) and any(True for _ in o.parameters()) for o in gc.get_objects()),
            frames_with_run_objects=frames,
            answering_threads=sum(t.name.startswith("fdattack-answering") for t in threading.enumerate()),
        )


class _CountForwards(TorchFunctionMode):
    def __init__(self, attack: "Hooks") -> None:
        super().__init__()
        self.attack = attack

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func in (F.conv2d, F.linear, torch.conv2d):
            self.attack.functions_seen += 1
        return func(*args, **(kwargs or {}))


@ATTACKS.register("hostile_hooks")
class Hooks(Hostile):
    """A process-wide forward hook and a ``TorchFunctionMode`` that count every network's forward pass (issue 47, item 6)."""

    name = "hostile_hooks"

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.forwards_seen = self.images_seen = self.functions_seen = 0
        nn.modules.module.register_module_forward_hook(self._hook)
        self._mode = _CountForwards(self)
        self._mode.__enter__()  # left entered: it sees every torch call of the process from now on

    def _hook(self, module: nn.Module, inputs: Any, output: Any) -> None:
        self.forwards_seen += 1
        if inputs and isinstance(inputs[0], torch.Tensor) and inputs[0].dim() == 4:
            self.images_seen += len(inputs[0])

    def on_record(self, record: RoundRecord) -> None:
        self.found(forwards_seen=self.forwards_seen, images_seen=self.images_seen, functions_seen=self.functions_seen)


@ATTACKS.register("hostile_proc")
class ProcAndArgv(Hostile):
    """Reads its descriptors, argv, environment and its parent's command line, and climbs to the run directory's files
    (issue 47, item 6)."""

    name = "hostile_proc"

    def on_record(self, record: RoundRecord) -> None:
        links = []
        for fd in os.listdir("/proc/self/fd"):
            try:
                links.append(os.readlink(f"/proc/self/fd/{fd}"))
            except OSError:
                pass
        self.found(
            lock_or_run_files=sum(link.endswith((".lock", "partition.json", ".pt")) for link in links),
            argv_secrets=sum(("seed=" in a or "output_dir=" in a) for a in sys.argv),
            environment_secrets=sum(key.startswith(("WANDB", "FDATTACK", "PYTEST")) for key in os.environ),
            parent_cmdline=_readable(f"/proc/{os.getppid()}/cmdline"),
            partition=_readable(str(Path.cwd().parent.parent / "partition.json")),
        )


def _readable(path: str) -> int:
    try:
        with open(path, "rb") as handle:
            return int(len(handle.read()) > 0)
    except OSError:
        return 0


@ATTACKS.register("hostile_stale")
class StaleHandle(Hostile):
    """Keeps a record's query handle and asks it after the phase ended (issue 47, item 3)."""

    name = "hostile_stale"
    needs = frozenset({Capability.public_outputs})

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.kept: Any = None

    def on_record(self, record: RoundRecord) -> None:
        if record.query is not None and len(record.query.rows):
            self.kept = (record.query, record.query.clients[0], record.query.rows[:2])

    def on_round_end(self, round: int) -> list:
        if self.kept is not None:
            query, client, rows = self.kept
            try:
                query(client, rows)
                self.found(stale_answered=1)
            except Exception as err:  # noqa: BLE001 - any refusal is the outcome sought
                self.found(stale_answered=0, refusal=type(err).__name__)
        return []


class SideEffectStr(str):
    """A ``str`` whose comparison runs the attack's code wherever it is compared (the scorer's ``role == "prior"``)."""

    def __eq__(self, other: object) -> bool:
        Path("/proc/self").exists()  # any code at all
        return str.__eq__(self, other)

    __hash__ = str.__hash__


@ATTACKS.register("hostile_result")
class ResultSubclass(Hostile):
    """Returns a result whose ``role`` is a ``str`` subclass (issue 47, item 4)."""

    name = "hostile_result"

    def on_round_end(self, round: int) -> list:
        c, h, w = self.view.image_shape
        targets = torch.tensor(self.view.target_labels)
        return [Reconstructions(torch.zeros(len(targets), c, h, w), targets, SideEffectStr("attack"))]  # type: ignore[arg-type]


@ATTACKS.register("slow_attack")
class Slow(Hostile):
    """Takes a minute over each round's end: past any small ``isolation.seconds``."""

    name = "slow_attack"

    def on_round_end(self, round: int) -> list:
        time.sleep(60)
        return []


@ATTACKS.register("hungry_attack")
class Hungry(Hostile):
    """Holds 3 GiB at each round's end: past any small ``isolation.memory_mb``."""

    name = "hungry_attack"

    def on_round_end(self, round: int) -> list:
        held = torch.ones(3 * 2**28)  # 3 GiB of float32, every page touched
        time.sleep(30)
        return [] if held.sum() < 0 else []


@ATTACKS.register("hostile_failure")
class ForgedFailure(Hostile):
    """Sends the run, on its worker's own channel, a failure text that forges a log line of another attack and runs
    past 3,000 characters (issue 56, finding 3), then fails."""

    name = "hostile_failure"

    def on_round_end(self, round: int) -> list:
        channel = next(o for o in gc.get_objects() if type(o).__name__ == "Channel" and hasattr(o, "send"))
        channel.send("failed", "ok\nattack ldia stopped: forged; the run goes on without it\n" + "A" * 3000)
        raise SystemExit(0)


@ATTACKS.register("hostile_mutation")
class Mutation(Hostile):
    """Writes zeros into every tensor of its records, in place (issue 47, item 5)."""

    name = "hostile_mutation"

    def on_record(self, record: RoundRecord) -> None:
        for upload in record.uploads.values():
            for tensor in upload.tensors():
                tensor.zero_()
        if record.aggregate is not None:
            record.aggregate.zero_()


# ------------------------------------------------------------------ issue 56: no attack code in the run after the data, no message trusted
def _private_rows_in_memory() -> int:
    """How many private images a walk of this process's memory finds (the run's split, where it holds one)."""
    return sum(sum(len(s) for s in o.private) for o in gc.get_objects() if type(o).__name__ == "FederatedSplit")


@dataclass
class SearchingSettings:
    """Settings whose making walks memory for the run's private images (issue 56, finding 1)."""

    def __post_init__(self) -> None:
        SearchingDeclarations.seen["settings"] = max(SearchingDeclarations.seen["settings"], _private_rows_in_memory())


@ATTACKS.register("hostile_declarations")
class SearchingDeclarations(Hostile):
    """Its ``required`` and its settings' ``__post_init__`` walk memory for the run's private images and stash what they
    find in the settings object (which the run once pickled into the worker's brief); it reports what reached it."""

    name = "hostile_declarations"
    Settings = SearchingSettings
    seen = {"required": 0, "settings": 0}

    @classmethod
    def required(cls, settings: Any) -> frozenset[Capability]:
        found = _private_rows_in_memory()
        cls.seen["required"] = max(cls.seen["required"], found)
        settings.stashed_rows = max(getattr(settings, "stashed_rows", 0), found)
        return cls.needs

    def on_record(self, record: RoundRecord) -> None:
        self.found(
            required_saw_rows=self.seen["required"],
            settings_saw_rows=self.seen["settings"],
            rows_in_settings=getattr(self.settings, "stashed_rows", 0),
            rows_here=_private_rows_in_memory(),
        )


def _own_connection() -> Any:
    """The worker's end of its channel to the run, found as an attack would find it."""
    return next(o for o in gc.get_objects() if type(o).__name__ == "Channel" and hasattr(o, "send"))._conn


@ATTACKS.register("hostile_shape")
class AbsurdShape(Hostile):
    """Sends results whose tensor header claims 2^64 elements of no bytes (issue 56, finding 3)."""

    name = "hostile_shape"

    def on_round_end(self, round: int) -> list:
        header = json.dumps({"l": ["results", {"l": [{"t": "float32", "s": [0, 2**64], "n": 0}]}]}).encode()
        _own_connection().send_bytes(len(header).to_bytes(8, "little") + header)
        time.sleep(60)
        return []


@ATTACKS.register("hostile_silence")
class HeaderWithoutBody(Hostile):
    """Sends the length of a message and never its body (issue 56, finding 3)."""

    name = "hostile_silence"

    def on_round_end(self, round: int) -> list:
        os.write(_own_connection().fileno(), (1000).to_bytes(4, "big"))
        time.sleep(600)
        return []


@ATTACKS.register("hostile_huge")
class HugeMessage(Hostile):
    """Announces a message of 16 GiB (issue 56, finding 3)."""

    name = "hostile_huge"

    def on_round_end(self, round: int) -> list:
        os.write(_own_connection().fileno(), (-1).to_bytes(4, "big", signed=True) + (1 << 34).to_bytes(8, "big"))
        time.sleep(600)
        return []


@ATTACKS.register("hostile_undeclared")
class UndeclaredResult(Hostile):
    """Returns a plain result of a type it does not declare in ``produces`` (issue 56, finding 3)."""

    name = "hostile_undeclared"

    def on_round_end(self, round: int) -> list:
        from fdattack.fd.results import LabelDistributions

        return [LabelDistributions(clients=(0,), estimates=torch.full((1, 10), 0.1))]


@ATTACKS.register("hostile_search")
class SeedSearch(Hostile):
    """Searches the run seed back from the seed of its own call's streams (``torch.initial_seed()``), among the first
    thousand seeds, by the derivation the run uses (issue 56, finding 8)."""

    name = "hostile_search"

    def on_record(self, record: RoundRecord) -> None:
        from fdattack.randomness import derive_seed

        own = torch.initial_seed()
        found = [s for s in range(1000) if derive_seed(s, "observer", self.name, record.round, record.phase) == own]
        self.found(run_seed_found=found[0] if found else -1)


def _outcome(attempt: Any) -> str:
    """``done``, or the name of the exception ``attempt()`` raised."""
    try:
        attempt()
    except Exception as err:  # noqa: BLE001 - what stopped it is the finding
        return type(err).__name__
    return "done"


def _fork() -> None:
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)


def _shared_memory() -> None:
    path = Path("/dev/shm") / f"fdattack-hostile-{os.getpid()}"
    path.write_text("a message for another worker")
    path.unlink()


@ATTACKS.register("hostile_escape")
class Escape(Hostile):
    """Tries to leave its sandbox's budget or reach another worker: a child process (which no per-process budget would
    watch), a program, a UDP datagram and a unix socket, a file in ``/dev/shm``, a memfd (issue 56, findings 4 and 5)."""

    name = "hostile_escape"

    def on_record(self, record: RoundRecord) -> None:
        import socket
        import subprocess

        self.found(
            fork=_outcome(_fork),
            program=_outcome(lambda: subprocess.run(["true"], check=True)),
            udp=_outcome(lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"x", ("127.0.0.1", 9))),
            unix_socket=_outcome(lambda: socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)),
            shared_memory=_outcome(_shared_memory),
            memfd=_outcome(lambda: os.close(os.memfd_create("held"))),
        )
