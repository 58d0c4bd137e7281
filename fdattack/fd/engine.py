"""The one place where client and server models are trained and queried: Lightning Fabric.

Every training phase of every protocol goes through :class:`LocalTrainer`, so
``trainer.accelerator``, ``trainer.devices``, ``trainer.strategy=ddp`` and ``trainer.num_nodes``
apply to all of them. Fabric drives the same :class:`~fdattack.lit.ClassifierLitModule`'s
``training_step`` and ``configure_optimizers`` that ``lightning.Trainer`` would call, without a
Trainer per client-phase (``benchmarks/bench_engine.py`` measures the difference).

Protocols hand whole lists of jobs to :meth:`LocalTrainer.fit_many` and :meth:`LocalTrainer.predict_many`,
so a later vectorised path (same-architecture clients as one ``torch.func`` batch) replaces these two
loops without touching the protocols.

Under DDP every rank runs the same orchestration; each rank trains on its shard of every
mini-batch sequence (shards padded to equal length so ranks never wait on each other), gradients are
all-reduced by the DDP wrapper, and ranks therefore hold identical weights.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Callable, Sequence

import lightning as L
import torch
from lightning.fabric import Fabric
from torch import Tensor

from fdattack.data.imageset import ImageSet, IndexedBatch
from fdattack.lit.classifier import ClassifierLitModule, Objective


def derive_seed(*keys: object) -> int:
    """A 63-bit seed derived from ``keys`` (run seed, round, phase, client ...), stable across runs."""
    digest = hashlib.blake2b(repr(keys).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


@dataclass
class ModelHandle:
    """A LightningModule set up by Fabric, with its persistent optimizer.

    Attributes:
        name: ``"client3"`` or ``"server"``, used in messages and checkpoints.
        module: the plain LightningModule (its weights are what a checkpoint stores).
        wrapped: the Fabric-wrapped module (DDP wrapper under ``strategy=ddp``).
        optimizer: the Fabric-wrapped optimizer kept across phases and rounds.
        wrap_optimizer: applied to every optimizer built for the module (a training defense's), or None.
    """

    name: str
    module: ClassifierLitModule
    wrapped: torch.nn.Module
    optimizer: torch.optim.Optimizer
    wrap_optimizer: Callable[[torch.optim.Optimizer], torch.optim.Optimizer] | None = None

    def new_optimizer(self) -> torch.optim.Optimizer:
        """A fresh optimizer from the module's ``configure_optimizers``, through :attr:`wrap_optimizer`."""
        optimizer = self.module.configure_optimizers()
        return optimizer if self.wrap_optimizer is None else self.wrap_optimizer(optimizer)

    def state_dict(self) -> dict:
        return {"model": self.module.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.module.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])


@dataclass
class FitJob:
    """One model trained for ``epochs`` over ``data`` with ``objective``.

    Attributes:
        handle: the model to train.
        data: the samples; rows of ``targets`` (if any) align with them and reach the objective as ``batch["target"]``.
        epochs: passes over ``data`` (0 = nothing).
        objective: the loss ``(logits, batch) -> scalar``.
        seed: shuffling seed; derive it from (run seed, round, phase, client) for exact resume.
        targets: (N, J) soft targets for distillation phases, or None.
        fresh_optimizer: start this phase from a new optimizer (PDA-FD's digest) instead of the kept one.
    """

    handle: ModelHandle
    data: ImageSet
    epochs: int
    objective: Objective
    seed: int
    targets: Tensor | None = None
    fresh_optimizer: bool = False


@dataclass
class FitResult:
    """Optimizer steps taken and their mean loss."""

    steps: int = 0
    mean_loss: float = float("nan")


class LocalTrainer:
    """Trains and queries LightningModules through one Fabric instance.

    Args:
        fabric: a launched Fabric (see :func:`make_fabric`).
        batch_size: mini-batch size per device.
        predict_batch_size: batch size of inference passes.
    """

    def __init__(self, fabric: Fabric, batch_size: int, predict_batch_size: int = 512) -> None:
        self.fabric = fabric
        self.batch_size = batch_size
        self.predict_batch_size = predict_batch_size

    @property
    def is_global_zero(self) -> bool:
        return self.fabric.is_global_zero

    def setup(self, name: str, module: ClassifierLitModule,
              wrap_optimizer: Callable[[torch.optim.Optimizer], torch.optim.Optimizer] | None = None) -> ModelHandle:
        """Move ``module`` to the device, wrap it (DDP when asked) and build its optimizer (through ``wrap_optimizer``)."""
        optimizer = module.configure_optimizers()
        optimizer = optimizer if wrap_optimizer is None else wrap_optimizer(optimizer)
        wrapped, optimizer = self.fabric.setup(module, optimizer)
        return ModelHandle(name=name, module=module, wrapped=wrapped, optimizer=optimizer, wrap_optimizer=wrap_optimizer)

    # ---------------------------------------------------------------- training
    def _batches(self, data: ImageSet, seed: int) -> list[Tensor]:
        """This rank's mini-batch index lists for one epoch: a seeded permutation, sharded by rank."""
        n = len(data)
        generator = torch.Generator().manual_seed(seed)
        order = torch.randperm(n, generator=generator)
        world, rank = self.fabric.world_size, self.fabric.global_rank
        if world > 1:
            per_rank = -(-n // world)
            order = torch.cat([order, order[: per_rank * world - n]]) if per_rank * world > n else order
            order = order[rank::world]
        return list(torch.split(order, self.batch_size))

    def fit(self, job: FitJob) -> FitResult:
        """Run ``job.epochs`` epochs of ``job.objective`` on ``job.data`` (Lightning's training_step)."""
        result = FitResult()
        if job.epochs <= 0 or len(job.data) == 0:
            return result
        handle = job.handle
        if job.fresh_optimizer:
            handle.optimizer = self.fabric.setup_optimizers(handle.new_optimizer())
        handle.module.use_objective(job.objective)
        handle.wrapped.train()
        device = self.fabric.device
        images = job.data
        total = torch.zeros((), device=device)
        for epoch in range(job.epochs):
            for batch_idx, idx in enumerate(self._batches(images, derive_seed(job.seed, epoch))):
                batch = _to_device(images.batch(idx), job.targets, idx, device)
                loss = handle.wrapped.training_step(batch, batch_idx)
                handle.optimizer.zero_grad(set_to_none=True)
                self.fabric.backward(loss)
                handle.optimizer.step()
                total += loss.detach()
                result.steps += 1
        result.mean_loss = float(total) / max(result.steps, 1)
        return result

    def fit_many(self, jobs: Sequence[FitJob]) -> list[FitResult]:
        """Train several models, each on its own job (the client loop of every protocol)."""
        return [self.fit(job) for job in jobs]

    # ---------------------------------------------------------------- inference
    def predict(self, handle: ModelHandle, images: ImageSet | Tensor) -> Tensor:
        """Logits (N, J) of ``handle``'s model in eval mode, on CPU, for every row of ``images``."""
        x_all = images.images if isinstance(images, ImageSet) else images
        return predict_logits(handle.module, x_all, self.fabric.device, self.predict_batch_size)

    def predict_many(self, handles: Sequence[ModelHandle], images: ImageSet | Tensor) -> Tensor:
        """Stacked logits (K, N, J) of several models on the same images."""
        return torch.stack([self.predict(h, images) for h in handles])


@torch.no_grad()
def predict_logits(module: torch.nn.Module, images: Tensor, device: torch.device, batch_size: int) -> Tensor:
    """Logits (N, J) of ``module`` in eval mode (its mode is restored), on CPU, in batches of ``batch_size`` on ``device``."""
    was_training = module.training
    module.eval()
    outputs = [module(images[start : start + batch_size].to(device)).float().cpu() for start in range(0, images.shape[0], batch_size)]
    module.train(was_training)
    if not outputs:
        return torch.empty(0, 0)
    return torch.cat(outputs)


def _to_device(batch: IndexedBatch, targets: Tensor | None, idx: Tensor, device: torch.device) -> IndexedBatch:
    out = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
    if targets is not None:
        out["target"] = targets[idx].to(device, non_blocking=True)
    return out  # type: ignore[return-value]


def make_fabric(accelerator: str, devices: object, strategy: str, num_nodes: int, precision: str) -> Fabric:
    """Create and launch the Fabric that every phase uses (ranks are spawned or joined here)."""
    fabric = Fabric(accelerator=accelerator, devices=devices, strategy=strategy, num_nodes=num_nodes, precision=precision)  # type: ignore[arg-type]
    fabric.launch()
    return fabric


def seed_everything_quietly(seed: int) -> None:
    """Seed python, numpy and torch without Lightning's log line."""
    L.seed_everything(seed, workers=False, verbose=False)
