"""Helpers shared by several attacks: which record carries the uploads, the engine an attack trains on, a fresh
distillation student.

Like every attack module, this one sees only the attacker's side: round records, the attacker's view and the
:class:`~fdattack.attacks.base.AttackContext` the run lends.
"""

from __future__ import annotations

from typing import Optional

import torch

from fdattack.attacks.base import AttackContext
from fdattack.engine import LocalTrainer, ModelHandle, default_engine
from fdattack.fd.record import UPLOAD_PHASE, RoundRecord
from fdattack.fd.threat import AttackerView
from fdattack.lit.student import DistillationStudent


def is_communication(record: RoundRecord) -> bool:
    """Whether ``record`` is the one after the round's upload phase (its uploads are what the server received)."""
    return record.phase == UPLOAD_PHASE and bool(record.uploads) and record.batch is not None


def engine_or_default(context: AttackContext, batch_size: int) -> LocalTrainer:
    """The run's engine where the run lends one (its own batch size), else a single CPU process with ``batch_size``."""
    return context.engine if context.engine is not None else default_engine(batch_size)


def attack_engine(context: AttackContext, batch_size: int) -> LocalTrainer:
    """An engine for an attack's own training with ``batch_size``: on the run's Fabric where there is one, else a CPU process."""
    if context.engine is None:
        return default_engine(batch_size)
    return LocalTrainer(context.engine.fabric, batch_size, vectorise=context.engine.vectorise)


def new_student(
    engine: LocalTrainer, name: str, architecture: str, view: AttackerView, loss: str, lr: float, seed: int, state: Optional[dict] = None
) -> ModelHandle:
    """A :class:`DistillationStudent` of ``architecture`` seeded with ``seed`` (or holding ``state``), set up by ``engine``."""
    c, h, _ = view.image_shape
    torch.manual_seed(seed)
    module = DistillationStudent(architecture, view.num_classes, loss, lr, in_channels=c, image_size=h)  # type: ignore[arg-type]
    if state is not None:
        module.load_state_dict(state)
    return engine.setup(name, module)
