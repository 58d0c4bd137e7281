"""An isolated attack's budgets and the machine's share of them: its seconds and memory (:class:`Budget`), the largest
message it may send, the memory a worker holds alone, how many workers end a round at once and on which devices."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from fdattack.isolation import codec


@dataclass(frozen=True)
class Budget:
    """An attack's limits (``isolation.seconds``, ``isolation.memory_mb``); None = none."""

    seconds: Optional[float] = None
    memory_mb: Optional[int] = None


def message_limit(budget: Budget) -> int:
    """The most one message of a worker may hold: its memory budget, or :data:`~fdattack.isolation.codec.MAX_MESSAGE_BYTES`."""
    return codec.MAX_MESSAGE_BYTES if budget.memory_mb is None else min(codec.MAX_MESSAGE_BYTES, budget.memory_mb << 20)


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
