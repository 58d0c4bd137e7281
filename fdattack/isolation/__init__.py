"""Attacks in worker processes of their own (``isolation.mode=process``): the boundary that holds against attack code
written to cheat (docs/threat-model.md).

:mod:`~fdattack.isolation.proxy` is the run's side (it has the :mod:`~fdattack.isolation.zygote` fork a worker per
attack, feeds it records, answers its asks with the run's own objects and keeps its budget; the processes as
processes in :mod:`~fdattack.isolation.processes`, the budgets in :mod:`~fdattack.isolation.budgets`),
:mod:`~fdattack.isolation.worker` the worker's (confined by :mod:`~fdattack.isolation.sandbox`),
:mod:`~fdattack.isolation.wire` what travels between them and :mod:`~fdattack.isolation.codec` how the worker's
messages are read without unpickling them.
"""

from fdattack.isolation.budgets import Budget, concurrent_workers, worker_devices
from fdattack.isolation.processes import Zygote
from fdattack.isolation.proxy import IsolatedAttack, MemoryWatch, collect_round_ends
from fdattack.isolation.state import in_process_state
from fdattack.isolation.wire import AdversaryShape, WorkerBrief

__all__ = [
    "AdversaryShape",
    "Budget",
    "IsolatedAttack",
    "MemoryWatch",
    "WorkerBrief",
    "Zygote",
    "collect_round_ends",
    "concurrent_workers",
    "in_process_state",
    "worker_devices",
]
