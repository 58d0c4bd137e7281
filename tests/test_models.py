"""Classifier registry: every entry sizes itself from (C, H, J) and returns (B, J) logits."""

from __future__ import annotations

from typing import Iterator

import pytest
import torch
from torch import nn

from fdattack.errors import ConfigError
from fdattack.models import CLASSIFIERS, build_classifier

NAMES = ["pli_cnn", "fedinverse_cnn", "scnn", "pdafd_cnn", "lattack_cnn", "lattack_mlp", "mlp", "resnet18_gn", "vgg16_bn", "mobilenet_v2"]
SHAPES = [(1, 8), (1, 28), (3, 32), (3, 64)]
J = 7


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    """Tiny convolutions gain nothing from intra-op threads; on a shared 2-core box they lose a lot."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_registry_holds_every_entry() -> None:
    assert sorted(NAMES) == CLASSIFIERS.names()


@pytest.mark.parametrize("name", NAMES)
def test_logits_shape_at_every_size(name: str) -> None:
    torch.manual_seed(0)
    for c, size in SHAPES:
        net = build_classifier(name, c, size, J).eval()
        with torch.no_grad():
            out = net(torch.randn(2, c, size, size))
        assert out.shape == (2, J), (name, c, size)
        assert torch.isfinite(out).all()


@pytest.mark.parametrize("name", NAMES)
def test_backward_in_train_mode(name: str) -> None:
    torch.manual_seed(0)
    net = build_classifier(name, 3, 8, J).train()
    loss = nn.functional.cross_entropy(net(torch.randn(2, 3, 8, 8)), torch.tensor([0, 6]))
    loss.backward()
    assert all(p.grad is not None for p in net.parameters())


@pytest.mark.parametrize(("name", "too_small", "minimum"), [("pli_cnn", 4, 5), ("pdafd_cnn", 7, 8), ("lattack_cnn", 7, 8)])
def test_too_small_image_is_a_clear_error(name: str, too_small: int, minimum: int) -> None:
    with pytest.raises(ValueError, match=rf"{name}.*at least {minimum}x{minimum}.*got {too_small}x{too_small}"):
        build_classifier(name, 1, too_small, J)
    build_classifier(name, 1, minimum, J)


@pytest.mark.parametrize("name", ["fedinverse_cnn", "scnn", "mlp", "resnet18_gn", "vgg16_bn", "mobilenet_v2"])
def test_size_agnostic_entries_accept_tiny_images(name: str) -> None:
    net = build_classifier(name, 1, 4, J).eval()
    with torch.no_grad():
        assert net(torch.randn(2, 1, 4, 4)).shape == (2, J)


def test_pli_cnn_parameter_count_matches_the_paper() -> None:
    # pli.md §4.1: 3x64x64 -> conv 32x62x62 -> pool 32x20x20 = 12,800 features; "12.8M" parameters at J = 1000.
    net = build_classifier("pli_cnn", 3, 64, 1000)
    conv = 3 * 32 * 9 + 32
    linear = 12_800 * 1000 + 1000
    assert sum(p.numel() for p in net.parameters()) == conv + linear == 12_801_896


def test_pli_cnn_flatten_size_for_digits() -> None:
    # 8x8 -> conv 6x6 -> pool 2x2.
    net = build_classifier("pli_cnn", 1, 8, 10)
    assert net.fc.in_features == 32 * 2 * 2


def test_fedinverse_cnn_flatten_sizes() -> None:
    # 32 -> conv7,p1 28 -> pool 14 -> conv5 10 -> pool 5 -> conv5 1; 64 -> 60 -> 30 -> 26 -> 13 -> 9.
    assert build_classifier("fedinverse_cnn", 1, 32, 5).fc.in_features == 256
    assert build_classifier("fedinverse_cnn", 1, 64, 5).fc.in_features == 256 * 9 * 9
    assert build_classifier("fedinverse_cnn", 1, 28, 5).fc.in_features == 256  # upsampled to 32


def test_scnn_is_the_specs_five_convs_with_a_512_d_embedding_at_any_size() -> None:
    # fedinverse.md §3.5: 32 -> conv7,p1 28 -> pool 14 -> conv5 10 -> pool 5 -> conv5 1 -> conv3,p1 1 -> conv3,p1 1 (512).
    net = build_classifier("scnn", 1, 32, 10)
    convs = [(m.in_channels, m.out_channels, m.kernel_size[0], m.padding[0]) for m in net.modules() if isinstance(m, nn.Conv2d)]
    assert convs == [(1, 32, 7, 1), (32, 64, 5, 0), (64, 128, 5, 0), (128, 256, 3, 1), (256, 512, 3, 1)]
    assert sum(isinstance(m, nn.MaxPool2d) for m in net.modules()) == 2 and (net.fc.in_features, net.fc.out_features) == (512, 10)
    inputs: list[torch.Tensor] = []
    net.fc.register_forward_pre_hook(lambda _, args: inputs.append(args[0]))
    with torch.no_grad():
        for size in (8, 28, 64):  # resized to 32 in forward: the embedding, FID's feature space, keeps its size
            assert net.eval()(torch.zeros(2, 1, size, size)).shape == (2, 10)
    assert [x.shape for x in inputs] == [(2, 512)] * 3


def test_mlp_input_size() -> None:
    net = build_classifier("mlp", 3, 32, J)
    linears = [m for m in net.modules() if isinstance(m, nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [(3 * 32 * 32, 128), (128, 64), (64, J)]


def test_resnet18_gn_has_groupnorm_only() -> None:
    net = build_classifier("resnet18_gn", 3, 32, J)
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in net.modules())
    groups = [m for m in net.modules() if isinstance(m, nn.GroupNorm)]
    assert len(groups) == 1 + 8 * 2 + 3  # stem, two per basic block, three downsample branches
    assert all(m.num_groups == 32 for m in groups)
    assert net.conv1.kernel_size == (3, 3) and net.conv1.stride == (1, 1) and net.conv1.bias is None
    assert isinstance(net.maxpool, nn.Identity)
    assert (net.fc.in_features, net.fc.out_features) == (512, J)


def test_mobilenet_v2_stem_and_head() -> None:
    net = build_classifier("mobilenet_v2", 1, 32, J)
    stem = net.features[0][0]
    assert (stem.in_channels, stem.out_channels, stem.stride, stem.bias) == (1, 32, (1, 1), None)
    assert isinstance(net.classifier[0], nn.Dropout) and net.classifier[0].p == 0.2
    assert (net.classifier[1].in_features, net.classifier[1].out_features) == (1280, J)


def test_vgg16_bn_head() -> None:
    net = build_classifier("vgg16_bn", 1, 32, J)
    assert net.features[0].in_channels == 1
    assert sum(isinstance(m, nn.BatchNorm2d) for m in net.modules()) == 13
    assert (net.classifier.in_features, net.classifier.out_features) == (512, J)


def test_unknown_name_lists_known_ones() -> None:
    with pytest.raises(ConfigError, match=r"model.name='resnet50'.*choose one of: .*mobilenet_v2.*pli_cnn"):
        build_classifier("resnet50", 3, 32, J)


def test_non_positive_sizes_are_rejected() -> None:
    with pytest.raises(ValueError, match="num_classes must be >= 1"):
        build_classifier("mlp", 1, 8, 0)


def test_lattack_mlp_is_the_specs_one_hidden_layer_of_200() -> None:
    """lattack.md §4.3: Flatten → Linear(784, 200) → ReLU → Linear(200, 10) at 28×28×1."""
    net = build_classifier("lattack_mlp", 1, 28, 10)
    linears = [(m.in_features, m.out_features) for m in net.modules() if isinstance(m, torch.nn.Linear)]
    assert linears == [(784, 200), (200, 10)]
    assert sum(isinstance(m, torch.nn.ReLU) for m in net.modules()) == 1


def test_lattack_cnn_is_the_specs_three_5x5_layers() -> None:
    """lattack.md §4.3: 5×5 convs of 32/64/128 channels with BN and max-pools, a linear head on 128·3·3 at 28 px."""
    net = build_classifier("lattack_cnn", 1, 28, 10)
    convs = [m for m in net.modules() if isinstance(m, torch.nn.Conv2d)]
    assert [(c.out_channels, c.kernel_size, c.padding) for c in convs] == [
        (32, (5, 5), (2, 2)),
        (64, (5, 5), (2, 2)),
        (128, (5, 5), (2, 2)),
    ]
    assert sum(isinstance(m, torch.nn.BatchNorm2d) for m in net.modules()) == 3
    head = [m for m in net.modules() if isinstance(m, torch.nn.Linear)]
    assert len(head) == 1 and head[0].in_features == 128 * 3 * 3
