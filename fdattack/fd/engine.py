"""The one place where models are trained and queried: Lightning Fabric.

Every training phase goes through :class:`LocalTrainer`: the protocols' clients and servers, the
attacks' networks (PLI's and TBI's inversion networks, the translation models of PLI's prior) and
the evaluation classifier, so ``trainer.accelerator``, ``trainer.precision``, ``trainer.devices``,
``trainer.strategy=ddp`` and ``trainer.num_nodes`` apply to all of them. Fabric drives any
LightningModule's own ``training_step`` and ``configure_optimizers``, with automatic optimisation (the
engine steps) or manual (the module steps, as under a ``lightning.Trainer``), without a Trainer per
phase (``benchmarks/bench_engine.py`` and ``bench_inversion.py`` measure the difference). Attacks get an
engine on a Fabric of their own: a Fabric keeps every module it set up, and the run's holds the clients.

Protocols hand whole lists of jobs to :meth:`LocalTrainer.fit_many` and :meth:`LocalTrainer.predict_many`.
With ``trainer.vectorise`` at ``auto`` (the default) or ``true``, same-architecture models among them train
and predict as one ``torch.func.vmap`` batch (:mod:`fdattack.fd.vectorised`), to float tolerance of the
per-model loop; what cannot (a training defense, an objective not declared vmappable, DDP, ...) takes the
loop, with one log line per reason and run.

Under DDP every rank runs the same orchestration; each rank trains on its shard of every
mini-batch sequence (shards padded to equal length so ranks never wait on each other), gradients are
all-reduced by the DDP wrapper, and ranks therefore hold identical weights. Attack training is
sharded the same way (not repeated on every rank, not left to rank 0): ``tests/test_ddp.py`` checks
that both ranks end with the same inversion network.
"""

from __future__ import annotations

import hashlib
import logging
import random
from collections import Counter, defaultdict
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from types import ModuleType
from typing import Callable, Mapping, Protocol, Sequence

import lightning as L
import numpy as np
import torch
from lightning.fabric import Fabric
from lightning.fabric.plugins.precision import Precision
from lightning.fabric.utilities.exceptions import MisconfigurationException
from torch import Tensor

from fdattack.data.imageset import ImageSet
from fdattack.errors import ConfigError
from fdattack.lit.classifier import Objective
from fdattack.lit.modes import eval_mode

log = logging.getLogger(__name__)


def derive_seed(*keys: object) -> int:
    """A 63-bit seed derived from ``keys`` (run seed, round, phase, client ...), stable across runs."""
    digest = hashlib.blake2b(repr(keys).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


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

    def rows(self) -> Batchable:
        """What the epochs draw batches from: the samples, with ``target`` rows where the job has soft targets."""
        return self.data if self.targets is None else _WithTargets(self.data, self.targets)


@dataclass
class FitResult:
    """Optimizer steps taken and their mean loss (NaN where the module's steps return no loss)."""

    steps: int = 0
    mean_loss: float = float("nan")


class LocalTrainer:
    """Trains and queries LightningModules through one Fabric instance.

    Args:
        fabric: a launched Fabric (see :func:`make_fabric`).
        batch_size: default mini-batch size per device.
        predict_batch_size: batch size of inference passes.
        vectorise: ``trainer.vectorise``: ``"auto"`` or ``True`` train and query same-architecture models of
            :meth:`fit_many` and :meth:`predict_many` as one vmapped batch where :mod:`~fdattack.fd.vectorised`
            applies; ``False`` runs one model at a time.
    """

    def __init__(self, fabric: Fabric, batch_size: int, predict_batch_size: int = 512, vectorise: str | bool = "auto") -> None:
        self.fabric = fabric
        self.batch_size = batch_size
        self.predict_batch_size = predict_batch_size
        self.vectorise = str(vectorise).lower()  # "auto", "true" or "false"
        self._told: set[str] = set()  # reasons already logged for taking the loop

    @property
    def is_global_zero(self) -> bool:
        return self.fabric.is_global_zero

    def setup(self, name: str, module: L.LightningModule,
              wrap_optimizer: Callable[[torch.optim.Optimizer], torch.optim.Optimizer] | None = None) -> ModelHandle:
        """Move ``module`` to the device, wrap it (DDP when asked) and build its optimizers (through ``wrap_optimizer``)."""
        handle = ModelHandle(name=name, module=module, wrapped=module, optimizers=[], wrap_optimizer=wrap_optimizer)
        wrapped, *optimizers = self.fabric.setup(module, *handle.new_optimizers())
        handle.wrapped, handle.optimizers = wrapped, list(optimizers)
        return handle

    def release(self, handle: ModelHandle) -> None:
        """Forget a module set up for one job (an attack's network of one round), so that Fabric does not keep it.

        Fabric registers every LightningModule it sets up as a callback and offers no way to undo it; without
        this, the networks an attack sets up every round would stay in memory for the whole run.
        """
        callbacks = self.fabric._callbacks
        if handle.module in callbacks:
            callbacks.remove(handle.module)

    # ---------------------------------------------------------------- training
    def _batches(self, n: int, seed: int, batch_size: int, shuffle: bool = True, lone_row: bool = True) -> list[Tensor]:
        """This rank's mini-batch index lists for one epoch: a seeded permutation (or 0..n-1), sharded by rank.

        Under DDP the order is padded to a multiple of the world size, so that every rank's shard has the same length
        and every rank takes the same number of steps. ``lone_row=False`` then drops a last batch of one row from the
        shard (:func:`without_lone_row`; equal shards drop alike).
        """
        order = epoch_order(n, seed, shuffle)
        world, rank = self.fabric.world_size, self.fabric.global_rank
        if world > 1:
            per_rank = -(-n // world)
            order = torch.cat([order, order[: per_rank * world - n]]) if per_rank * world > n else order
            order = order[rank::world]
        if not lone_row:
            order = without_lone_row(order, batch_size)
        return list(torch.split(order, batch_size))

    def fit_module(self, handle: ModelHandle, data: Batchable, epochs: int, seed: int, batch_size: int | None = None,
                   shuffle: bool = True, sampler: BatchSampler | None = None) -> FitResult:
        """Run ``epochs`` epochs of the module's own ``training_step`` over ``data``.

        With automatic optimisation the engine takes the step (zero_grad, ``fabric.backward``, step) on the
        module's single optimizer; with ``automatic_optimization = False`` the module's training_step steps
        its own optimizers (``self.optimizers()``, ``self.manual_backward``), as under a ``lightning.Trainer``.
        Epoch e shuffles with ``derive_seed(seed, e)``, or draws its batches with ``sampler`` given that seed (not
        sharded over DDP ranks). An empty batch is still a step; its loss does not count in the mean loss. A module
        with BatchNorm skips a last batch of one row (:func:`without_lone_row`).
        """
        result = FitResult()
        if epochs <= 0 or len(data) == 0:
            return result
        module, device = handle.module, self.fabric.device
        automatic = module.automatic_optimization
        handle.wrapped.train()
        total, losses = torch.zeros((), device=device), 0
        lone_row = not has_batch_norm(module)
        draw = sampler or (lambda n, epoch_seed, size: self._batches(n, epoch_seed, size, shuffle, lone_row))
        for epoch in range(epochs):
            for batch_idx, idx in enumerate(draw(len(data), derive_seed(seed, epoch), batch_size or self.batch_size)):
                batch = {k: v.to(device, non_blocking=True) for k, v in data.batch(idx).items()}
                loss = handle.wrapped.training_step(batch, batch_idx)
                if automatic:
                    handle.optimizer.zero_grad(set_to_none=True)
                    self.fabric.backward(loss)
                    handle.optimizer.step()
                if isinstance(loss, Tensor) and len(idx):
                    total += loss.detach()
                    losses += 1
                result.steps += 1
        clear_gradients(handle)
        self._share_buffers(module)
        result.mean_loss = float(total) / losses if losses else float("nan")
        return result

    def _share_buffers(self, module: torch.nn.Module) -> None:
        """Under DDP, give every rank rank 0's buffers (BatchNorm statistics), as DDP does before each forward.

        Parameters agree through the all-reduced gradients; buffers are updated by each rank's own shard, so
        without this the ranks would leave a phase with different running statistics.
        """
        if self.fabric.world_size > 1:
            for buffer in module.buffers():
                torch.distributed.broadcast(buffer.data, src=0)

    def fit(self, job: FitJob) -> FitResult:
        """Run ``job.epochs`` epochs of ``job.objective`` on ``job.data`` (a classifier's training_step)."""
        if job.epochs <= 0 or len(job.data) == 0:
            return FitResult()
        self._prepare(job)
        with job.session(job.handle) if job.session is not None else nullcontext(job.handle) as handle:
            return self.fit_module(handle, job.rows(), job.epochs, job.seed, sampler=job.sampler)

    def _prepare(self, job: FitJob) -> None:
        """The job's fresh optimizer (if it asks for one) and objective."""
        handle = job.handle
        if job.fresh_optimizer:
            fresh = self.fabric.setup_optimizers(*handle.new_optimizers())
            handle.optimizers = list(fresh) if isinstance(fresh, (list, tuple)) else [fresh]
        handle.module.use_objective(job.objective)  # type: ignore[operator]

    def fit_many(self, jobs: Sequence[FitJob]) -> list[FitResult]:
        """Train several models, each on its own job (the client loop of every protocol, LiRA's shadow students).

        Same-architecture models whose jobs agree on objective, optimizer settings and epochs train as one
        vmapped batch (:func:`fdattack.fd.vectorised.fit_copies`) unless ``vectorise="false"``; the others one at
        a time. Either way each model takes the same seeded steps (to float tolerance).
        """
        from fdattack.fd import vectorised  # imported here: it builds on this module

        results: list[FitResult | None] = [None] * len(jobs)
        for group in self._groups(jobs, vectorised):
            for i in group:
                self._prepare(jobs[i])
            for i, result in zip(group, vectorised.fit_copies([jobs[i] for i in group], self.batch_size, self.fabric.device)):
                results[i] = result
        return [self.fit(job) if result is None else result for job, result in zip(jobs, results)]

    def _groups(self, jobs: Sequence[FitJob], vectorised: ModuleType) -> list[list[int]]:
        """Indices of the jobs of ``fit_many`` that train together, in groups of two or more; the rest take the loop."""
        active = [i for i, job in enumerate(jobs) if job.epochs > 0 and len(job.data) > 0]
        if len(active) < 2 or not self._vectorising():
            return []
        uses = Counter(id(jobs[i].handle) for i in active)
        groups: dict[tuple, list[int]] = defaultdict(list)
        for i in active:
            job = jobs[i]
            reason = ("a model appears in several jobs" if uses[id(job.handle)] > 1
                      else "a training defense draws the batches or takes the steps" if job.sampler or job.session
                      else vectorised.unsupported(job))
            if reason is None:
                groups[vectorised.group_key(job)].append(i)
            else:
                self._tell(reason)
        return [group for group in groups.values() if len(group) > 1]

    def _vectorising(self) -> bool:
        """Whether ``vectorise`` asks for the vectorised path and this run can take it (else logs why not, once)."""
        if self.vectorise == "false":
            return False
        if self.fabric.world_size > 1:
            self._tell(f"under DDP ({self.fabric.world_size} processes) every rank trains its shard of each model")
            return False
        if type(self.fabric.strategy.precision) is not Precision:
            self._tell("trainer.precision is not 32-true")
            return False
        return True

    def _tell(self, reason: str) -> None:
        if reason not in self._told:
            self._told.add(reason)
            log.info("trainer.vectorise=%s: training one model at a time where %s", self.vectorise, reason)

    # ---------------------------------------------------------------- inference
    def predict(self, handle: ModelHandle, images: ImageSet | Tensor) -> Tensor:
        """Logits (N, J) of ``handle``'s model in eval mode, on CPU, for every row of ``images``."""
        x_all = images.images if isinstance(images, ImageSet) else images
        return predict_logits(handle.module, x_all, self.fabric.device, self.predict_batch_size)

    def predict_many(self, handles: Sequence[ModelHandle], images: ImageSet | Tensor) -> Tensor:
        """Stacked logits (K, N, J) of several models on the same images (same-architecture ones as one vmapped batch)."""
        from fdattack.fd import vectorised  # imported here: it builds on this module

        x_all = images.images if isinstance(images, ImageSet) else images
        groups: dict[tuple, list[int]] = defaultdict(list)
        if self.vectorise != "false":
            for i, h in enumerate(handles):
                if h.wrap_optimizer is None and vectorised.is_plain_classifier(h.module):  # no training defense around the network
                    groups[vectorised.architecture(h.module)].append(i)
        logits: list[Tensor | None] = [None] * len(handles)
        for rows in groups.values():
            if len(rows) > 1:
                stacked = vectorised.predict_copies([handles[i].module for i in rows], x_all, self.fabric.device)
                for i, out in zip(rows, stacked):
                    logits[i] = out
        return torch.stack([self.predict(h, x_all) if out is None else out for h, out in zip(handles, logits)])


@torch.no_grad()
def predict_logits(module: torch.nn.Module, images: Tensor, device: torch.device, batch_size: int) -> Tensor:
    """Logits (N, J) of ``module`` in eval mode (its mode is restored), on CPU, in batches of ``batch_size`` on ``device``."""
    with eval_mode(module):
        outputs = [module(images[start : start + batch_size].to(device)).float().cpu() for start in range(0, images.shape[0], batch_size)]
    if not outputs:
        return torch.empty(0, 0)
    return torch.cat(outputs)


def make_fabric(accelerator: str, devices: object, strategy: str, num_nodes: int, precision: str) -> Fabric:
    """Create and launch the Fabric that every phase uses (ranks are spawned or joined here).

    Raises:
        ConfigError: Lightning refuses the combination (``fdattack.config.validation.check_trainer`` has
            already checked each ``trainer.*`` key alone; this catches what only Lightning knows, e.g. a
            strategy or precision whose package is not installed).
    """
    try:
        fabric = Fabric(accelerator=accelerator, devices=devices, strategy=strategy, num_nodes=num_nodes, precision=precision)  # type: ignore[arg-type]
    except (ImportError, TypeError, ValueError, RuntimeError, MisconfigurationException) as err:  # e.g. a missing deepspeed
        given = f"accelerator={accelerator!r}, devices={devices!r}, strategy={strategy!r}, num_nodes={num_nodes}, precision={precision!r}"
        raise ConfigError(f"trainer ({given}): Lightning refuses it: {' '.join(str(err).split())}") from None
    fabric.launch()
    return fabric


def default_engine(batch_size: int = 64, vectorise: str | bool = "auto") -> LocalTrainer:
    """A single-process CPU engine, for attacks and modules used outside a run."""
    return LocalTrainer(make_fabric("cpu", 1, "auto", 1, "32-true"), batch_size=batch_size, vectorise=vectorise)


def seed_everything_quietly(seed: int) -> None:
    """Seed python, numpy and torch with ``seed`` (Lightning's ``seed_everything`` without its log line), so that nothing
    in the process reports the run seed back, from which the run's secrets derive: no environment variable holds it
    (Lightning's writes ``PL_GLOBAL_SEED``), and ``torch.initial_seed()`` answers a seed derived from it while the CPU
    generator draws exactly the run seed's stream (:func:`report_initial_seed`). GPUs draw from a derived seed."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(derive_seed(seed, "cuda"))
    report_initial_seed(derive_seed(seed, "reported"))


def report_initial_seed(reported: int) -> None:
    """Make ``torch.initial_seed()`` answer ``reported`` without changing the CPU generator's stream: the seed is the
    first 8 bytes (little-endian) of the generator's state, which the stream does not read."""
    state = torch.get_rng_state()
    state[:8] = torch.tensor(list(reported.to_bytes(8, "little")), dtype=torch.uint8)
    torch.set_rng_state(state)
