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
        time.sleep(10)
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
