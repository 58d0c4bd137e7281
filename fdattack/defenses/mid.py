"""MID (Wang, Zhang & Jia, AAAI 2021), the first model-inversion defense FedInverse tests (Wu et al., ICLR 2024, App. A.7).

Every client trains with it in each of its phases; the protocol and the attacks are unchanged. Two variants,
``defense.mid.variant``:

* ``vib`` (the default): the standard variational information bottleneck in the target model. The
  network's output layer, its last ``nn.Linear(F, J)``, becomes a :class:`VIBHead` (the MID/BiDO code's
  ``MCNN_vib``): an encoder Linear(F, 2K) gives μ and σ = softplus(s − 5) of a stochastic representation Z of
  dimension K = ⌊F/2⌋; training draws z = μ + σ·ε (ε ~ N(0, I)), evaluation takes z = μ; then a classifier
  Linear(K, J). The loss is the phase's loss (CE on private data) + β·KL(N(μ, σ²) ‖ N(0, I)), the KL summed over
  the K dimensions and averaged over the batch, in nats, as the BiDO/FedInverse ``train_vib``. Every client's
  network and the FedAvg server's carry the head (:meth:`MIDDefense.network_change`), so the aggregate averages it
  and the global model the white-box attacker inverts is the VIB model, deterministic in evaluation mode.
* ``dependency``, what the FedInverse code runs as "MID" (``measure=COCO, hsic_training=False``):
  the phase's loss + λ_x·d(X, logits), with d the code's kernel COCO (or nHSIC) between the flattened inputs
  (Gaussian kernel, width σ = 5 scaled by the dimension) and the logits (``kernel_y``: the code's ``--ktype``,
  linear by default). The network is unchanged.

The helpers here (:func:`output_layer`, :class:`Measure`, :func:`measured`, :class:`TermMeans`) serve BiDO too.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fdattack.data.imageset import IndexedBatch
from fdattack.defenses.base import DEFENSES, NetworkChange, TrainingDefense
from fdattack.functional.hsic import HSICOptions, dependence
from fdattack.knobs import Choice, knob
from fdattack.lit.classifier import Objective

#: the MID code's offset in σ = softplus(s − 5): a fresh head starts with σ ≈ e^−5, almost deterministic
STD_OFFSET = 5.0


class MIDVariant(Choice):
    vib = "vib"
    dependency = "dependency"


class Measure(Choice):
    """The dependency measure d of BiDO and of MID's dependency variant (the code's ``--measure``)."""

    nhsic = "nhsic"  #: the code's normalised HSIC (``HSIC``)
    coco = "coco"  #: the code's kernel COCO (``COCO``)


class KernelY(Choice):
    """The kernel on the second argument of d: one-hot labels (BiDO) or logits (MID), the code's ``--ktype``."""

    linear = "linear"
    gaussian = "gaussian"


_ESTIMATORS = {Measure.nhsic: "nhsic_code", Measure.coco: "coco_code"}


def measured(measure: Measure, sigma: float, kernel_y: KernelY = KernelY.gaussian) -> HSICOptions:
    """HSIC options of d(·, ·) as the BiDO code computes it: a Gaussian kernel of width σ (w = 2σ²d) on the first
    argument, ``kernel_y`` on the second."""
    return HSICOptions(estimator=_ESTIMATORS[Measure(measure)], kernel="gaussian", kernel_y=str(KernelY(kernel_y)), sigma=float(sigma))  # type: ignore[arg-type]


def dependence_or_zero(x: Tensor, y: Tensor, options: HSICOptions) -> Tensor:
    """d(x, y) over the paired rows, or 0 for fewer than 2 rows (centred kernels of one sample vanish)."""
    return dependence(x, y, options) if len(x) >= 2 else x.new_zeros(())


class TermMeans:
    """Per-round means of a defense's loss terms (its ``round_metrics``), summed on the device without a sync per step."""

    def __init__(self) -> None:
        self.sums: dict[str, Tensor] = {}
        self.counts: dict[str, int] = {}

    def add(self, **terms: Tensor) -> None:
        for key, value in terms.items():
            self.sums[key] = self.sums[key] + value.detach() if key in self.sums else value.detach()
            self.counts[key] = self.counts.get(key, 0) + 1

    def pop(self) -> dict[str, float]:
        """The means since the last call (none where no step ran), and a fresh start."""
        means = {key: float(total) / self.counts[key] for key, total in self.sums.items()}
        self.sums, self.counts = {}, {}
        return means


def gaussian_kl(mu: Tensor, std: Tensor) -> Tensor:
    """KL(N(μ, σ²) ‖ N(0, I)) = −½ Σ_k (1 + 2 log σ_k − μ_k² − σ_k²), averaged over the rows (nats)."""
    return -0.5 * (1 + 2 * std.log() - mu.pow(2) - std.pow(2)).sum(dim=1).mean()


class VIBHead(nn.Module):
    """A VIB output layer: Linear(F, 2K) → μ, σ = softplus(s − 5) → z = μ + σ·ε in training, μ in evaluation →
    Linear(K, J). A training forward keeps KL(N(μ, σ²) ‖ N(0, I)) for the loss (:meth:`take_kl`)."""

    def __init__(self, in_features: int, out_features: int, bottleneck: int | None = None) -> None:
        super().__init__()
        self.k = bottleneck or max(in_features // 2, 1)
        self.encoder = nn.Linear(in_features, 2 * self.k)
        self.classifier = nn.Linear(self.k, out_features)
        self._kl: Tensor | None = None

    def statistics(self, features: Tensor) -> tuple[Tensor, Tensor]:
        """(μ, σ) of Z given the penultimate ``features``."""
        mu, s = self.encoder(features).split(self.k, dim=-1)
        return mu, F.softplus(s - STD_OFFSET)

    def forward(self, features: Tensor) -> Tensor:
        mu, std = self.statistics(features)
        if not self.training:
            return self.classifier(mu)
        self._kl = gaussian_kl(mu, std) if torch.is_grad_enabled() else None
        return self.classifier(mu + std * torch.randn_like(std))

    def take_kl(self) -> Tensor:
        """The KL of the last training forward (then forgotten, so that no graph outlives its step)."""
        kl, self._kl = self._kl, None
        if kl is None:
            raise RuntimeError("VIBHead.take_kl: no training forward since the last loss")
        return kl

    def extra_repr(self) -> str:
        return f"{self.encoder.in_features} -> z {self.k} -> {self.classifier.out_features}"


def output_layer(net: nn.Module) -> tuple[str, nn.Module]:
    """(name, module) of the network's output layer: its :class:`VIBHead` where it has one, else its last registered
    ``nn.Linear`` (every registered classifier ends in one).

    Raises:
        ValueError: the network has no ``nn.Linear``.
    """
    found = None
    for name, module in net.named_modules():
        if isinstance(module, VIBHead):
            return name, module
        if isinstance(module, nn.Linear):
            found = (name, module)
    if found is None:
        raise ValueError("has no nn.Linear output layer; MID and BiDO need one")
    return found


def with_vib_head(net: nn.Module) -> nn.Module:
    """``net`` with its output layer Linear(F, J) replaced, in place, by a :class:`VIBHead` (F, ⌊F/2⌋, J)."""
    name, linear = output_layer(net)
    if isinstance(linear, VIBHead):
        return net
    parent = net.get_submodule(name.rpartition(".")[0])
    setattr(parent, name.rpartition(".")[2], VIBHead(linear.in_features, linear.out_features))
    return net


@dataclass
class MIDSettings:
    variant: MIDVariant = knob(
        MIDVariant.vib,
        "vib: a VIB output layer, loss + β·KL | dependency: the FedInverse code's loss + λ_x·d(X, logits), network unchanged",
    )
    beta: float = knob(
        0.01, "variant=vib: β of the KL term (nats); the MID/BiDO code uses 0.003, 0.01, 0.02, and 0.01 is its train_vib default", ge=0
    )
    lambda_x: float = knob(1.0, "variant=dependency: λ_x of d(X, logits) (the FedInverse code's default for COCO)", ge=0)
    measure: Measure = knob(Measure.coco, "variant=dependency: d, coco (the code's MID) | nhsic")
    kernel_y: KernelY = knob(KernelY.linear, "variant=dependency: kernel on the logits, linear (the code's --ktype default) | gaussian (σ)")
    sigma: float = knob(
        5.0, "variant=dependency: σ of the Gaussian kernel on the flattened inputs, width 2σ²d (0 = the code's median heuristic)", ge=0
    )


@DEFENSES.register("mid")
class MIDDefense(TrainingDefense):
    """MID in every client's training: a VIB output layer and its KL term, or the code's input–output dependency term.

    Per-round metrics: ``defense/mid/kl`` (vib) or ``defense/mid/dependence`` (dependency), the term's mean over the
    round's steps, before β or λ_x.
    """

    name = "mid"
    Settings = MIDSettings

    def __init__(self, settings: MIDSettings, seed: int) -> None:
        super().__init__(settings, seed)
        self.heads: dict[int, VIBHead] = {}
        self.terms = TermMeans()
        self.head_text = ""

    def network_change(self) -> NetworkChange | None:
        """:func:`with_vib_head` for the ``vib`` variant."""
        return with_vib_head if self.settings.variant == MIDVariant.vib else None

    def wrap_network(self, client: int, net: nn.Module) -> nn.Module:
        """Remember the client's VIB head (vib), whose KL its loss reads."""
        if self.settings.variant == MIDVariant.vib:
            name, head = output_layer(net)
            assert isinstance(head, VIBHead), "the protocol applies network_change before wrap_network"
            self.heads[client] = head
            self.head_text = f"{name}: Linear({head.extra_repr()})"
        return net

    def wrap_objective(self, client: int, objective: Objective) -> Objective:
        s = self.settings
        if s.variant == MIDVariant.vib:
            head, beta = self.heads[client], float(s.beta)

            def vib(logits: Tensor, batch: IndexedBatch) -> Tensor:
                kl = head.take_kl()
                self.terms.add(kl=kl)
                return objective(logits, batch) + beta * kl

            return vib
        options, lam = measured(s.measure, s.sigma, s.kernel_y), float(s.lambda_x)

        def dependency(logits: Tensor, batch: IndexedBatch) -> Tensor:
            term = dependence_or_zero(batch["x"].flatten(1), logits, options)
            self.terms.add(dependence=term)
            return objective(logits, batch) + lam * term

        return dependency

    def describe(self) -> str:
        s = self.settings
        if s.variant == MIDVariant.vib:
            return f"mid (vib, β={s.beta:g}; output layer → VIB head {self.head_text})"
        return f"mid (dependency, + {s.lambda_x:g}·{s.measure}(X, logits), σ={s.sigma:g}, {s.kernel_y} kernel on the logits)"

    def round_metrics(self) -> dict[str, float]:
        return self.terms.pop()
