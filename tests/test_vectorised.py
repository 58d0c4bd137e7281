"""Same-architecture models trained and queried as one vmapped batch give the per-model loop's results.

Tolerances. The optimizer arithmetic is elementwise and done in torch.optim's order, so one stacked Adam or SGD
step equals torch.optim's step bit for bit (checked with a one-ulp tolerance, for vector-versus-scalar kernel
tails). Forward and backward passes are not elementwise: vmapped convolutions (here an im2col matrix product)
and batched matrix products sum in another order than the per-model kernels, so gradients differ from the loop's
by float32 rounding (~1e-7 relative) and the difference grows with every step the models take. Phases of a few
dozen steps therefore compare weights, buffers and optimizer states with rtol = atol = 1e-5; whole runs compare
their metrics (losses, accuracies, entropies after ~100 steps) with rel = 1e-3, abs = 1e-4. (Deep BatchNorm
networks on tiny batches amplify rounding more, VGG-16-BN on 8x8 images to 1e-4 of the largest gradient in one
step, but a float64 reference is then as far from the loop's gradients as from the vectorised ones. And a
parameter whose gradient is only rounding noise, such as a convolution bias right before BatchNorm, takes Adam
steps of +-lr in whatever direction the noise points, in the loop as here: the BatchNorm tests use weight decay.)
"""

from __future__ import annotations

import copy
import json
import logging
import platform
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fdattack.cli import main
from fdattack.config import compose
from fdattack.data.imageset import ImageSet
from fdattack.defenses import DEFENSES
from fdattack.engine import FitJob, LocalTrainer, ModelHandle, default_engine
from fdattack.engine import vectorised as vectorised_api
from fdattack.engine.vectorised import copies as vectorised
from fdattack.engine.vectorised.kernels import batched_linear, conv_pool, im2col
from fdattack.engine.vectorised.optimizers import stacked_optimizer
from fdattack.errors import ConfigError
from fdattack.experiment import run
from fdattack.fd.protocols.fedgems import fedgems_client
from fdattack.lit import ClassifierLitModule
from fdattack.lit.classifier import is_vmappable
from fdattack.lit.objectives import cross_entropy, kl_to_probs, l1_to_logits, mixed_ce_kl, soft_cross_entropy
from tests.conftest import REPO, own_messages, tiny
from tests.test_defenses import FreezeClients

SIZES = (45, 23, 23, 22)  # private sets of different sizes: with batch size 8, the tail steps form sub-groups of 7, 6 and 5


def _bn_net() -> nn.Module:
    return nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(36, 5))


def _sets() -> list[ImageSet]:
    g = torch.Generator().manual_seed(1)
    return [ImageSet.from_images(torch.rand(n, 1, 8, 8, generator=g) * 2 - 1, torch.randint(0, 5, (n,), generator=g)) for n in SIZES]


def _clients(vectorise: bool | str, optimizer: str, net: str = "bn", engine: LocalTrainer | None = None, **settings: object) -> tuple:
    engine = engine or default_engine(batch_size=8, vectorise=vectorise)
    torch.manual_seed(0)
    modules = [
        ClassifierLitModule(_bn_net() if net == "bn" else net, 5, optimizer=optimizer, in_channels=1, image_size=8, **settings)  # type: ignore[arg-type]
        for _ in SIZES
    ]
    return engine, [engine.setup(f"client{k}", m) for k, m in enumerate(modules)]


def _assert_same_models(a: list[ModelHandle], b: list[ModelHandle], tol: float = 1e-5) -> None:
    for x, y in zip(a, b):
        for (name, t), u in zip(x.module.state_dict().items(), y.module.state_dict().values()):
            torch.testing.assert_close(t, u, rtol=tol, atol=tol, msg=f"{x.name} {name}")  # weights and BatchNorm statistics
        sx, sy = x.optimizer.state_dict(), y.optimizer.state_dict()
        assert sx["param_groups"] == sy["param_groups"]
        assert sx["state"].keys() == sy["state"].keys()
        for p in sx["state"]:
            assert sx["state"][p].keys() == sy["state"][p].keys()
            for key in sx["state"][p]:
                assert sx["state"][p][key].dtype == sy["state"][p][key].dtype, key
                torch.testing.assert_close(sx["state"][p][key], sy["state"][p][key], rtol=tol, atol=tol, msg=f"{x.name} {key}")


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many models each vectorised training call took (to tell the vectorised path from a silent fallback)."""
    taken: list[int] = []
    fit_copies = vectorised.fit_copies

    def spy(jobs, *args, **kwargs):  # type: ignore[no-untyped-def]
        taken.append(len(jobs))
        return fit_copies(jobs, *args, **kwargs)

    monkeypatch.setattr(vectorised_api, "fit_copies", spy)  # where the engine calls it
    return taken


# ---------------------------------------------------------------------------------------------------- optimizer steps
@pytest.mark.parametrize(
    ("kind", "settings"),
    [
        (torch.optim.Adam, {"lr": 1e-2, "betas": (0.8, 0.99), "eps": 1e-6, "weight_decay": 1e-3}),
        (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9, "nesterov": True, "weight_decay": 1e-3}),
        (torch.optim.SGD, {"lr": 0.1, "momentum": 0.5}),
        (torch.optim.SGD, {"lr": 0.1}),
    ],
)
def test_one_stacked_step_equals_torch_optim(kind: type, settings: dict) -> None:
    """Models at different step counts (model 2 has no state yet: Adam's first step, SGD's buffer = gradient)."""
    torch.manual_seed(0)
    params = [[torch.randn(4, 3, requires_grad=True), torch.randn(5, requires_grad=True)] for _ in range(3)]
    optimizers = [kind(p, **settings) for p in params]
    for k, steps in enumerate((2, 1, 0)):
        for _ in range(steps):
            for p in params[k]:
                p.grad = torch.randn_like(p)
            optimizers[k].step()
    names = ["w", "b"]
    stacked = {n: torch.stack([params[k][i].detach() for k in range(3)]) for i, n in enumerate(names)}
    optimizer = stacked_optimizer(optimizers, names, stacked)
    grads = [[torch.randn_like(p) for p in ps] for ps in params]
    optimizer.update(None, stacked, {n: torch.stack([grads[k][i] for k in range(3)]) for i, n in enumerate(names)})
    for ps, gs, opt in zip(params, grads, optimizers):
        for p, g in zip(ps, gs):
            p.grad = g
        opt.step()
    for i, n in enumerate(names):
        torch.testing.assert_close(stacked[n], torch.stack([params[k][i].detach() for k in range(3)]), rtol=1e-7, atol=1e-8)
    expected = [copy.deepcopy(opt.state_dict()) for opt in optimizers]
    optimizer.write_back()  # the stacked state, written in torch.optim's own format, is the one torch.optim reached
    for opt, state in zip(optimizers, expected):
        for p, values in state["state"].items():
            for key, value in values.items():
                torch.testing.assert_close(opt.state_dict()["state"][p][key], value, rtol=1e-7, atol=1e-8, msg=key)


def test_a_step_of_some_models_leaves_the_others_untouched() -> None:
    torch.manual_seed(0)
    params = [[torch.randn(3, requires_grad=True)] for _ in range(4)]
    optimizers = [torch.optim.Adam(p, lr=0.1) for p in params]
    stacked = {"w": torch.stack([p[0].detach() for p in params])}
    before = stacked["w"].clone()
    optimizer = stacked_optimizer(optimizers, ["w"], stacked)
    optimizer.update(torch.tensor([1, 3]), stacked, {"w": torch.ones(2, 3)})
    assert torch.equal(stacked["w"][[0, 2]], before[[0, 2]]) and not torch.equal(stacked["w"][[1, 3]], before[[1, 3]])
    optimizer.write_back()
    assert [int(opt.state_dict()["state"][0]["step"]) if opt.state else 0 for opt in optimizers] == [0, 1, 0, 1]


# ---------------------------------------------------------------------------------------------------- CPU kernels
@pytest.mark.parametrize(
    ("channels", "kernel", "stride", "padding"), [(1, 3, 1, 0), (3, (3, 2), 2, 1), (4, 1, 1, 0), (2, 5, (1, 2), (2, 1))]
)
def test_the_cpu_convolution_equals_conv2d(channels: int, kernel: object, stride: object, padding: object) -> None:
    """Under vmap with per-model weights, as a channels-last result, for any stride and padding (float rounding only)."""
    g = torch.Generator().manual_seed(0)
    size = (kernel, kernel) if isinstance(kernel, int) else kernel
    x, weight, bias = (
        torch.randn(3, 5, channels, 9, 8, generator=g),
        torch.randn(3, 6, channels, *size, generator=g),
        torch.randn(3, 6, generator=g),
    )
    ours = torch.func.vmap(lambda x, w, b: im2col.conv2d(x, w, b, stride, padding))(x, weight, bias)
    theirs = torch.stack([torch.nn.functional.conv2d(x[k], weight[k], bias[k], stride, padding) for k in range(3)])
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", ["per-model input", "shared input", "no bias", "3-d input", "outside vmap"])
def test_the_batched_linear_layer_equals_f_linear_with_its_gradients(case: str) -> None:
    """Values and input, weight and bias gradients of ``F.linear`` model by model. Integer inputs, weights and upstream
    gradients keep every sum exact in any order, so all must be equal; a weight gradient computed in the transposed
    orientation, or an input gradient against the wrong factor, would differ or fail on its shape."""
    g = torch.Generator().manual_seed(3)
    models, lead = (1 if case == "outside vmap" else 3), ((2, 4) if case == "3-d input" else (5,))
    x = torch.randint(-3, 4, (models, *lead, 7), generator=g).float().requires_grad_()
    weight = torch.randint(-3, 4, (models, 6, 7), generator=g).float().requires_grad_()
    bias = None if case == "no bias" else torch.randint(-3, 4, (models, 6), generator=g).float().requires_grad_()
    if case == "outside vmap":
        ours = batched_linear.linear(x[0], weight[0], bias[0])[None]  # type: ignore[index]
    elif case == "shared input":
        ours = torch.func.vmap(lambda w, b: batched_linear.linear(x[0], w, b))(weight, bias)
    else:
        ours = torch.func.vmap(batched_linear.linear, in_dims=(0, 0, None if bias is None else 0))(x, weight, bias)
    theirs = torch.stack(
        [F.linear(x[0] if case == "shared input" else x[k], weight[k], None if bias is None else bias[k]) for k in range(models)]
    )
    assert torch.equal(ours, theirs)
    upstream = torch.randint(-3, 4, ours.shape, generator=g).float()
    leaves = [t for t in (x, weight, bias) if t is not None]
    for a, b in zip(torch.autograd.grad((ours * upstream).sum(), leaves), torch.autograd.grad((theirs * upstream).sum(), leaves)):
        assert torch.equal(a, b)


def test_the_batched_linear_layer_gives_per_sample_gradients_under_vmap_of_grad(monkeypatch: pytest.MonkeyPatch) -> None:
    """DP-SGD's per-sample gradients (:mod:`fdattack.engine.vectorised.private`): vmap over models of vmap over rows of
    grad, the weights shared by a model's rows (its rows join the layer's rows: the product sees 3 weights, not 3 x 5
    copies, and neither does the input gradient's product in backward). Each row's weight, bias and input gradients are
    ``F.linear``'s on that row alone; integers keep every sum exact."""
    weights_seen: dict[str, list[int]] = {"forward": [], "input gradient": []}
    forward, input_grad = batched_linear._LinearFunction.forward, batched_linear._InputGradFunction.forward

    def recording(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        weights_seen["forward"].append(weight.shape[0])
        return forward(x, weight, bias)

    def recording_input_grad(grad: Tensor, weight: Tensor) -> Tensor:
        weights_seen["input gradient"].append(weight.shape[0])
        return input_grad(grad, weight)

    monkeypatch.setattr(batched_linear._LinearFunction, "forward", staticmethod(recording))
    monkeypatch.setattr(batched_linear._InputGradFunction, "forward", staticmethod(recording_input_grad))
    g = torch.Generator().manual_seed(4)
    x, upstream = (torch.randint(-3, 4, (3, 5, n), generator=g).float() for n in (7, 6))
    weight, bias = torch.randint(-3, 4, (3, 6, 7), generator=g).float(), torch.randint(-3, 4, (3, 6), generator=g).float()

    def loss(w: Tensor, b: Tensor, row: Tensor, u: Tensor) -> Tensor:
        return (batched_linear.linear(row[None], w, b) * u).sum()

    per_row = torch.func.vmap(torch.func.grad(loss, argnums=(0, 1, 2)), in_dims=(None, None, 0, 0))
    ours = torch.func.vmap(per_row)(weight, bias, x, upstream)
    assert weights_seen == {"forward": [3], "input gradient": [3]}
    for k in range(3):
        for i in range(5):
            w, b, row = (t.clone().requires_grad_() for t in (weight[k], bias[k], x[k, i : i + 1]))
            (F.linear(row, w, b) * upstream[k, i]).sum().backward()
            assert torch.equal(ours[0][k, i], w.grad) and torch.equal(ours[1][k, i], b.grad) and torch.equal(ours[2][k, i], row.grad[0])


def test_the_batched_linear_layers_input_gradient_has_its_own_gradients() -> None:
    """Its backward (a second derivative through the linear layer) against finite differences."""
    g = torch.Generator().manual_seed(6)
    grad, weight = torch.randn(2, 3, 4, generator=g, dtype=torch.float64), torch.randn(2, 4, 5, generator=g, dtype=torch.float64)
    assert torch.autograd.gradcheck(batched_linear._InputGradFunction.apply, (grad.requires_grad_(), weight.requires_grad_()))


@pytest.mark.parametrize("activation", [nn.ReLU(), nn.LeakyReLU(0.2)])
def test_activation_after_the_pool_gives_the_same_values_and_gradients(activation: nn.Module) -> None:
    """Windows whose values are all negative (a ReLU's zeros) included: gradients equal bit for bit."""
    net = nn.Sequential(nn.Conv2d(1, 4, 3), activation, nn.MaxPool2d(2, ceil_mode=True), nn.Flatten(), nn.Linear(36, 2))
    swapped = vectorised._pool_first(net)
    assert isinstance(swapped[1], nn.MaxPool2d) and isinstance(net[1], type(activation)) and swapped is not net
    x = torch.randn(8, 1, 7, 7, generator=torch.Generator().manual_seed(0)) - 1.0
    for model in (net, swapped):
        model.zero_grad()
        model(x).square().sum().backward()
    assert torch.equal(net(x), swapped(x))
    for a, b in zip(net.parameters(), swapped.parameters()):
        assert torch.equal(a.grad, b.grad)
    unchanged = nn.Sequential(nn.Conv2d(1, 4, 3), nn.Tanh(), nn.MaxPool2d(2))  # tanh commutes too, but only ReLUs are moved
    assert vectorised._pool_first(unchanged) is unchanged


def _fused(channels: int, kernel: object, stride: object, padding: object, pool: object, pool_stride: object) -> conv_pool.ConvMaxPool:
    return conv_pool.ConvMaxPool(nn.Conv2d(channels, 6, kernel, stride, padding), nn.MaxPool2d(pool, pool_stride))  # type: ignore[arg-type]


def _integer_weights(fused: conv_pool.ConvMaxPool, models: int, g: torch.Generator) -> tuple[Tensor, Tensor]:
    """Small integer weights: with integer images every sum is exact in any order, so windows tie exactly."""
    weight = torch.randint(-2, 3, (models, *fused.weight.shape), generator=g).float().requires_grad_()
    return weight, torch.randint(-2, 3, (models, fused.weight.shape[0]), generator=g).float().requires_grad_()


GEOMETRIES = [
    (1, 3, 1, 0, 3, 3),  # pli_cnn: the pool never reads the last conv row and column
    (3, (3, 2), 2, 1, 2, 2),
    (2, 3, 1, 1, 3, 2),  # overlapping windows: one value can be the maximum of two
    (4, 1, 1, 0, (2, 3), (1, 2)),
]


@pytest.mark.parametrize("geometry", GEOMETRIES)
@pytest.mark.parametrize("chunking", ["two layers", "one row a chunk", "two rows a chunk", "four rows a chunk"])
def test_the_fused_convolution_and_pool_equal_the_two_layers(monkeypatch: pytest.MonkeyPatch, geometry: tuple, chunking: str) -> None:
    """Under vmap with per-model weights, in chunks of rows or as two layers (when a model's batch fits in one chunk): the
    values and the kernel and bias gradients of ``max_pool2d(conv2d(x))`` model by model, with ties between windows'
    values resolved as PyTorch resolves them."""
    g = torch.Generator().manual_seed(0)
    fused = _fused(*geometry)
    x = torch.randint(-2, 3, (3, 5, geometry[0], 11, 10), generator=g).float()
    used, _ = fused.geometry.sizes(11, 10)
    per_row = used[0] * used[1] * 6  # convolution outputs the pool reads, per row
    chunk = {"two layers": 5 * per_row, "one row a chunk": per_row, "two rows a chunk": 2 * per_row, "four rows a chunk": 4 * per_row}[
        chunking
    ]
    monkeypatch.setattr(conv_pool, "CHUNK_ELEMENTS", chunk)
    assert fused._chunked(x[0]) is (chunking != "two layers")
    weight, bias = _integer_weights(fused, 3, g)
    _, _, stride, padding, pool, pool_stride = geometry
    ours = torch.func.vmap(lambda w, b, x: torch.func.functional_call(fused, {"weight": w, "bias": b}, (x,)))(weight, bias, x)
    theirs = torch.stack([F.max_pool2d(F.conv2d(x[k], weight[k], bias[k], stride, padding), pool, pool_stride) for k in range(3)])
    assert torch.equal(ours, theirs)
    upstream = torch.randn(ours.shape, generator=g)
    for a, b in zip(
        torch.autograd.grad((ours * upstream).sum(), [weight, bias]), torch.autograd.grad((theirs * upstream).sum(), [weight, bias])
    ):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("geometry", GEOMETRIES)
def test_the_per_sample_fused_layer_gives_each_rows_gradients_under_vmap_of_grad(monkeypatch: pytest.MonkeyPatch, geometry: tuple) -> None:
    """DP-SGD's per-sample gradients: vmap over models of vmap over rows of grad through a per-sample
    :class:`~conv_pool.ConvMaxPool` (a single row takes the fused path; the rows of all calls are chunked together,
    three rows a chunk here, so chunks straddle models) give, row by row, the kernel and bias gradients of
    ``max_pool2d(conv2d(x))`` on that row alone (overlapping windows included)."""
    g = torch.Generator().manual_seed(5)
    layer = _fused(*geometry)
    assert not layer._chunked(torch.zeros(1, geometry[0], 11, 10))
    layer.per_sample = True
    assert layer._chunked(torch.zeros(1, geometry[0], 11, 10))
    used, _ = layer.geometry.sizes(11, 10)
    monkeypatch.setattr(conv_pool, "CHUNK_ELEMENTS", 3 * used[0] * used[1] * 6)
    weight, bias = _integer_weights(layer, 3, g)
    x = torch.randint(-2, 3, (3, 4, geometry[0], 11, 10), generator=g).float()
    upstream = torch.randn(3, 4, *layer(x[0, :1]).shape[1:], generator=g)

    def loss(w: Tensor, b: Tensor, row: Tensor, u: Tensor) -> Tensor:
        return (torch.func.functional_call(layer, {"weight": w, "bias": b}, (row[None],))[0] * u).sum()

    ours = torch.func.vmap(torch.func.vmap(torch.func.grad(loss, argnums=(0, 1)), in_dims=(None, None, 0, 0)))(weight, bias, x, upstream)
    _, _, stride, padding, size, pool_stride = geometry
    for k in range(3):
        for i in range(4):
            w, b = weight[k].detach().clone().requires_grad_(), bias[k].detach().clone().requires_grad_()
            (F.max_pool2d(F.conv2d(x[k, i : i + 1], w, b, stride, padding), size, pool_stride)[0] * upstream[k, i]).sum().backward()
            torch.testing.assert_close(ours[0][k, i], w.grad, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(ours[1][k, i], b.grad, rtol=1e-5, atol=1e-5)


def test_the_fused_layer_shares_one_input_falls_back_where_its_input_needs_a_gradient_and_runs_without_a_bias(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(conv_pool, "CHUNK_ELEMENTS", 1)  # chunks of one row wherever the input allows them
    g = torch.Generator().manual_seed(1)
    fused = _fused(*GEOMETRIES[2])
    weight, bias = _integer_weights(fused, 3, g)
    x = torch.randint(-2, 3, (5, 2, 9, 9), generator=g).float()
    shared = torch.func.vmap(lambda w, b: torch.func.functional_call(fused, {"weight": w, "bias": b}, (x,)))(weight, bias)
    theirs = torch.stack([F.max_pool2d(F.conv2d(x, weight[k], bias[k], 1, 1), 3, 2) for k in range(3)])
    assert torch.equal(shared, theirs)
    x.requires_grad_()
    out = torch.func.functional_call(fused, {"weight": weight[0], "bias": bias[0]}, (x,))
    assert torch.equal(out, theirs[0])
    (grad,) = torch.autograd.grad(out.sum(), [x])
    x_ref = x.detach().requires_grad_()
    torch.testing.assert_close(grad, torch.autograd.grad(F.max_pool2d(F.conv2d(x_ref, weight[0], bias[0], 1, 1), 3, 2).sum(), [x_ref])[0])
    unbiased = conv_pool.ConvMaxPool(nn.Conv2d(2, 6, 3, 1, 1, bias=False), nn.MaxPool2d(3, 2))
    x = x.detach()
    ours = torch.func.vmap(lambda w: torch.func.functional_call(unbiased, {"weight": w}, (x,)))(weight)
    assert unbiased._chunked(x) and torch.equal(
        ours, torch.stack([F.max_pool2d(F.conv2d(x, weight[k], None, 1, 1), 3, 2) for k in range(3)])
    )


def test_fusing_keeps_parameter_names_and_fuses_only_what_it_computes() -> None:
    net = nn.Sequential(nn.Conv2d(1, 4, 3), nn.MaxPool2d(2), nn.Conv2d(4, 4, 3), nn.MaxPool2d(2, ceil_mode=True), nn.Flatten())
    fused = conv_pool.fuse_conv_pool(net)
    assert [type(m) for m in fused] == [conv_pool.ConvMaxPool, nn.Identity, nn.Conv2d, nn.MaxPool2d, nn.Flatten]
    assert [name for name, _ in fused.named_parameters()] == [name for name, _ in net.named_parameters()]
    x = torch.randn(2, 1, 14, 14, generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(fused(x), net(x), rtol=1e-5, atol=1e-5)
    for unfusable in (
        nn.Sequential(nn.Conv2d(1, 4, 3, dilation=2), nn.MaxPool2d(2)),
        nn.Sequential(nn.Conv2d(2, 4, 3, groups=2), nn.MaxPool2d(2)),
        nn.Sequential(nn.Conv2d(1, 4, 3), nn.MaxPool2d(2, padding=1)),
        nn.Sequential(nn.Conv2d(1, 4, 3, padding="same"), nn.MaxPool2d(2)),
    ):
        assert conv_pool.fuse_conv_pool(unfusable) is unfusable


# ---------------------------------------------------------------------------------------------------- training phases
@pytest.mark.parametrize(
    ("optimizer", "settings"),
    [("adam", {"weight_decay": 1e-3}), ("sgd", {"lr": 0.05, "momentum": 0.9, "nesterov": True, "weight_decay": 1e-3})],
)
def test_phases_over_different_set_sizes_with_batchnorm_equal_the_loop(optimizer: str, settings: dict, calls: list[int]) -> None:
    """Two phases (the second with a fresh optimizer), then a per-model phase continuing from the vectorised state."""
    results = {}
    for vectorise in (True, False):
        engine, handles = _clients(vectorise, optimizer, **settings)
        first = engine.fit_many([FitJob(h, s, 2, cross_entropy, 100 + k) for k, (h, s) in enumerate(zip(handles, _sets()))])
        second = engine.fit_many(
            [FitJob(h, s, 1, cross_entropy, 200 + k, fresh_optimizer=True) for k, (h, s) in enumerate(zip(handles, _sets()))]
        )
        engine.fit(FitJob(handles[0], _sets()[0], 1, cross_entropy, 300))  # one at a time, from the state the phases left
        results[vectorise] = handles, first + second
    assert calls == [4, 4]  # both phases took the vectorised path, all four clients at once
    (vec, vec_results), (loop, loop_results) = results[True], results[False]
    _assert_same_models(vec, loop)
    assert [r.steps for r in vec_results] == [r.steps for r in loop_results] == [12, 6, 6, 6, 6, 3, 3, 3]
    assert [r.mean_loss for r in vec_results] == pytest.approx([r.mean_loss for r in loop_results], rel=1e-5)
    assert int(vec[0].module.net[1].num_batches_tracked) == 12 + 6 + 6  # BatchNorm counted every step of client 0


@pytest.mark.parametrize(
    "objective", [l1_to_logits, soft_cross_entropy, kl_to_probs, fedgems_client(0.5, "code"), fedgems_client(0.5, "standard")]
)
def test_distillation_objectives_on_a_shared_public_set_equal_the_loop(objective: object, calls: list[int]) -> None:
    public = _sets()[0]
    targets = torch.softmax(torch.randn(len(public), 5, generator=torch.Generator().manual_seed(2)), -1)
    handles = {}
    for vectorise in (True, False):
        engine, handles[vectorise] = _clients(vectorise, "adam", net="pli_cnn")
        engine.fit_many([FitJob(h, public, 2, objective, k, targets=targets) for k, h in enumerate(handles[vectorise])])  # type: ignore[arg-type]
    assert calls == [4]
    _assert_same_models(handles[True], handles[False])


def test_predict_many_groups_architectures_and_equals_predict() -> None:
    """Heterogeneous clients (FD's point) group by architecture; BatchNorm predicts from its running statistics."""
    engine, handles = _clients(True, "adam")
    _, others = _clients(True, "adam", net="pli_cnn")
    engine.fit_many([FitJob(h, s, 1, cross_entropy, k) for k, (h, s) in enumerate(zip(handles, _sets()))])  # BatchNorm statistics move
    mixed = [handles[0], others[0], handles[1], others[1], handles[2]]
    images = _sets()[0].images
    stacked = engine.predict_many(mixed, images)
    assert stacked.shape == (5, len(images), 5)
    for row, handle in zip(stacked, mixed):
        torch.testing.assert_close(row, engine.predict(handle, images), rtol=1e-5, atol=1e-5)
    assert all(h.module.training for h in handles)  # eval mode only for the pass


def test_heterogeneous_clients_train_in_one_group_per_architecture(calls: list[int]) -> None:
    """(Weight decay, as in the phases above: BatchNorm cancels the preceding convolution's bias, whose gradient is then
    rounding noise, and Adam turns noise into steps of +-lr whose signs no two summation orders agree on.)"""
    handles = {}
    for vectorise in (True, False):
        engine, bn = _clients(vectorise, "adam", weight_decay=1e-3)
        _, cnn = _clients(vectorise, "adam", net="pli_cnn", engine=engine, weight_decay=1e-3)
        handles[vectorise] = [bn[0], cnn[0], bn[1], cnn[1]]
        results = engine.fit_many([FitJob(h, s, 1, cross_entropy, k) for k, (h, s) in enumerate(zip(handles[vectorise], _sets()))])
        assert [r.steps for r in results] == [6, 3, 3, 3]
    assert sorted(calls) == [2, 2]
    _assert_same_models(handles[True], handles[False])


def test_objectives_declare_whether_they_run_under_vmap() -> None:
    assert all(is_vmappable(o) for o in (cross_entropy, l1_to_logits, soft_cross_entropy, kl_to_probs, fedgems_client(0.1, "code")))
    assert not is_vmappable(mixed_ce_kl)  # which terms exist depends on the batch: Cronus' mixed phase trains one at a time
    assert not is_vmappable(lambda logits, batch: cross_entropy(logits, batch))  # a wrapper (a training defense's) is not, unless declared


def test_unsupported_jobs_take_the_loop_and_say_why_once(caplog: pytest.LogCaptureFixture, calls: list[int]) -> None:
    engine, handles = _clients("auto", "adam", net="pli_cnn")
    with caplog.at_level(logging.INFO, logger="fdattack.engine.trainer"):
        for seed in (1, 2):
            engine.fit_many([FitJob(h, s, 1, mixed_ce_kl, seed, targets=torch.zeros(len(s), 5)) for h, s in zip(handles, _sets())])
    assert calls == []
    lines = [m for m in own_messages(caplog) if "vectorise" in m]
    assert lines == ["trainer.vectorise=auto: training one model at a time where the objective 'mixed_ce_kl' is not declared vmappable"]


# ---------------------------------------------------------------------------------------------------- whole runs
@pytest.mark.parametrize("name", ["fedmd_digits", "dsfl_digits", "fedavg_digits"])
def test_vectorised_run_gives_the_loops_metrics(tmp_path: Path, name: str, calls: list[int]) -> None:
    metrics = {}
    for vectorise in ("true", "false"):
        cfg = compose(
            REPO / "conf" / "experiment" / f"{name}.yaml",
            tiny(tmp_path / vectorise, "protocol.num_clients=4", f"trainer.vectorise={vectorise}"),
        )
        metrics[vectorise] = {k: v for k, v in run(cfg).items() if not k.startswith("time/")}
        if vectorise == "true":
            assert calls and all(n >= 2 for n in calls)  # the client phases took the vectorised path (FedAvg samples 2 of 4)
    assert metrics["true"].keys() == metrics["false"].keys()
    assert metrics["true"] == pytest.approx(metrics["false"], rel=1e-3, abs=1e-4)


def test_resume_after_vectorised_rounds_is_exact(tmp_path: Path, calls: list[int]) -> None:
    out = tmp_path / "run"
    args = [
        "run",
        "protocol.num_clients=3",
        "protocol.rounds=3",
        "protocol.transfer_public_epochs=1",
        "protocol.transfer_private_epochs=1",
        "logger.wandb.mode=disabled",
        "logger.progress=never",
        "attacks=[]",
        "keep_checkpoints=2",
        "trainer.vectorise=true",
        f"output_dir={out}",
    ]
    assert main(args) == 0
    assert calls
    finished = (out / "rounds.jsonl").read_text().splitlines()
    (out / "checkpoints" / "round_0003.pt").unlink()  # resume from the checkpoint of round 2
    assert main([*args, "resume=true"]) == 0
    without_times = [{k: v for k, v in json.loads(x).items() if not k.startswith("time/")} for x in finished]
    assert [
        {k: v for k, v in json.loads(x).items() if not k.startswith("time/")} for x in (out / "rounds.jsonl").read_text().splitlines()
    ] == without_times


# ---------------------------------------------------------------------------------------------------- configuration
@pytest.mark.parametrize(
    ("extra", "named"),
    [
        (["trainer.devices=2", "trainer.strategy=ddp"], "trainer.devices=2"),
        (["trainer.precision=bf16-mixed"], "trainer.precision='bf16-mixed'"),
        (["defenses=[freeze]"], "defenses=['freeze']"),
    ],
)
def test_vectorise_true_where_it_cannot_apply_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, extra: list[str], named: str
) -> None:
    monkeypatch.setattr(DEFENSES, "_items", {**DEFENSES._items, "freeze": FreezeClients})
    out = tmp_path / "run"
    assert main(["run", *tiny(tmp_path), "trainer.vectorise=true", *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "trainer.vectorise=true" in err[0] and named in err[0] and "Traceback" not in err[0]
    assert not out.exists()


def test_vectorise_true_takes_dp_sgd_whose_steps_it_vectorises() -> None:
    compose(None, ["trainer.vectorise=true", "defenses=[dpsgd]"])
    with pytest.raises(ConfigError, match=r"trainer.vectorise=true: .*defenses=\['mid'\]"):
        compose(REPO / "conf" / "experiment" / "fedavg_digits.yaml", ["trainer.vectorise=true", "defenses=[mid]"])


def test_vectorise_takes_auto_true_or_false(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", *tiny(tmp_path), "trainer.vectorise=sometimes"]) == 2
    assert "trainer.vectorise='sometimes' is out of range" in capsys.readouterr().err
    assert main(["run", "--help-config"]) == 0
    assert "trainer.vectorise" in capsys.readouterr().out


def test_a_training_defense_under_auto_trains_one_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, calls: list[int], caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(DEFENSES, "_items", {**DEFENSES._items, "freeze": FreezeClients})
    with caplog.at_level(logging.INFO, logger="fdattack.engine.trainer"):
        assert main(["run", *tiny(tmp_path, "protocol.rounds=1", "defenses=[freeze]")]) == 0
    assert calls == []
    assert [m for m in own_messages(caplog) if "vectorise" in m] == [
        "trainer.vectorise=auto: training one model at a time where a training defense wraps the model's training"
    ]


def test_the_command_keeps_freed_memory_with_settings_glibc_accepts() -> None:
    from fdattack.engine import malloc

    expected = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"
    assert malloc.keep_freed_memory() is expected  # mallopt returns 0 for a parameter number it does not know
