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
and predict as one ``torch.func.vmap`` batch (:mod:`fdattack.engine.vectorised`), to float tolerance of the
per-model loop; what cannot (a training defense, an objective not declared vmappable, DDP, ...) takes the
loop, with one log line per reason and run. DP-SGD's jobs, which describe their steps (:class:`~fdattack.engine.jobs.PrivateSteps`),
train there too, as one vmapped per-sample gradient computation (:mod:`fdattack.engine.vectorised.private`).

Under DDP every rank runs the same orchestration; each rank trains on its shard of every
mini-batch sequence (shards padded to equal length so ranks never wait on each other), gradients are
all-reduced by the DDP wrapper, and ranks therefore hold identical weights. Attack training is
sharded the same way (not repeated on every rank, not left to rank 0): ``tests/test_ddp.py`` checks
that both ranks end with the same inversion network.
"""

from __future__ import annotations

import logging
from collections import Counter, defaultdict
from contextlib import nullcontext
from pathlib import Path
from typing import Callable, Sequence

import lightning as L
import torch
from lightning.fabric import Fabric
from lightning.fabric.plugins.precision import Precision
from lightning.fabric.utilities.exceptions import MisconfigurationException
from torch import Tensor

from fdattack.code_version import source_digest
from fdattack.data.imageset import ImageSet
from fdattack.engine import vectorised
from fdattack.engine.jobs import (
    Batchable,
    BatchSampler,
    FitJob,
    FitResult,
    ModelHandle,
    clear_gradients,
    epoch_order,
    has_batch_norm,
    without_lone_row,
)
from fdattack.errors import ConfigError
from fdattack.lit.modes import eval_mode
from fdattack.randomness import derive_seed

log = logging.getLogger(__name__)


class LocalTrainer:
    """Trains and queries LightningModules through one Fabric instance.

    Args:
        fabric: a launched Fabric (see :func:`make_fabric`).
        batch_size: default mini-batch size per device.
        predict_batch_size: batch size of inference passes.
        vectorise: ``trainer.vectorise``: ``"auto"`` or ``True`` train and query same-architecture models of
            :meth:`fit_many` and :meth:`predict_many` as one vmapped batch where :mod:`~fdattack.engine.vectorised`
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

    def recipe(self) -> dict[str, object]:
        """What a fit reads from this engine besides its job, for the key of a cached network: the default batch size,
        the vectorised path, the processes, the device's kind, the precision and the engine's own code."""
        precision = self.fabric.strategy.precision
        return {
            "batch_size": self.batch_size,
            "vectorise": self.vectorise,
            "world_size": self.fabric.world_size,
            "device": self.fabric.device.type,
            "precision": f"{type(precision).__name__}:{getattr(precision, 'precision', '')}",
            "code": source_digest(Path(__file__).parent),
        }

    def setup(
        self, name: str, module: L.LightningModule, wrap_optimizer: Callable[[torch.optim.Optimizer], torch.optim.Optimizer] | None = None
    ) -> ModelHandle:
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
        and every rank takes the same number of steps. ``lone_row=False`` (a module with BatchNorm) then drops a last
        batch of one row from the shard (:func:`without_lone_row`), and a shard of one row altogether: no batch, no
        step (equal shards drop alike).
        """
        order = epoch_order(n, seed, shuffle)
        world, rank = self.fabric.world_size, self.fabric.global_rank
        if world > 1:
            per_rank = -(-n // world)
            order = torch.cat([order, order[: per_rank * world - n]]) if per_rank * world > n else order
            order = order[rank::world]
        if not lone_row:
            order = without_lone_row(order, batch_size)
            if len(order) == 1:
                return []
        return list(torch.split(order, batch_size))

    def fit_module(
        self,
        handle: ModelHandle,
        data: Batchable,
        epochs: int,
        seed: int,
        batch_size: int | None = None,
        shuffle: bool = True,
        sampler: BatchSampler | None = None,
    ) -> FitResult:
        """Run ``epochs`` epochs of the module's own ``training_step`` over ``data``.

        With automatic optimisation the engine takes the step (zero_grad, ``fabric.backward``, step) on the
        module's single optimizer; with ``automatic_optimization = False`` the module's training_step steps
        its own optimizers (``self.optimizers()``, ``self.manual_backward``), as under a ``lightning.Trainer``.
        Epoch e shuffles with ``derive_seed(seed, e)``, or draws its batches with ``sampler`` given that seed (not
        sharded over DDP ranks). An empty batch is still a step; its loss does not count in the mean loss. A module
        with BatchNorm skips a last batch of one row (:func:`without_lone_row`), and takes no step on one row in all
        (a client holding a single private sample): BatchNorm cannot train on a batch of one.
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
        vmapped batch (:func:`fdattack.engine.vectorised.fit_copies`, or :func:`~fdattack.engine.vectorised.fit_private_copies`
        for jobs with DP-SGD's private steps) unless ``vectorise="false"``; the others one at a time (a lone private job
        through its ``session``). Either way each model takes the same seeded steps (to float tolerance).
        """

        results: list[FitResult | None] = [None] * len(jobs)
        for group in self._groups(jobs):
            for i in group:
                self._prepare(jobs[i])
            fit = vectorised.fit_copies if jobs[group[0]].private is None else vectorised.fit_private_copies
            for i, result in zip(group, fit([jobs[i] for i in group], self.batch_size, self.fabric.device)):
                results[i] = result
        return [self.fit(job) if result is None else result for job, result in zip(jobs, results)]

    def _groups(self, jobs: Sequence[FitJob]) -> list[list[int]]:
        """Indices of the jobs of ``fit_many`` that train together, in groups of two or more; the rest take the loop (a
        BatchNorm network's job on one row among them, which takes no step there)."""
        fewest = {id(job): 2 if has_batch_norm(job.handle.module) else 1 for job in jobs}
        active = [i for i, job in enumerate(jobs) if job.epochs > 0 and len(job.data) >= fewest[id(job)]]
        if len(active) < 2 or not self._vectorising():
            return []
        uses = Counter(id(jobs[i].handle) for i in active)
        groups: dict[tuple, list[int]] = defaultdict(list)
        for i in active:
            job = jobs[i]
            reason = (
                "a model appears in several jobs"
                if uses[id(job.handle)] > 1
                else "a training defense draws the batches or takes the steps"
                if (job.sampler or job.session) and job.private is None
                else vectorised.unsupported(job, self.fabric.device)
            )
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
