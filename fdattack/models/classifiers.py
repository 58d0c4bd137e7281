"""Client and server classifiers, selected by ``model.name``.

Every entry of :data:`CLASSIFIERS` is a builder ``(in_channels, image_size, num_classes) -> nn.Module``
that sizes the network from the data; every network maps (B, C, H, H) images to (B, J) logits.

| name | source | smallest image |
|---|---|---|
| ``pli_cnn`` | PLI "Code 1" / ``OneCNN`` (Takahashi et al., CVPR 2023, App. B) | 5 px |
| ``fedinverse_cnn`` | MCNN (Wu et al., ICLR 2024, §4.2) | any (inputs below 32 px are upsampled to 32) |
| ``scnn`` | SCNN, FedInverse's MNIST evaluation classifier (Wu et al., ICLR 2024, §4.4; their code's) | any (inputs are resized to 32) |
| ``pdafd_cnn`` | 4-conv CNN (Shi et al., PoPETs 2025, §4.1.2) | 8 px |
| ``lattack_cnn`` | the L-Attack's 3-layer 5×5 CNN (Xiao et al., DSN 2024, §VI-B) | 8 px |
| ``lattack_mlp`` | the L-Attack's MLP, one hidden layer of 200 (Xiao et al., DSN 2024, §VI-B) | any |
| ``mlp`` | 3-layer MLP (Shi et al., PoPETs 2025, §4.1.2) | any |
| ``resnet18_gn`` | ResNet-18, 3×3 stem, GroupNorm(32) (Shi et al., PoPETs 2025, §4.1.2; the norm from their code) | any |
| ``vgg16_bn`` | VGG16-BN features, 1×1 average pool, Linear(512, J) (Wu et al., ICLR 2024, §4.2; for CIFAR-10 a choice) | any |
| ``mobilenet_v2`` | MobileNetV2 with a stride-1 stem (Shi et al., PoPETs 2025, §4.1.2; the stem from their code) | any |

Builders raise :class:`ValueError` naming the network and the smallest size when the image is too small.
"""

from __future__ import annotations

from typing import Callable

import torch.nn.functional as F
from torch import Tensor, nn
from torchvision.models import mobilenet_v2 as tv_mobilenet_v2
from torchvision.models import resnet18 as tv_resnet18
from torchvision.models.vgg import cfgs as vgg_cfgs
from torchvision.models.vgg import make_layers as vgg_make_layers

from fdattack.registry import Registry

ClassifierBuilder = Callable[[int, int, int], nn.Module]

CLASSIFIERS: Registry[ClassifierBuilder] = Registry("classifier", "model.name")


def build_classifier(name: str, in_channels: int, image_size: int, num_classes: int) -> nn.Module:
    """Build classifier ``name`` for (in_channels, image_size, image_size) inputs and ``num_classes`` outputs.

    Raises:
        ConfigError: ``name`` is not registered (the message lists the known names).
        ValueError: a size is not positive, or the image is too small for the network.
    """
    builder = CLASSIFIERS.get(name)
    for what, value in (("in_channels", in_channels), ("image_size", image_size), ("num_classes", num_classes)):
        if value < 1:
            raise ValueError(f"classifier {name!r}: {what} must be >= 1, got {value}")
    return builder(in_channels, image_size, num_classes)


def _too_small(name: str, image_size: int, minimum: int, why: str) -> ValueError:
    return ValueError(f"classifier {name!r} needs images of at least {minimum}x{minimum} px ({why}); got {image_size}x{image_size}")


class PLICNN(nn.Module):
    """PLI's ``OneCNN`` (Takahashi et al., CVPR 2023, App. B, Code 1): Conv2d(C, 32, 3) → ReLU → MaxPool2d(3, 3) →
    Flatten → Linear(32·s², J).

    s = ⌊(H − 2) / 3⌋: 20 at 64 px (12,800 features), 2 at 8 px.
    """

    def __init__(self, in_channels: int, image_size: int, num_classes: int) -> None:
        super().__init__()
        if image_size < 5:
            raise _too_small("pli_cnn", image_size, 5, "the 3x3 conv leaves H-2 pixels and the 3x3 max-pool needs 3")
        side = (image_size - 2) // 3
        self.features = nn.Sequential(nn.Conv2d(in_channels, 32, 3), nn.ReLU(), nn.MaxPool2d(3, 3), nn.Flatten())
        self.fc = nn.Linear(32 * side * side, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(self.features(x))


class MCNN(nn.Module):
    """The GMI/KED-MI MCNN of FedInverse (Wu et al., ICLR 2024, §4.2), designed for 1×32×32 inputs.

    Conv(C→64, k7, p1)+BN+LReLU(0.2)+MaxPool2 → Conv(64→128, k5)+BN+LReLU+MaxPool2 → Conv(128→256, k5)+BN+LReLU
    → Flatten → Linear(256·s², J). 32 px is the smallest input the valid convolutions accept (s = 1). Smaller
    inputs are bilinearly resized to 32×32 in ``forward`` (as FedInverse resizes 28-px MNIST to 32); larger
    ones keep their size and the linear layer grows (s = 9 at 64 px). Returns logits only (the authors'
    network also returns its hidden activations).
    """

    min_size = 32

    def __init__(self, in_channels: int, image_size: int, num_classes: int) -> None:
        super().__init__()
        self.input_size = max(image_size, self.min_size)
        side = ((((self.input_size - 4) // 2) - 4) // 2) - 4
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 64, 7, stride=1, padding=1),
            nn.BatchNorm2d(64),
            nn.LeakyReLU(0.2),
            nn.MaxPool2d(2),
            nn.Conv2d(64, 128, 5),
            nn.BatchNorm2d(128),
            nn.LeakyReLU(0.2),
            nn.MaxPool2d(2),
            nn.Conv2d(128, 256, 5),
            nn.BatchNorm2d(256),
            nn.LeakyReLU(0.2),
            nn.Flatten(),
        )
        self.fc = nn.Linear(256 * side * side, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        if x.shape[-1] < self.min_size or x.shape[-2] < self.min_size:
            x = F.interpolate(x, size=(self.min_size, self.min_size), mode="bilinear", align_corners=False)
        return self.fc(self.features(x))


class SCNN(nn.Module):
    """The SCNN that scores FedInverse's MNIST inversions (Wu et al., ICLR 2024, §4.4; the network from their code),
    designed for 1×32×32 inputs.

    Conv(C→32, k7, p1)+BN+LReLU(0.2)+MaxPool2 → Conv(32→64, k5)+BN+LReLU+MaxPool2 → Conv(64→128, k5)+BN+LReLU
    → Conv(128→256, k3, p1)+BN+LReLU → Conv(256→512, k3, p1)+BN+LReLU → Flatten (512) → Linear(512, J).
    Images of any other size are bilinearly resized to 32×32 in ``forward`` (as FedInverse resizes 28-px MNIST),
    so that the 512-d embedding, the feature space of FID (Wu et al., ICLR 2024, §4.4), keeps its size.
    """

    size = 32

    def __init__(self, in_channels: int, num_classes: int) -> None:
        super().__init__()
        widths = (in_channels, 32, 64, 128, 256, 512)
        kernels, paddings, pooled = (7, 5, 5, 3, 3), (1, 0, 0, 1, 1), (True, True, False, False, False)
        layers: list[nn.Module] = []
        for i, (k, p, pool) in enumerate(zip(kernels, paddings, pooled)):
            layers += [nn.Conv2d(widths[i], widths[i + 1], k, padding=p), nn.BatchNorm2d(widths[i + 1]), nn.LeakyReLU(0.2)]
            layers += [nn.MaxPool2d(2)] if pool else []
        self.features = nn.Sequential(*layers, nn.Flatten())
        self.fc = nn.Linear(widths[-1], num_classes)

    def forward(self, x: Tensor) -> Tensor:
        if x.shape[-2:] != (self.size, self.size):
            x = F.interpolate(x, size=(self.size, self.size), mode="bilinear", align_corners=False)
        return self.fc(self.features(x))


@CLASSIFIERS.register("pli_cnn")
def pli_cnn(in_channels: int, image_size: int, num_classes: int) -> nn.Module:
    """PLI "Code 1" (Takahashi et al., CVPR 2023, App. B); 12.8M parameters at 3×64×64 with J = 1000."""
    return PLICNN(in_channels, image_size, num_classes)


@CLASSIFIERS.register("fedinverse_cnn")
def fedinverse_cnn(in_channels: int, image_size: int, num_classes: int) -> nn.Module:
    """FedInverse MNIST target model, MCNN (Wu et al., ICLR 2024, §4.2)."""
    return MCNN(in_channels, image_size, num_classes)


@CLASSIFIERS.register("scnn")
def scnn(in_channels: int, image_size: int, num_classes: int) -> nn.Module:
    """FedInverse MNIST evaluation classifier, SCNN (Wu et al., ICLR 2024, §4.4; the network from their code); 512-d
    embedding at any image size."""
    return SCNN(in_channels, num_classes)


@CLASSIFIERS.register("pdafd_cnn")
def pdafd_cnn(in_channels: int, image_size: int, num_classes: int) -> nn.Module:
    """PDA-FD Fashion-MNIST CNN (Shi et al., PoPETs 2025, §4.1.2): 4 padded 3×3 convs, three AvgPool2, global average pool."""
    if image_size < 8:
        raise _too_small("pdafd_cnn", image_size, 8, "three 2x2 average pools")
    return nn.Sequential(
        nn.Conv2d(in_channels, 32, 3, padding=1),
        nn.ReLU(),
        nn.AvgPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1),
        nn.ReLU(),
        nn.AvgPool2d(2),
        nn.Conv2d(64, 64, 3, padding=1),
        nn.ReLU(),
        nn.AvgPool2d(2),
        nn.Conv2d(64, 128, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(128, num_classes),
    )


@CLASSIFIERS.register("lattack_cnn")
def lattack_cnn(in_channels: int, image_size: int, num_classes: int) -> nn.Module:
    """The L-Attack's "3-layer CNN" with 5×5 filters (Xiao et al., DSN 2024, §VI-B; the channel widths are not given
    there): three [Conv5×5 (32, 64, 128 channels, padding 2), BN, ReLU, MaxPool2], Flatten, Linear (128·3·3 inputs at
    28 px, 128·4·4 at 32 px)."""
    if image_size < 8:
        raise _too_small("lattack_cnn", image_size, 8, "three 2x2 max pools")
    layers: list[nn.Module] = []
    for c_in, c_out in ((in_channels, 32), (32, 64), (64, 128)):
        layers += [nn.Conv2d(c_in, c_out, 5, padding=2), nn.BatchNorm2d(c_out), nn.ReLU(), nn.MaxPool2d(2)]
    side = image_size // 2 // 2 // 2
    return nn.Sequential(*layers, nn.Flatten(), nn.Linear(128 * side * side, num_classes))


@CLASSIFIERS.register("lattack_mlp")
def lattack_mlp(in_channels: int, image_size: int, num_classes: int) -> nn.Module:
    """The L-Attack paper's MLP of hidden size 200 (Xiao et al., DSN 2024, §VI-B): Flatten → Linear(C·H·W, 200) → ReLU → Linear(200, J)."""
    return nn.Sequential(nn.Flatten(), nn.Linear(in_channels * image_size * image_size, 200), nn.ReLU(), nn.Linear(200, num_classes))


@CLASSIFIERS.register("mlp")
def mlp(in_channels: int, image_size: int, num_classes: int) -> nn.Module:
    """PDA-FD Purchase MLP (Shi et al., PoPETs 2025, §4.1.2): Flatten → Linear(C·H·W, 128) → ReLU → Linear(128, 64) →
    ReLU → Linear(64, J)."""
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(in_channels * image_size * image_size, 128),
        nn.ReLU(),
        nn.Linear(128, 64),
        nn.ReLU(),
        nn.Linear(64, num_classes),
    )


@CLASSIFIERS.register("resnet18_gn")
def resnet18_gn(in_channels: int, image_size: int, num_classes: int) -> nn.Module:
    """torchvision ResNet-18 (weights=None) as in PDA-FD (Shi et al., PoPETs 2025, §4.1.2; the stem and GroupNorm from their code).

    conv1 = Conv2d(C, 64, 3, 1, 1, bias=False), maxpool = Identity, every BatchNorm2d (stem, blocks,
    downsample) is GroupNorm(32, channels), fc = Linear(512, J). The adaptive average pool accepts any size.
    """
    net = tv_resnet18(weights=None, num_classes=num_classes, norm_layer=lambda channels: nn.GroupNorm(32, channels))
    net.conv1 = nn.Conv2d(in_channels, 64, 3, stride=1, padding=1, bias=False)
    nn.init.kaiming_normal_(net.conv1.weight, mode="fan_out", nonlinearity="relu")
    net.maxpool = nn.Identity()
    return net


class VGG16BN(nn.Module):
    """VGG16-BN features (torchvision config "D", batch norm) → AdaptiveAvgPool2d(1) → Flatten → Linear(512, J).

    The first conv takes C channels. The five max-pools use ``ceil_mode=True`` so that images that are not a
    multiple of 32 px (28, 8) keep a non-empty map; for multiples of 32 this equals torchvision's pools. The
    ImageNet head is replaced by one linear layer on the pooled 512 features, a simplification of the
    authors' 2048-d BN head (the FedInverse code; Wu et al., ICLR 2024, §4.2). Initialisation follows torchvision's ``VGG``.
    """

    def __init__(self, in_channels: int, num_classes: int) -> None:
        super().__init__()
        self.features = vgg_make_layers(vgg_cfgs["D"], batch_norm=True)
        self.features[0] = nn.Conv2d(in_channels, 64, 3, padding=1)
        for layer in self.features:
            if isinstance(layer, nn.MaxPool2d):
                layer.ceil_mode = True
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Linear(512, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
        nn.init.normal_(self.classifier.weight, 0, 0.01)
        nn.init.zeros_(self.classifier.bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(self.pool(self.features(x)).flatten(1))


@CLASSIFIERS.register("vgg16_bn")
def vgg16_bn(in_channels: int, image_size: int, num_classes: int) -> nn.Module:
    """VGG16-BN with a 1×1 pooled 512-d head (Wu et al., ICLR 2024, §4.2; the paper gives no CIFAR-10 model, this one is a choice)."""
    return VGG16BN(in_channels, num_classes)


@CLASSIFIERS.register("mobilenet_v2")
def mobilenet_v2(in_channels: int, image_size: int, num_classes: int) -> nn.Module:
    """torchvision MobileNetV2 (weights=None) as in PDA-FD (Shi et al., PoPETs 2025, §4.1.2; the stem from their code).

    features[0][0] = Conv2d(C, 32, 3, 1, 1, bias=False); classifier = [Dropout(0.2), Linear(1280, J)];
    BatchNorm is kept.
    """
    net = tv_mobilenet_v2(weights=None)
    net.features[0][0] = nn.Conv2d(in_channels, 32, 3, stride=1, padding=1, bias=False)
    nn.init.kaiming_normal_(net.features[0][0].weight, mode="fan_out")
    linear = nn.Linear(1280, num_classes)
    nn.init.normal_(linear.weight, 0, 0.01)
    nn.init.zeros_(linear.bias)
    net.classifier = nn.Sequential(nn.Dropout(0.2), linear)
    return net
