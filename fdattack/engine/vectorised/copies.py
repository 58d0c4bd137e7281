"""Training and prediction of N copies of one network as one vmapped batch (the package docstring tells how)."""

from __future__ import annotations

import contextlib
import warnings
import weakref
from collections import defaultdict
from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call, vmap
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.dropout import _DropoutNd
from torch.overrides import TorchFunctionMode

from fdattack.engine.jobs import FitJob, FitResult, ModelHandle, epoch_order, has_batch_norm, without_lone_row
from fdattack.engine.vectorised.kernels.batched_linear import linear
from fdattack.engine.vectorised.kernels.conv_pool import ConvMaxPool, fuse_conv_pool
from fdattack.engine.vectorised.kernels.im2col import conv2d
from fdattack.engine.vectorised.kernels.rewrite import rewrite_pairs
from fdattack.engine.vectorised.optimizers import stacked_optimizer
from fdattack.lit.classifier import ClassifierLitModule, is_vmappable
from fdattack.lit.modes import eval_mode
from fdattack.randomness import derive_seed

#: the largest activation of one vmapped call, in elements (models x batch rows x the network's largest layer output
#: per row): 16 MB of float32 on a CPU (2**21 to 2**23 train FedMD's digits clients equally fast; 2**20 is 5% slower,
#: 2**19 25%), 1 GB on an accelerator
CPU_ELEMENTS_PER_CALL = 1 << 22
DEVICE_ELEMENTS_PER_CALL = 1 << 28
#: Adam and SGD settings the stacked update reproduces; any other value of these keys is :func:`unsupported`
_PLAIN = {"amsgrad": False, "maximize": False, "capturable": False, "differentiable": False, "decoupled_weight_decay": False}


def raw_optimizer(handle: ModelHandle) -> torch.optim.Optimizer:
    """The ``torch.optim`` optimizer inside Fabric's wrapper."""
    return getattr(handle.optimizer, "optimizer", handle.optimizer)


def unsupported(job: FitJob, device: torch.device) -> str | None:
    """Why ``job`` cannot be trained on ``device`` by :func:`fit_copies` (a clause for a log line), or None when it can.

    A job with :class:`~fdattack.engine.jobs.PrivateSteps` (DP-SGD) trains by
    :func:`~fdattack.engine.vectorised.private.fit_private_copies` on the same conditions, with its training defense's
    optimizer builder (the path takes the described steps itself), where :func:`_per_sample_problem` finds none.
    """
    handle, module = job.handle, job.handle.module
    if handle.wrap_optimizer is not None and job.private is None:
        return "a training defense wraps the model's training"
    if not is_plain_classifier(module) or not module.automatic_optimization:
        return f"{type(module).__name__} is not a classifier with automatic optimisation and its own training_step"
    if not is_vmappable(job.objective):
        return f"the objective {getattr(job.objective, '__name__', job.objective)!r} is not declared vmappable"
    private = _per_sample_problem(module.net, device) if job.private is not None else None  # type: ignore[arg-type]
    return private or network_problem(module.net) or _optimizer_problem(handle)


def _per_sample_problem(net: nn.Module, device: torch.device) -> str | None:
    """Why DP-SGD's per-sample gradients of ``net`` take the per-model loop (opacus), or None.

    BatchNorm mixes the rows of a batch, so a row has no gradient of its own. And on a CPU, per-sample gradients through
    a convolution of another layer's output (vmap's batched im2col backward) are slower than opacus' hooks, one model at
    a time: ``benchmarks/bench_dpsgd.py`` measured pdafd_cnn (four convolutions) at 0.56x to 0.78x of opacus' speed on
    MNIST (0.67x at K = 4 with ghost clipping), pli_cnn (one convolution, on the data) at 1.8x to 4.9x.
    """
    if has_batch_norm(net):
        return "DP-SGD's per-sample gradients are not defined for a network with BatchNorm (it mixes the rows of a batch)"
    convolutions = [m for m in net.modules() if isinstance(m, nn.Conv2d)]
    first = next((m for m in net.modules() if next(m.parameters(recurse=False), None) is not None), None)
    if device.type == "cpu" and (len(convolutions) > 1 or (convolutions and convolutions[0] is not first)):
        return "on a CPU, DP-SGD's per-sample gradients through a convolution of another layer's output are faster through opacus"
    return None


def network_problem(net: nn.Module) -> str | None:
    """Why the network cannot be trained under vmap as the loop trains it, or None."""
    return _describe(net)[1]


def _describe(net: nn.Module) -> tuple[tuple, str | None]:
    """(:func:`architecture`, :func:`network_problem`) of ``net``, computed once per network."""
    known = _NETWORKS.get(net)
    if known is None:
        tensors = [*net.named_parameters(), *net.named_buffers()]
        signature = (type(net), repr(net), tuple((name, tuple(t.shape), t.dtype, t.device) for name, t in tensors))
        known = _NETWORKS[net] = (signature, _problem(net))
    return known


def _problem(net: nn.Module) -> str | None:
    for layer in net.modules():
        if isinstance(layer, _DropoutNd) and layer.p > 0:
            return "the network has dropout (its random masks would differ from the loop's)"
        if isinstance(layer, _BatchNorm) and layer.momentum is None:
            return "the network has BatchNorm with momentum=None (a cumulative average)"
    return None


def _optimizer_problem(handle: ModelHandle) -> str | None:
    optimizer = raw_optimizer(handle)
    if len(handle.optimizers) != 1 or type(optimizer) not in (torch.optim.Adam, torch.optim.SGD):
        return f"the optimizer is {type(optimizer).__name__} (the vectorised step reproduces Adam and SGD)"
    group = optimizer.param_groups
    if len(group) != 1 or any(group[0].get(key, value) != value for key, value in _PLAIN.items()) or group[0].get("dampening", 0) != 0:
        return "the optimizer has settings the vectorised step does not reproduce (amsgrad, maximize, dampening, several groups, ...)"
    params = list(handle.module.net.parameters())  # type: ignore[union-attr]
    if len(group[0]["params"]) != len(params) or any(a is not b for a, b in zip(group[0]["params"], params)):
        return "the optimizer does not hold exactly the network's parameters"
    if not all(p.requires_grad for p in params):
        return "the module has frozen parameters"
    return None


def is_plain_classifier(module: nn.Module) -> bool:
    """A :class:`ClassifierLitModule` whose forward and training step are its class's: ``objective(net(x), batch)``."""
    kind = type(module)
    return (
        isinstance(module, ClassifierLitModule)
        and kind.forward is ClassifierLitModule.forward
        and kind.training_step is ClassifierLitModule.training_step
    )


_NETWORKS: "weakref.WeakKeyDictionary[nn.Module, tuple[tuple, str | None]]" = weakref.WeakKeyDictionary()


def architecture(module: ClassifierLitModule) -> tuple:
    """What makes two classifiers one architecture: their network's class and structure (its ``repr``), and every
    parameter's and buffer's name, shape, dtype and device."""
    return _describe(module.net)[0]


def group_key(job: FitJob) -> tuple:
    """Jobs with equal keys train in one :func:`fit_copies` (or :func:`~fdattack.engine.vectorised.private.fit_private_copies`)
    call: architecture, objective, optimizer and its settings, epochs, whether batches carry soft targets, and the private
    steps' σ and C."""
    optimizer = raw_optimizer(job.handle)
    settings = tuple((key, value) for key, value in sorted(optimizer.param_groups[0].items()) if key != "params")
    private = None if job.private is None else (job.private.noise_multiplier, job.private.max_grad_norm)
    return architecture(job.handle.module), job.objective, type(optimizer), settings, job.epochs, job.targets is None, private


# ---------------------------------------------------------------------------------------------------- stacking
def _pool_first(net: nn.Module) -> nn.Module:
    """``net``, or a copy in which every ``ReLU`` or ``LeakyReLU`` directly followed by a ``MaxPool2d`` in an
    ``nn.Sequential`` comes after the pool instead: the same values and gradients (a non-decreasing activation
    commutes with a maximum, and picks the same element of each window), with the activation on 1/k² of the rows.
    Parameter and buffer names are unchanged (both layers have none)."""

    def activation_then_pool(first: nn.Module, second: nn.Module) -> bool:
        return (
            isinstance(first, (nn.ReLU, nn.LeakyReLU))
            and getattr(first, "negative_slope", 0.0) >= 0
            and isinstance(second, nn.MaxPool2d)
            and not second.return_indices
        )

    return rewrite_pairs(net, activation_then_pool, lambda activation, pool: (pool, activation))


class _Stack:
    """The parameters and buffers of same-architecture networks, stacked along a leading model axis; ``template``
    is the network the vmapped calls run (:func:`_pool_first` of the first, on a CPU also with
    :func:`~fdattack.engine.vectorised.kernels.conv_pool.fuse_conv_pool`, for per-sample gradients if ``per_sample``)."""

    def __init__(self, nets: Sequence[nn.Module], device: torch.device, per_sample: bool = False) -> None:
        self.template = _pool_first(nets[0])
        if device.type == "cpu":
            self.template = fuse_conv_pool(self.template, per_sample)
        self.per_model = [(dict(m.named_parameters()), dict(m.named_buffers())) for m in nets]
        self.params = {name: torch.stack([p[name].detach() for p, _ in self.per_model]) for name in self.per_model[0][0]}
        self.buffers = {name: torch.stack([b[name] for _, b in self.per_model]) for name in self.per_model[0][1]}

    def take(self, models: Tensor) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        """Copies of the rows of ``models``: parameters as leaves that require grad, and buffers."""
        return (
            {name: t[models].requires_grad_() for name, t in self.params.items()},
            {name: t[models] for name, t in self.buffers.items()},
        )

    def write_back(self) -> None:
        """Copy every model's rows into its network."""
        with torch.no_grad():
            for stacked, index in ((self.params, 0), (self.buffers, 1)):
                for name, rows in stacked.items():
                    for tensors, row in zip(self.per_model, rows):
                        tensors[index][name].copy_(row)


def _models_per_call(per_row: int, rows: int, device: torch.device) -> int:
    """How many models one vmapped call takes, each on ``rows`` rows whose largest activation has ``per_row`` elements per row."""
    budget = CPU_ELEMENTS_PER_CALL if device.type == "cpu" else DEVICE_ELEMENTS_PER_CALL
    return max(1, budget // (per_row * max(rows, 1)))


@torch.no_grad()
def _largest_output(net: nn.Module, batch: Tensor) -> int:
    """Elements per row of the largest output of any layer of ``net`` on ``batch`` (one eval-mode pass); a
    :class:`~fdattack.engine.vectorised.kernels.conv_pool.ConvMaxPool` counts what it holds."""
    sizes = [batch[0].numel()]

    def record(module: nn.Module, inputs: tuple, out: object) -> None:
        sizes.append(out.numel() // len(batch) if isinstance(out, Tensor) else 0)
        if isinstance(module, ConvMaxPool):
            sizes.append(module.elements_held(inputs[0]) // len(batch))

    hooks = [m.register_forward_hook(record) for m in net.modules()]
    try:
        with eval_mode(net):
            net(batch)
    finally:
        for hook in hooks:
            hook.remove()
    return max(sizes)


class _CpuLayers(TorchFunctionMode):
    """While active (the vmapped calls on a CPU), 2-D convolutions run as :func:`~fdattack.engine.vectorised.kernels.im2col.conv2d` and
    linear layers as :func:`~fdattack.engine.vectorised.kernels.batched_linear.linear`; every other function runs as called."""

    def __torch_function__(self, func: Callable, types: object, args: tuple = (), kwargs: dict | None = None) -> object:
        return _CPU_LAYERS.get(func, func)(*args, **(kwargs or {}))


_CPU_LAYERS: dict[Callable, Callable] = {F.conv2d: conv2d, F.linear: linear}


class _Apply:
    """Calls ``fn`` under vmap, with the CPU convolution layout where it helps.

    Ops without a batching rule (``kl_div``) run through vmap's per-model fallback: same results, slower; PyTorch's
    warning about it is silenced here.
    """

    def __init__(self, fn: Callable, device: torch.device, in_dims: tuple) -> None:
        self.fn, self.device = vmap(fn, in_dims=in_dims), device

    def __call__(self, *args: object) -> Tensor:
        with warnings.catch_warnings(), _CpuLayers() if self.device.type == "cpu" else contextlib.nullcontext():
            warnings.filterwarnings("ignore", message="There is a performance drop because we have not yet implemented the batching rule")
            return self.fn(*args)


class _Rows:
    """Every model's training rows laid end to end, one tensor per batch key (a set shared by several models once)."""

    def __init__(self, jobs: Sequence[FitJob], device: torch.device) -> None:
        parts: dict[str, list[Tensor]] = defaultdict(list)
        seen: dict[tuple[int, int], int] = {}
        self.offsets: list[int] = []
        self.sizes = [len(job.data) for job in jobs]
        total = 0
        for job in jobs:
            key = (id(job.data), id(job.targets))
            if key not in seen:
                seen[key] = total
                rows = job.rows()
                for name, tensor in rows.batch(torch.arange(len(rows))).items():
                    parts[name].append(tensor)
                total += len(rows)
            self.offsets.append(seen[key])
        self.tensors = {name: torch.cat(tensors).to(device) for name, tensors in parts.items()}

    def batch(self, rows: Tensor) -> dict[str, Tensor]:
        """(G, b, ...) tensors of the (G, b) pooled ``rows``."""
        return {name: tensor[rows] for name, tensor in self.tensors.items()}


def _steps(orders: Sequence[Tensor], batch_size: int) -> list[list[tuple[Tensor, Tensor]]]:
    """One epoch's vmapped steps: per step, (models, rows) for each batch size met at that step.

    ``orders[k]`` is model k's pooled row order; step s of model k is rows ``orders[k][s*B : (s+1)*B]``, exactly
    the loop's batches. Models with one set size share a schedule; at every step the models whose batch has the
    same size form one sub-group (models ascending, rows (G, b)).
    """
    by_size: dict[int, list[int]] = defaultdict(list)
    for k, order in enumerate(orders):
        by_size[len(order)].append(k)
    classes = [(n, torch.tensor(models), torch.stack([orders[k] for k in models])) for n, models in by_size.items()]
    schedule = []
    for start in range(0, max(by_size), batch_size):
        meet: dict[int, list[tuple[Tensor, Tensor]]] = defaultdict(list)
        for n, models, order in classes:
            if n > start:
                meet[min(batch_size, n - start)].append((models, order[:, start : start + batch_size]))
        step = []
        for parts in meet.values():
            models, rows = torch.cat([m for m, _ in parts]), torch.cat([r for _, r in parts])
            ascending = models.argsort()
            step.append((models[ascending], rows[ascending]))
        schedule.append(step)
    return schedule


def fit_copies(jobs: Sequence[FitJob], batch_size: int, device: torch.device) -> list[FitResult]:
    """Train every job's model, all in one vmapped step per mini-batch: the "train N copies" API.

    Each model takes the steps :meth:`LocalTrainer.fit <fdattack.engine.trainer.LocalTrainer.fit>` would take (its own
    seeded batches of its own rows, its own optimizer state), to float tolerance. The jobs must share a
    :func:`group_key` and pass :func:`unsupported`; their objectives must already be set and fresh optimizers
    built (the engine's ``fit_many`` does both). LiRA's shadow students use it, through ``fit_many``.

    Returns:
        one :class:`FitResult` per job, in order.
    """
    for job in jobs:
        if not job.handle.module.training:
            job.handle.module.train()
    stack = _Stack([job.handle.module.net for job in jobs], device)  # type: ignore[union-attr]
    optimizer = stacked_optimizer([raw_optimizer(job.handle) for job in jobs], list(stack.params), stack.params)
    objective, template = jobs[0].objective, stack.template

    def loss(params: dict[str, Tensor], buffers: dict[str, Tensor], batch: dict[str, Tensor]) -> Tensor:
        return objective(functional_call(template, (params, buffers), (batch["x"],)), batch)

    losses, rows = _Apply(loss, device, (0, 0, 0)), _Rows(jobs, device)
    per_row = _largest_output(template, rows.tensors["x"][:batch_size])
    trim = without_lone_row if has_batch_norm(template) else (lambda order, _: order)
    total = torch.zeros(len(jobs), device=device)
    steps = torch.zeros(len(jobs), dtype=torch.long)
    for epoch in range(jobs[0].epochs):
        orders = [
            trim(epoch_order(n, derive_seed(job.seed, epoch)), batch_size) + offset
            for job, n, offset in zip(jobs, rows.sizes, rows.offsets)
        ]
        for step in _steps(orders, batch_size):
            for models, batch_rows in step:
                batch = rows.batch(batch_rows.to(device))
                models = models.to(device)
                per_call = _models_per_call(per_row, batch_rows.shape[1], device)
                grads: dict[str, list[Tensor]] = defaultdict(list)
                for lo in range(0, len(models), per_call):
                    chunk = models[lo : lo + per_call]
                    params, buffers = stack.take(chunk)
                    values = losses(params, buffers, {key: t[lo : lo + per_call] for key, t in batch.items()})
                    values.sum().backward()
                    for name, p in params.items():
                        grads[name].append(p.grad)
                    for name, b in buffers.items():
                        stack.buffers[name][chunk] = b
                    total.index_add_(0, chunk, values.detach())
                whole = len(models) == len(jobs)
                optimizer.update(None if whole else models, stack.params, {name: torch.cat(g) for name, g in grads.items()})
                steps[models.cpu()] += 1
    stack.write_back()
    optimizer.write_back()
    return [FitResult(int(s), float(t) / int(s) if s else float("nan")) for s, t in zip(steps, total.cpu())]


# ---------------------------------------------------------------------------------------------------- inference
@torch.no_grad()
def predict_copies(modules: Sequence[ClassifierLitModule], images: Tensor, device: torch.device) -> Tensor:
    """Logits (K, N, J) of same-:func:`architecture` classifiers in eval mode, on CPU, as
    :func:`~fdattack.engine.trainer.predict_logits` of each (to float tolerance).

    Each vmapped call takes as many rows and models as the activation budget allows (all rows for each model where
    they fit), so that few calls cover the K x N rows.
    """
    stack = _Stack([m.net for m in modules], device)

    def forward(params: dict[str, Tensor], buffers: dict[str, Tensor], x: Tensor) -> Tensor:
        return functional_call(stack.template, (params, buffers), (x,))

    apply = _Apply(forward, device, (0, 0, None))
    per_row = _largest_output(stack.template, images[:1].to(device))
    rows = max(1, min(images.shape[0], _models_per_call(per_row, 1, device)))
    per_call = _models_per_call(per_row, rows, device)
    outputs = []
    with eval_mode(stack.template):
        for lo in range(0, len(modules), per_call):
            params = {name: t[lo : lo + per_call] for name, t in stack.params.items()}
            buffers = {name: t[lo : lo + per_call] for name, t in stack.buffers.items()}
            parts = [
                apply(params, buffers, images[start : start + rows].to(device)).float().cpu() for start in range(0, images.shape[0], rows)
            ]
            outputs.append(torch.cat(parts, dim=1))
    return torch.cat(outputs)
