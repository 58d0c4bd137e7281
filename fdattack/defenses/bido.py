"""BiDO (Peng et al., KDD 2022), bilateral dependency optimisation against model inversion (tested by Wu et al., ICLR 2024, App. A.7).

Every client trains each phase on L = loss + Σ_l [λ_x·d(X, Z_l) − λ_y·d(Z_l, Y)]: the hidden representations Z_l
are pushed to depend little on the input X and much on the label Y. As the BiDO/FedInverse code (``multilayer_hsic``):
d is the normalised HSIC (``measure=nhsic``, BiDO-HSIC) or kernel COCO (``coco``); X and every Z_l are flattened
and compared with a Gaussian kernel of width σ = 5 scaled by their dimension; Y is one-hot over the J classes, with
a linear kernel (``kernel_y``, the code's ``--ktype``). (λ_x, λ_y) = (2, 20) is the code's MNIST setting;
the optimizer stays the protocol's. X is the batch as the network receives it (fdattack's [−1, 1]).

The hidden layers are read with forward hooks (:func:`hidden_layers`): by default the output of every
``MaxPool2d``/``AvgPool2d`` that the network convolves after (the ends of its convolutional blocks), then the input
of its output layer (the penultimate features). For MCNN (``fedinverse_cnn``) that is the code's three conv blocks
(the third one flattened); for VGG16-BN its first four blocks and the pooled 512-d feature, as the code's five; for
a network without such pools (``mlp``, ``resnet18_gn``, ``mobilenet_v2``) the penultimate features alone, and
``defense.bido.layers`` names others by their module path (e.g. ``[layer1,layer2,layer3,layer4]`` for ResNet-18).

Rows without a label (public data in a distillation phase) take no part in the HSIC terms; a batch with fewer than two
labeled rows adds none (the code skips batches of one sample altogether).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from fdattack.data.imageset import UNLABELED, IndexedBatch
from fdattack.defenses.base import DEFENSES, TrainingDefense
from fdattack.defenses.mid import KernelY, Measure, TermMeans, dependence_or_zero, measured, output_layer
from fdattack.knobs import knob
from fdattack.lit.classifier import Objective

#: the name under which the penultimate features (the output layer's input) are captured
PENULTIMATE = "{} (input)"


def hidden_layers(net: nn.Module) -> list[str]:
    """BiDO's default hidden layers of ``net``, in order: every ``MaxPool2d``/``AvgPool2d`` registered before a later
    ``Conv2d``, then the output layer's input (named ``"<output layer> (input)"``)."""
    modules = list(net.named_modules())
    pools = [
        name
        for i, (name, module) in enumerate(modules)
        if isinstance(module, (nn.MaxPool2d, nn.AvgPool2d)) and any(isinstance(later, nn.Conv2d) for _, later in modules[i + 1 :])
    ]
    return [*pools, PENULTIMATE.format(output_layer(net)[0])]


class Capture:
    """Forward hooks that keep the named layers' outputs (and the output layer's input) of a training forward."""

    def __init__(self, net: nn.Module, layers: list[str]) -> None:
        self.layers = layers
        self.outputs: dict[str, Tensor] = {}
        self.handles: list[RemovableHandle] = []
        head = output_layer(net)[0]
        known = dict(net.named_modules())
        for layer in layers:
            if layer == PENULTIMATE.format(head):
                self.handles.append(known[head].register_forward_hook(self._keeper(layer, take_input=True)))
            elif layer in known and layer != "":
                self.handles.append(known[layer].register_forward_hook(self._keeper(layer, take_input=False)))
            else:
                top = ", ".join(name for name, _ in net.named_children())
                raise ValueError(
                    f"has no module {layer!r} (defense.bido.layers); name modules by their dotted path, e.g. "
                    f"{next(iter(hidden_layers(net)))!r} (top level: {top})"
                )

    def _keeper(self, layer: str, take_input: bool):  # type: ignore[no-untyped-def]
        def keep(module: nn.Module, inputs: tuple[Tensor, ...], output: Tensor) -> None:
            if module.training:
                self.outputs[layer] = inputs[0] if take_input else output

        return keep

    def take(self) -> list[Tensor]:
        """Z_l of the last training forward, in layer order (then forgotten, so that no graph outlives its step)."""
        outputs, self.outputs = self.outputs, {}
        missing = [layer for layer in self.layers if layer not in outputs]
        if missing:
            raise RuntimeError(f"BiDO: no training forward reached {missing} since the last loss")
        return [outputs[layer] for layer in self.layers]


@dataclass
class BiDOSettings:
    lambda_x: float = knob(2.0, "λ_x, weight of d(X, Z_l), minimised (the code's MNIST value; CelebA: 0.05)", ge=0)
    lambda_y: float = knob(20.0, "λ_y, weight of d(Z_l, Y), maximised (the code's MNIST value; CelebA: 0.5)", ge=0)
    measure: Measure = knob(
        Measure.nhsic, "d: nhsic (BiDO-HSIC, the code's normalised HSIC) | coco (BiDO-COCO; the code pairs it with λ = (1, 50))"
    )
    kernel_y: KernelY = knob(KernelY.linear, "kernel on the one-hot labels: linear (the code's --ktype default) | gaussian (σ)")
    sigma: float = knob(5.0, "σ of the Gaussian kernels on X and Z_l, width 2σ²d (0 = the code's median heuristic)", ge=0)
    layers: list[str] = knob(
        [],
        "hidden layers Z_l by module path (e.g. [features.3,features.7]; '<output layer> (input)' is the "
        "penultimate features); empty = every pooling layer followed by more convolution, then the "
        "penultimate features (MCNN: its three conv blocks)",
    )


@DEFENSES.register("bido")
class BiDODefense(TrainingDefense):
    """BiDO in every client's training: the HSIC terms on the hidden layers, read by forward hooks.

    Per-round metrics: ``defense/bido/hsic_x`` and ``hsic_y``, d(X, Z_l) and d(Z_l, Y) averaged over the layers and the
    round's steps (the code's ``Lxz``, ``Lyz``).
    """

    name = "bido"
    Settings = BiDOSettings

    def __init__(self, settings: BiDOSettings, seed: int) -> None:
        super().__init__(settings, seed)
        self.captures: dict[int, Capture] = {}
        self.terms = TermMeans()

    def wrap_network(self, client: int, net: nn.Module) -> nn.Module:
        """Hook the client's hidden layers (unchanged network, same ``state_dict``)."""
        self.captures[client] = Capture(net, list(self.settings.layers) or hidden_layers(net))
        return net

    def wrap_objective(self, client: int, objective: Objective) -> Objective:
        s = self.settings
        capture, lam_x, lam_y = self.captures[client], float(s.lambda_x), float(s.lambda_y)
        on_x, on_y = measured(s.measure, s.sigma), measured(s.measure, s.sigma, s.kernel_y)

        def bido(logits: Tensor, batch: IndexedBatch) -> Tensor:
            hidden = capture.take()
            loss = objective(logits, batch)
            if lam_x == 0 and lam_y == 0:
                return loss
            labeled = batch["y"] != UNLABELED
            x = batch["x"][labeled].flatten(1)
            y = F.one_hot(batch["y"][labeled], logits.shape[-1]).to(x.dtype)
            hx = [dependence_or_zero(z[labeled].flatten(1), x, on_x) for z in hidden]
            hy = [dependence_or_zero(z[labeled].flatten(1), y, on_y) for z in hidden]
            self.terms.add(hsic_x=sum(hx) / len(hx), hsic_y=sum(hy) / len(hy))
            return loss + sum(lam_x * a - lam_y * b for a, b in zip(hx, hy))

        return bido

    def describe(self) -> str:
        s = self.settings
        layers = ", ".join(next(iter(self.captures.values())).layers) if self.captures else "none"
        return f"bido ({s.measure}, λ_x={s.lambda_x:g}, λ_y={s.lambda_y:g}, σ={s.sigma:g}; layers {layers})"

    def round_metrics(self) -> dict[str, float]:
        return self.terms.pop()
