"""DP-SGD steps of N copies of one network as one vmapped per-sample gradient computation.

A job that carries :class:`~fdattack.engine.jobs.PrivateSteps` trains with DP-SGD (Abadi et al. 2016, Alg. 1) as opacus'
``DPOptimizer`` takes it (``loss_reduction="mean"``, flat clipping): per step, every row i of the batch S gets its
own gradient g_i, the gradient of the objective on that row alone; each is clipped over all parameters together,
ḡ_i = g_i · min(1, C / (‖g_i‖₂ + 1e-6)); Gaussian noise N(0, σ²C² I) is added to Σ_{i∈S} ḡ_i and the sum divided by
the expected batch size E (not by |S|: under Poisson sampling |S| varies and may be 0); the model's own Adam or SGD
then steps on the result. For an objective that is a mean over rows (cross-entropy on a labeled set, L1 or KL to
soft targets) g_i is opacus' per-sample gradient, |S| times the gradient of the batch loss with respect to row i (an
unlabeled row alone has no cross-entropy: DP-SGD's phases train on the clients' labeled private sets).

Here every step of all models is one computation: ``vmap`` over the models of ``vmap`` over the rows of
``grad_and_value`` of the one-row loss (:func:`torch.func.grad_and_value`), on the stacked weights of
:mod:`~fdattack.engine.vectorised.copies` with its CPU layers. Where only the rows are vmapped, those layers take a
model's rows as more rows of one product instead of copying its weights per row, and a convolution that takes the
data and the max-pool after it run fused over the rows of all calls, each row's kernel gradient from its chunk's
columns and dense pool gradient (:mod:`~fdattack.engine.vectorised.kernels.conv_pool`, ``per_sample``). A linear layer
that sees one vector a row is ghost-clipped (:mod:`~fdattack.engine.vectorised.ghost`): its per-row weight gradient
δ_i a_iᵀ is never formed, its norm and the clipped sum come from δ_i and a_i. ``benchmarks/bench_dpsgd.py``: pli_cnn
on MNIST takes 0.10 ms a row on one CPU thread at K = 10 (0.17 ms when every per-row weight gradient was formed and
the linear layer's input gradient copied the weight per row).
Each model draws its own batches (the job's
``sampler``, e.g. opacus' Poisson sampling, else the seeded shuffle), so a step's batches differ in size: they are
padded to the largest and the padding masked out of the sums (a model whose batch is empty steps on the noise alone,
as under opacus); a model whose epoch has fewer steps sits out the others' last ones. The per-sample gradients are
computed, clipped and summed a block of (models x rows) at a time, so they never all exist at once. The noise comes
from one generator per job seeded with its ``noise_seed``, drawn parameter by parameter in the network's order, as
opacus draws it: given the same batches, the per-model loop (opacus) and this path take the same steps up to float
rounding, noise included.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor
from torch.func import functional_call, grad_and_value, vmap

from fdattack.engine.jobs import FitJob, FitResult, PrivateSteps, epoch_order
from fdattack.engine.vectorised.copies import (
    DEVICE_ELEMENTS_PER_CALL,
    _Apply,
    _largest_output,
    _Rows,
    _Stack,
    raw_optimizer,
)
from fdattack.engine.vectorised.ghost import GhostLinears
from fdattack.engine.vectorised.optimizers import _per_model, stacked_optimizer
from fdattack.randomness import derive_seed

#: opacus' guard against a zero norm in the clipping factor C / (‖g_i‖ + 1e-6)
CLIP_EPSILON = 1e-6
#: the elements one per-sample call holds on a CPU, (models x rows) x (the largest activation of one row + the per-sample
#: gradient): 32 MB of float32 (pli_cnn on MNIST, K = 10: 2**23 trains faster than 2**22 and 2**24); on an accelerator
#: the plain path's budget
CPU_ELEMENTS_PER_SAMPLE_CALL = 1 << 23


def clip_factors(squared_norms: Tensor, max_grad_norm: float) -> Tensor:
    """min(1, C / (‖g_i‖₂ + 1e-6)) per row, from ‖g_i‖₂² taken over all parameters together (opacus' flat clipping)."""
    return (max_grad_norm / (squared_norms.sqrt() + CLIP_EPSILON)).clamp(max=1.0)


class _Noise:
    """N(0, σ²C² I) for each parameter of each model, from one generator per model seeded with its job's ``noise_seed``."""

    def __init__(self, steps: Sequence[PrivateSteps], params: dict[str, Tensor], device: torch.device) -> None:
        self.std = steps[0].noise_multiplier * steps[0].max_grad_norm
        self.shapes = {name: tuple(t.shape[1:]) for name, t in params.items()}
        self.dtype = next(iter(params.values())).dtype
        self.device = device
        self.generators = [torch.Generator(device=device).manual_seed(s.noise_seed) for s in steps]

    def __call__(self, models: Sequence[int]) -> dict[str, Tensor] | None:
        """(G, *shape) noise per parameter for ``models`` (ascending), each model's parameters drawn in order; None for σ = 0."""
        if self.std == 0:
            return None
        draws = [
            [
                torch.normal(0.0, self.std, size=shape, generator=self.generators[k], device=self.device, dtype=self.dtype)
                for shape in self.shapes.values()
            ]
            for k in models
        ]
        return {name: torch.stack([d[i] for d in draws]) for i, name in enumerate(self.shapes)}


def _epoch_batches(job: FitJob, n: int, epoch: int, batch_size: int) -> list[Tensor]:
    """Model ``job``'s batches in ``epoch``: its sampler's, else the seeded shuffle cut into ``batch_size`` (the loop's)."""
    seed = derive_seed(job.seed, epoch)
    if job.sampler is not None:
        return job.sampler(n, seed, batch_size)
    return list(torch.split(epoch_order(n, seed), batch_size))


def _padded_steps(batches: Sequence[list[Tensor]], offsets: Sequence[int]) -> list[tuple[list[int], Tensor, Tensor]]:
    """One epoch's steps: per step, the models that take it (ascending), their pooled rows padded to the longest batch
    (G, b) and the mask (G, b) of the real ones. Padding repeats a model's first row, so every index is valid."""
    steps = []
    for s in range(max(len(b) for b in batches)):
        models = [k for k, b in enumerate(batches) if s < len(b)]
        width = max(len(batches[k][s]) for k in models)
        rows = torch.tensor([offsets[k] for k in models]).repeat_interleave(width).view(len(models), width)
        mask = torch.zeros(len(models), width, dtype=torch.bool)
        for g, k in enumerate(models):
            taken = batches[k][s]
            rows[g, : len(taken)] = taken + offsets[k]
            mask[g, : len(taken)] = True
        steps.append((models, rows, mask))
    return steps


def _even_span(n: int, most: int) -> int:
    """The span that cuts ``n`` into as few near-equal pieces of at most ``most`` as possible (64 rows by 31: 22, 22, 20)."""
    return -(-n // -(-n // most)) if n else 1


class _ClippedSums:
    """Σ_{i∈S} ḡ_i per model of a step (and the step's mean loss per model), a block of (models x rows) per vmapped call.

    The linear layers that :class:`~fdattack.engine.vectorised.ghost.GhostLinears` finds are clipped by their output
    gradients and inputs (ghost clipping, :mod:`~fdattack.engine.vectorised.ghost`); every other parameter by its
    per-sample gradient.
    """

    def __init__(self, jobs: Sequence[FitJob], stack: _Stack, rows: _Rows, device: torch.device) -> None:
        objective = jobs[0].objective
        self.stack, self.rows = stack, rows
        self.max_grad_norm = float(jobs[0].private.max_grad_norm)  # type: ignore[union-attr]
        self.ghosts = ghosts = GhostLinears(stack.template, rows.tensors["x"][:1])
        self.free = [name for name in stack.params if name not in ghosts.parameters]
        self.fixed = [name for name in stack.params if name in ghosts.parameters]

        def row_loss(
            free: dict[str, Tensor], probes: dict[str, Tensor], fixed: dict[str, Tensor], row: dict[str, Tensor]
        ) -> tuple[Tensor, dict[str, Tensor]]:
            one = {key: value[None] for key, value in row.items()}
            ghosts.clear()
            return objective(functional_call(ghosts.template, (free, fixed, probes), (one["x"],)), one), ghosts.inputs()

        per_sample = vmap(grad_and_value(row_loss, argnums=(0, 1), has_aux=True), in_dims=(None, 0, None, 0))
        self.per_sample = _Apply(per_sample, device, (0, 0, 0, 0))
        per_pair = _largest_output(ghosts.template, rows.tensors["x"][:1]) + sum(stack.params[name][0].numel() for name in self.free)
        self.pairs = max(1, (CPU_ELEMENTS_PER_SAMPLE_CALL if device.type == "cpu" else DEVICE_ELEMENTS_PER_CALL) // per_pair)

    def __call__(self, models: Tensor, rows: Tensor, mask: Tensor) -> tuple[dict[str, Tensor], Tensor]:
        """Clipped sums (G, *shape) per parameter and mean losses (G,) (NaN for an empty batch) of ``models`` on
        ``rows`` (G, b) where ``mask``."""
        sums = {name: t.new_zeros(len(models), *t.shape[1:]) for name, t in self.stack.params.items()}
        losses = torch.zeros(len(models), device=mask.device)
        per_models = min(len(models), self.pairs)
        per_rows = _even_span(rows.shape[1], max(1, self.pairs // per_models))
        for lo in range(0, len(models), per_models):
            block = slice(lo, lo + per_models)
            free = {name: self.stack.params[name][models[block]] for name in self.free}
            fixed = {name: self.stack.params[name][models[block]] for name in self.fixed}
            fixed.update({name: t[models[block]] for name, t in self.stack.buffers.items()})
            for start in range(0, rows.shape[1], per_rows):
                taken = mask[block, start : start + per_rows]
                probes = self.ghosts.probes(tuple(taken.shape))
                (grads, deltas), (values, inputs) = self.per_sample(
                    free, probes, fixed, self.rows.batch(rows[block, start : start + per_rows])
                )
                squared = self.ghosts.squared_norms(deltas, inputs) + sum(g.flatten(2).square().sum(-1) for g in grads.values())
                weights = clip_factors(squared, self.max_grad_norm) * taken
                clipped = {name: torch.einsum("ms,ms...->m...", weights, g) for name, g in grads.items()}
                for name, total in {**clipped, **self.ghosts.clipped_sums(weights, deltas, inputs)}.items():
                    sums[name][block] += total
                losses[block] += torch.where(taken, values, 0.0).sum(1)
        return sums, losses / mask.sum(1)


def noised_mean(sums: dict[str, Tensor], noise: dict[str, Tensor] | None, divisors: Tensor) -> dict[str, Tensor]:
    """g̃ = (Σ_i ḡ_i + noise) / E per model, in opacus' order (add, then divide); ``divisors`` (G,) are the E."""
    return {name: (s if noise is None else s + noise[name]) / _per_model(divisors, s) for name, s in sums.items()}


class _PrivateGroup:
    """The stacked models of a group, their optimizers, noise and tallies: :meth:`step` takes one DP-SGD step of some."""

    def __init__(self, jobs: Sequence[FitJob], device: torch.device) -> None:
        private = [job.private for job in jobs]
        assert all(p is not None for p in private), "fit_private_copies takes jobs with private steps only"
        self.stack = _Stack([job.handle.module.net for job in jobs], device, per_sample=True)  # type: ignore[union-attr]
        self.optimizer = stacked_optimizer([raw_optimizer(job.handle) for job in jobs], list(self.stack.params), self.stack.params)
        self.rows = _Rows(jobs, device)
        self.clipped = _ClippedSums(jobs, self.stack, self.rows, device)
        self.noise = _Noise(private, self.stack.params, device)  # type: ignore[arg-type]
        self.divisors = torch.tensor([float(p.expected_batch_size) for p in private], device=device)  # type: ignore[union-attr]
        self.device = device
        self.loss_sum, self.loss_steps = torch.zeros(len(jobs), device=device), torch.zeros(len(jobs), dtype=torch.long, device=device)
        self.steps = torch.zeros(len(jobs), dtype=torch.long)

    def step(self, models: list[int], rows: Tensor, mask: Tensor) -> None:
        """One step of ``models`` (ascending) on their padded ``rows`` (G, b) where ``mask``: clipped sums, noise, / E,
        their optimizers' update; the others stand still."""
        index, mask = torch.tensor(models, device=self.device), mask.to(self.device)
        sums, losses = self.clipped(index, rows.to(self.device), mask)
        whole = len(models) == len(self.steps)
        self.optimizer.update(None if whole else index, self.stack.params, noised_mean(sums, self.noise(models), self.divisors[index]))
        taken = mask.any(1)
        self.loss_sum[index] += torch.where(taken, losses, 0.0)
        self.loss_steps[index] += taken
        self.steps[models] += 1

    def finish(self) -> list[FitResult]:
        """Write weights and optimizer states back into the models; each model's steps and mean loss."""
        self.stack.write_back()
        self.optimizer.write_back()
        return [
            FitResult(int(s), float(t) / int(c) if c else float("nan"))
            for s, t, c in zip(self.steps, self.loss_sum.cpu(), self.loss_steps.cpu())
        ]


def fit_private_copies(jobs: Sequence[FitJob], batch_size: int, device: torch.device) -> list[FitResult]:
    """Train every job's model with its :class:`~fdattack.engine.jobs.PrivateSteps`, all models' steps as one vmapped
    per-sample gradient computation (the module docstring tells how); then tell each job's ``account`` its steps.

    The jobs must share a :func:`~fdattack.engine.vectorised.copies.group_key` and pass
    :func:`~fdattack.engine.vectorised.copies.unsupported`; objectives set and fresh optimizers built (the engine's
    ``fit_many`` does both).

    Returns:
        one :class:`FitResult` per job, in order: its steps (empty batches included) and the mean of its non-empty
        steps' batch losses.
    """
    for job in jobs:
        job.handle.module.train()
    with torch.no_grad():  # grad_and_value differentiates inside; nothing outside it needs a graph
        training = _PrivateGroup(jobs, device)
        for epoch in range(jobs[0].epochs):
            batches = [_epoch_batches(job, n, epoch, batch_size) for job, n in zip(jobs, training.rows.sizes)]
            for models, rows, mask in _padded_steps(batches, training.rows.offsets):
                training.step(models, rows, mask)
        results = training.finish()
    for job, result in zip(jobs, results):
        job.private.account(result.steps)  # type: ignore[union-attr]
    return results
