"""What the engine trains: a model handle, a job (data, objective, epochs, seed), its rows and batch order.

The trainer (:mod:`fdattack.engine.trainer`) and the vectorised path (:mod:`fdattack.engine.vectorised`) both take
these, so neither imports the other's internals.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Callable, Mapping, Protocol

import lightning as L
import torch
from torch import Tensor

from fdattack.data.imageset import ImageSet
from fdattack.lit.classifier import Objective


def epoch_order(n: int, seed: int, shuffle: bool = True) -> Tensor:
    """The row order of one epoch over ``n`` rows: a permutation seeded with ``seed``, or 0..n-1."""
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed)) if shuffle else torch.arange(n)


def has_batch_norm(module: torch.nn.Module) -> bool:
    """Whether ``module`` holds a BatchNorm layer (which cannot train on a mini-batch of one row)."""
    return any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in module.modules())


def without_lone_row(order: Tensor, batch_size: int) -> Tensor:
    """``order`` without the row that would form a last mini-batch on its own (FedAvg's B = 10 over 41 rows).

    BatchNorm raises on one row at a 1x1 feature map (MCNN's last block) and learns nothing from it elsewhere, so
    the engine drops that row from the epoch for models with BatchNorm, as ``drop_last`` would for this one case.
    """
    return order[:-1] if len(order) > 1 and len(order) % batch_size == 1 else order


def clear_gradients(handle: "ModelHandle") -> None:
    """Drop what the last step left behind: every parameter's ``.grad`` and the optimizers' state of that step (DP-SGD's
    per-sample gradients). A trained network then carries no trace of its last private mini-batch to whoever holds it."""
    for optimizer in handle.optimizers:
        optimizer.zero_grad(set_to_none=True)
    handle.module.zero_grad(set_to_none=True)


class Batchable(Protocol):
    """Rows that an epoch draws mini-batches from: :class:`~fdattack.data.imageset.ImageSet`, :class:`TensorRows`."""

    def __len__(self) -> int: ...

    def batch(self, indices: Tensor) -> Mapping[str, Tensor]: ...


class TensorRows:
    """Aligned tensors (same first dimension) as a :class:`Batchable`: ``TensorRows(input=p, x=images)``."""

    def __init__(self, **tensors: Tensor) -> None:
        lengths = {len(t) for t in tensors.values()}
        if len(lengths) != 1:
            raise ValueError(f"TensorRows needs tensors of one length, got {sorted(lengths)}")
        self.tensors = tensors

    def __len__(self) -> int:
        return len(next(iter(self.tensors.values())))

    def batch(self, indices: Tensor) -> dict[str, Tensor]:
        return {name: tensor[indices] for name, tensor in self.tensors.items()}


class _WithTargets:
    """An image set whose batches also carry the aligned soft targets (distillation phases)."""

    def __init__(self, data: ImageSet, targets: Tensor) -> None:
        self.data, self.targets = data, targets

    def __len__(self) -> int:
        return len(self.data)

    def batch(self, indices: Tensor) -> dict[str, Tensor]:
        return {**self.data.batch(indices), "target": self.targets[indices]}


@dataclass
class ModelHandle:
    """A LightningModule set up by Fabric, with its persistent optimizer(s).

    Attributes:
        name: ``"client3"``, ``"server"``, ``"pli_client2"`` ..., used in messages and checkpoints.
        module: the plain LightningModule (its weights are what a checkpoint stores).
        wrapped: the Fabric-wrapped module (DDP wrapper under ``strategy=ddp``).
        optimizers: the Fabric-wrapped optimizers of ``configure_optimizers``, kept across phases and rounds.
        wrap_optimizer: applied to every optimizer built for the module (a training defense's), or None.
    """

    name: str
    module: L.LightningModule
    wrapped: torch.nn.Module
    optimizers: list[torch.optim.Optimizer]
    wrap_optimizer: Callable[[torch.optim.Optimizer], torch.optim.Optimizer] | None = None

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        """The first (for most modules the only) optimizer."""
        return self.optimizers[0]

    def new_optimizers(self) -> list[torch.optim.Optimizer]:
        """Fresh optimizers from the module's ``configure_optimizers``, through :attr:`wrap_optimizer`."""
        built = self.module.configure_optimizers()
        optimizers = list(built) if isinstance(built, (list, tuple)) else [built]
        return optimizers if self.wrap_optimizer is None else [self.wrap_optimizer(o) for o in optimizers]

    def state_dict(self) -> dict:
        return {"model": self.module.state_dict(), "optimizer": [o.state_dict() for o in self.optimizers]}

    def load_state_dict(self, state: dict) -> None:
        self.module.load_state_dict(state["model"])
        saved = state["optimizer"] if isinstance(state["optimizer"], list) else [state["optimizer"]]
        for optimizer, optimizer_state in zip(self.optimizers, saved, strict=True):
            optimizer.load_state_dict(optimizer_state)


BatchSampler = Callable[[int, int, int], list[Tensor]]
"""``(rows n, epoch seed, batch size) -> the row indices of each step of one epoch`` (a batch may be empty)."""

FitSession = Callable[[ModelHandle], AbstractContextManager[ModelHandle]]
"""A scope around one job's epochs: given the job's model, it yields the handle to train (the same module, its
optimizer possibly wrapped) and undoes on exit what it set up (DP-SGD's per-sample gradient hooks)."""


@dataclass(frozen=True)
class PrivateSteps:
    """Every optimizer step of a job as DP-SGD takes it (Abadi et al. 2016, Alg. 1; opacus' ``DPOptimizer`` with
    ``loss_reduction="mean"``), described for the vectorised path, which then takes the steps itself.

    On a step's batch S (from the job's ``sampler``, e.g. Poisson sampling, or the shuffle): each row's gradient g_i
    (of the objective on that row alone) over all parameters together is clipped, ḡ_i = g_i · min(1, C / (‖g_i‖₂ + 1e-6)),
    and the step's gradient is g̃ = (Σ_{i∈S} ḡ_i + N(0, σ²C² I)) / E with E the expected batch size, whatever |S| is
    (an empty batch steps on the noise alone); the model's own optimizer then steps on g̃.

    Attributes:
        noise_multiplier: σ (0: clipping only, no noise drawn).
        max_grad_norm: C.
        expected_batch_size: E = q·n, the divisor of every step.
        noise_seed: seeds the job's noise generator (one for all its epochs; drawn parameter by parameter, as opacus).
        account: told the number of steps taken once the job is trained (the privacy accountant's record).
    """

    noise_multiplier: float
    max_grad_norm: float
    expected_batch_size: float
    noise_seed: int
    account: Callable[[int], None]


@dataclass
class FitJob:
    """One classifier trained for ``epochs`` over ``data`` with ``objective`` (the protocols' phases).

    Attributes:
        handle: the model to train (its module a :class:`~fdattack.lit.ClassifierLitModule`).
        data: the samples; rows of ``targets`` (if any) align with them and reach the objective as ``batch["target"]``.
        epochs: passes over ``data`` (0 = nothing).
        objective: the loss ``(logits, batch) -> scalar``.
        seed: shuffling seed; derive it from (run seed, round, phase, client) for exact resume.
        targets: (N, J) soft targets for distillation phases, or None.
        fresh_optimizer: start this phase from a new optimizer (PDA-FD's digest) instead of the kept one.
        sampler: draws each epoch's batches instead of the seeded shuffle (a training defense's: DP-SGD's Poisson
            sampling); seed it from its epoch seed so that runs reproduce and resume.
        session: wraps the job's epochs (a training defense's: DP-SGD's clipped, noised steps), or None.
        private: the steps ``session`` takes, described for the vectorised path (:class:`PrivateSteps`), or None. A job
            with it takes its ``sampler``'s batches and these steps there, without opening ``session``; the per-model
            loop opens ``session``, so both must describe one training.
    """

    handle: ModelHandle
    data: ImageSet
    epochs: int
    objective: Objective
    seed: int
    targets: Tensor | None = None
    fresh_optimizer: bool = False
    sampler: BatchSampler | None = None
    session: FitSession | None = None
    private: PrivateSteps | None = None

    def rows(self) -> Batchable:
        """What the epochs draw batches from: the samples, with ``target`` rows where the job has soft targets."""
        return self.data if self.targets is None else _WithTargets(self.data, self.targets)


@dataclass
class FitResult:
    """Optimizer steps taken and their mean loss (NaN where the module's steps return no loss)."""

    steps: int = 0
    mean_loss: float = float("nan")
