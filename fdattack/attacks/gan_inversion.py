"""What the GAN model-inversion attacks share (Wu et al., ICLR 2024, §3.1, §3.2, Algorithm 1): the FedAvg client's view, the HSIC knobs.

The attacker is a participating FedAvg client (white-box): after every aggregation it reads the global model's weights
from ``RoundRecord.global_state`` (the model after the t-th aggregation, as the FedInverse code attacks it), rebuilds
the network from the clients' shared architecture (``view.architecture``) and attacks it at the round's end. Its GANs
train on its own prior data (``view.prior_data``, disjoint classes) through the attacks' engine, seeded, and are cached
in the attack's state directory, so a resumed run reuses them. Generated images are in [0, 1] (sigmoid); the target
model sees 2x − 1, the range it was trained on, and HSIC is taken on the raw [0, 1] images, pixel space, as the code
does. The results are :class:`~fdattack.attacks.results.Inversions` in [-1, 1]; the evaluation side scores them.
"""

from __future__ import annotations

import hashlib
import logging
from abc import abstractmethod
from dataclasses import dataclass
from functools import partial
from typing import Callable, Iterable, Optional

import torch
from torch import Tensor, nn

from fdattack import lit, models
from fdattack.attacks.base import Attack, AttackContext
from fdattack.attacks.common import engine_or_default
from fdattack.attacks.results import AttackResult, Inversions
from fdattack.code_version import source_digest
from fdattack.engine import Batchable, TensorRows, epoch_order
from fdattack.errors import ConfigError
from fdattack.fd.record import RoundRecord
from fdattack.fd.threat import AttackerView, Capability, ViewPart
from fdattack.functional.hsic import HSICOptions, hsic_loss_term
from fdattack.knobs import Choice, knob
from fdattack.lit.gan import WGANGP, ManualGAN
from fdattack.models.gan import SIZES, to_signed, valid_size
from fdattack.randomness import derive_seed, seeded
from fdattack.tracking.artifact_cache import digest
from fdattack.tracking.progress import progress_iter

log = logging.getLogger(__name__)

#: ``x (B, C, H, W) in [0, 1] -> sign · λ_H · HSIC(x1, x2)`` of one latent batch, or None when λ_H = 0
HSICTerm = Optional[Callable[[Tensor], Tensor]]


#: the target-agnostic GANs' entries in the attack's cache (``cache_dir``)
GAN_CACHE_KIND = "gan"


class HSICEstimator(Choice):
    nhsic_code = "nhsic_code"
    biased_eq3 = "biased_eq3"
    unbiased = "unbiased"
    coco_code = "coco_code"


class HSICKernel(Choice):
    gaussian = "gaussian"
    linear = "linear"
    imq = "imq"


class MedianRule(Choice):
    code = "code"
    gretton = "gretton"


@dataclass
class GANInversionSettings:
    """Knobs GMI and KED-MI share: the latent search, the label batches, the GAN's training and the HSIC term."""

    iterations: int = knob(3000, "latent-search iterations per batch of target labels and round", ge=1)
    lr: float = knob(0.02, "learning rate of the latent search", gt=0)
    lambda_id: float = knob(100.0, "λ_id, weight of the identity loss CE(T(2G(z) − 1), y) (the code: 100)", ge=0)
    label_batch: Optional[int] = knob(
        None,
        "target labels optimised together (GMI: one latent each, KED-MI: one Gaussian each), split in halves for HSIC (the code: 60 of "
        "CelebA's 300 identities, all 5 digits); null = all",
        ge=1,
    )
    z_dim: int = knob(100, "latent size of the generator", ge=1)
    gan_width: int = knob(64, "base width of the GAN networks (the code's dim)", ge=1)
    gan_epochs: int = knob(100, "GAN training epochs over the prior data", ge=0)
    gan_batch_size: int = knob(64, "GAN mini-batch size (the last, incomplete batch of an epoch is left out)", ge=2)
    gan_lr: float = knob(
        2e-4, "Adam learning rate of the GAN's networks, β = (0.5, 0.999) (the FedInverse code: 2e-4; GMI's MNIST prior 4e-3)", gt=0
    )
    n_critic: int = knob(5, "discriminator steps per generator step", ge=1)
    hsic_lambda: float = knob(
        0.0,
        "λ_H, weight of HSIC(x1, x2) between the halves of every latent batch (FedInverse's Eq. 11): 0 = the baseline attack, "
        "0.05 the code's HSIC runs (the paper gives no value)",
        ge=0,
    )
    hsic_sign: int = knob(
        1,
        "+1 adds λ_H·HSIC, the released code | -1 subtracts it, the paper's Eq. 11 as reconstructed, the diversity form",
        among=(1, -1),
    )
    hsic_estimator: HSICEstimator = knob(
        HSICEstimator.nhsic_code,
        "nhsic_code (the code's normalised HSIC) | biased_eq3 (the paper's Eq. 3) | unbiased (Song et al.) | coco_code (kernel COCO, the "
        "code's BATCHCOCO)",
    )
    hsic_kernel: HSICKernel = knob(HSICKernel.gaussian, "kernel on the flattened images: gaussian | linear | imq")
    hsic_sigma: float = knob(5.0, "Gaussian width σ; 0 = the median heuristic named by hsic_median", ge=0)
    hsic_sigma_scale_by_dim: bool = knob(True, "a fixed σ is scaled by the pixel count d as the code does (width 2σ²d); false: 2σ²")
    hsic_median: MedianRule = knob(
        MedianRule.code, "median heuristic of hsic_sigma=0: code (the released code's) | gretton (median pairwise distance)"
    )
    hsic_eps: float = knob(1e-5, "ridge ε of nhsic_code", gt=0)

    def hsic_term(self) -> HSICTerm:
        """The signed, weighted HSIC term of one latent batch, or None for the baseline (λ_H = 0)."""
        if self.hsic_lambda == 0:
            return None
        return partial(hsic_loss_term, lambda_h=self.hsic_lambda, sign=self.hsic_sign, options=self.hsic_options())

    def hsic_options(self) -> HSICOptions:
        """The HSIC estimator, kernel and bandwidth these settings name."""
        return HSICOptions(
            estimator=str(self.hsic_estimator),
            kernel=str(self.hsic_kernel),
            sigma=self.hsic_sigma,  # type: ignore[arg-type]
            sigma_scale_by_dim=self.hsic_sigma_scale_by_dim,
            median=str(self.hsic_median),
            eps=self.hsic_eps,
        )  # type: ignore[arg-type]


def full_batches(n: int, seed: int, batch_size: int) -> list[Tensor]:
    """One epoch's seeded mini-batches without the incomplete last one (a generator's BatchNorm needs two samples);
    all ``n`` rows in one batch when ``n < batch_size``. A :data:`~fdattack.engine.trainer.BatchSampler`."""
    order = epoch_order(n, seed)
    keep = n - n % batch_size if n >= batch_size else n
    return list(torch.split(order[:keep], batch_size))


def label_chunks(count: int, size: Optional[int]) -> list[slice]:
    """Consecutive slices of ``size`` target labels (the last may be shorter); one slice of all when ``size`` is None."""
    size = count if size is None else size
    return [slice(start, min(start + size, count)) for start in range(0, count, size)]


GENERATE_BATCH = 1024  #: images per generator pass when making the results


@torch.no_grad()
def generate(generator: nn.Module, z: Tensor) -> Tensor:
    """G(z) for latents (S, T, d): images (S, T, C, H, W) in [0, 1], in passes of :data:`GENERATE_BATCH` (eval mode)."""
    flat = z.flatten(0, 1)
    x = torch.cat([generator(part) for part in torch.split(flat, GENERATE_BATCH)])
    return x.view(*z.shape[:2], *x.shape[1:])


@torch.no_grad()
def target_top1(target: nn.Module, images: Tensor, labels: Tensor) -> float:
    """Share of images (S, T, C, H, W) in [0, 1] that the target model (which sees 2x − 1) puts in their column's label
    (T,): the attack's own check that its search converged, not the evaluation side's score."""
    flat = images.flatten(0, 1)
    predicted = torch.cat([target(to_signed(part)).argmax(dim=1) for part in torch.split(flat, GENERATE_BATCH)])
    return float((predicted.view(images.shape[:2]) == labels).float().mean())


def state_digest(*parts: object) -> str:
    """A short hex digest of ``parts``: tensors by their bytes, everything else by its repr."""
    digest = hashlib.blake2b(digest_size=8)
    for part in parts:
        if isinstance(part, Tensor):
            digest.update(part.detach().cpu().contiguous().numpy().tobytes())
        else:
            digest.update(repr(part).encode())
    return digest.hexdigest()


def gan_key(seed: int, settings: GANInversionSettings, image_shape: tuple, prior: str, keys: tuple, recipe: dict, code: str) -> str:
    """A GAN's key: a digest of everything its training reads (the attacker's seed, the attack's settings whole, the
    image shape, the prior data's digest ``prior``, the caller's ``keys``, the engine's
    :meth:`~fdattack.engine.LocalTrainer.recipe` and the code's :func:`~fdattack.code_version.source_digest`)."""
    return digest(seed, settings, tuple(image_shape), prior, keys, recipe, code)


class GANInversionAttack(Attack):
    """Base of GMI and KED-MI: collects the global model after each aggregation and inverts it at the round's end.

    Subclasses implement :meth:`invert`. One :class:`Inversions` per round: images (S, T, C, H, W) in [-1, 1] for the
    T target labels, and the final loss terms as ``details``.

    Raises:
        ConfigError: no prior data, no shared architecture, images the GAN networks cannot make, or label batches
            too small to split for HSIC.
    """

    needs = frozenset({Capability.white_box, Capability.private_targets, Capability.prior_data})
    reads = frozenset({ViewPart.prior_data})
    produces = frozenset({Inversions})

    def __init__(self, view: AttackerView, settings: GANInversionSettings, context: AttackContext) -> None:
        super().__init__(view, settings, context)
        self.settings: GANInversionSettings = settings
        key = f"attack.{self.name}"
        if view.prior_data is None or len(view.prior_data) == 0:
            raise ConfigError(
                f"{key} trains its GAN on the attacker's prior data, which this run does not give it; set data.split=classes and "
                f"data.public_classes"
            )
        if view.architecture is None:
            raise ConfigError(f"{key} rebuilds the global model from the clients' shared architecture, and these clients have several")
        _, h, w = view.image_shape
        if h != w or not valid_size(h):
            raise ConfigError(f"{key}: the GAN networks need {SIZES}, got {h}x{w}; set data.image_size (e.g. 32)")
        self.chunks = label_chunks(len(view.target_labels), settings.label_batch)
        needed = 8 if settings.hsic_estimator == HSICEstimator.unbiased else 4
        if settings.hsic_lambda > 0:
            self.check_hsic_batch(needed)
        self.engine = engine_or_default(context, settings.gan_batch_size)
        self.device = self.engine.fabric.device
        self.targets = torch.as_tensor(view.target_labels, dtype=torch.long)
        self.global_state: Optional[dict[str, Tensor]] = None
        self._prior_digest: Optional[str] = None
        self._wgan_prior: Optional[WGANGP] = None

    def check_hsic_batch(self, needed: int) -> None:
        """Raise unless every batch the HSIC term splits in halves has ``needed`` images: here, the label batches."""
        smallest = min(chunk.stop - chunk.start for chunk in self.chunks)
        if smallest < needed:
            key = f"attack.{self.name}"
            raise ConfigError(
                f"{key}.hsic_lambda > 0 splits every batch of target labels into halves of at least {needed // 2} "
                f"({self.settings.hsic_estimator}); "
                f"the smallest batch has {smallest} labels: raise {key}.label_batch or attack more labels"
            )

    # ------------------------------------------------------------------ rounds
    def on_record(self, record: RoundRecord) -> None:
        """Keep the global model's weights after the round's aggregation (as the FedInverse code)."""
        if record.attack_point and record.global_state is not None:
            self.global_state = dict(record.global_state)

    def on_round_end(self, round: int) -> list[AttackResult]:
        """The latent search of every batch of target labels against the round's global model."""
        state, self.global_state = self.global_state, None
        if state is None:
            return []
        target = self.target_model(state)
        gan = self.gan(round, target, state)
        images, losses = [], []
        for chunk in self.chunks:
            labels = self.targets[chunk].to(self.device)
            steps = progress_iter(
                range(self.settings.iterations),
                f"{self.name}: latent search of round {round}, labels {chunk.start}..{chunk.stop - 1}",
                self.context.progress,
            )
            z, chunk_losses = self.search(gan, target, labels, steps, round, chunk)
            images.append(generate(gan.generator, z))
            losses.append((chunk.stop - chunk.start, chunk_losses))
        x = torch.cat(images, dim=1)
        total = sum(n for n, _ in losses)
        details = {k: sum(n * chunk_losses[k] for n, chunk_losses in losses) / total for k in losses[0][1]}
        details["target_top1"] = target_top1(target, x, self.targets.to(self.device))
        return [Inversions(to_signed(x).cpu(), self.targets.clone(), details=details)]

    @abstractmethod
    def gan(self, round: int, target: nn.Module, state: dict[str, Tensor]) -> ManualGAN:
        """The trained GAN the latent search of ``round`` uses (``target``: the round's global model, ``state`` its weights)."""

    @abstractmethod
    def search(
        self, gan: ManualGAN, target: nn.Module, labels: Tensor, steps: Iterable[int], round: int, chunk: slice
    ) -> tuple[Tensor, dict[str, float]]:
        """The latent search of ``round`` for one batch of target ``labels`` (t,) (the target labels' ``chunk``), one
        iteration per element of ``steps``.

        Returns:
            the latents (S, t, z_dim) of the S samples per label, and the final loss terms (means).
        """

    def target_model(self, state: dict[str, Tensor]) -> nn.Module:
        """The global model rebuilt from ``state`` (the server module's ``net.…`` keys): frozen, eval mode, on the device."""
        net = self.view.global_network()  # the architecture as trained, a defense's change (MID's VIB head) included
        net.load_state_dict({k.removeprefix("net."): v for k, v in state.items()})
        return net.requires_grad_(False).eval().to(self.device)

    # ------------------------------------------------------------------ the GANs
    def wgan_prior(self) -> WGANGP:
        """GMI's target-agnostic WGAN-GP prior on the prior data (Wu et al., ICLR 2024, Eq. 4): trained on the first call (or restored
        from the attack's state folder or its cache), then kept. Seeded as GMI's, so that VMI mines the prior GMI trains."""
        if self._wgan_prior is None:
            s, (c, h, _) = self.settings, self.view.image_shape
            seed = derive_seed(self.context.seed, "gmi", "gan")
            with seeded(seed, self.device):
                module = WGANGP(c, h, s.z_dim, s.gan_width, s.gan_lr, s.n_critic)
            rows = TensorRows(x=self.view.prior_data.images)  # type: ignore[union-attr]
            self._wgan_prior = self.cached_gan(module, lambda epoch: rows, seed, "WGAN-GP prior", across_runs=True)  # type: ignore[assignment]
        return self._wgan_prior  # type: ignore[return-value]

    def train_gan(self, module: ManualGAN, rows: Callable[[int], Batchable], seed: int, what: str) -> None:
        """Train ``module`` (already built under :func:`seeded` with ``seed``) for ``gan_epochs`` epochs through the
        engine; ``rows(epoch)`` gives each epoch's rows. Leaves the networks frozen in eval mode."""
        s = self.settings
        handle = self.engine.setup(f"{self.name}_gan", module)
        with seeded(derive_seed(seed, "noise"), self.device):
            for epoch in progress_iter(range(s.gan_epochs), f"{self.name}: {what}", self.context.progress):
                self.engine.fit_module(handle, rows(epoch), 1, derive_seed(seed, epoch), batch_size=s.gan_batch_size, sampler=full_batches)
        self.engine.release(handle)
        module.requires_grad_(False).eval()

    def cached_gan(
        self, module: ManualGAN, rows: Callable[[int], Batchable], seed: int, what: str, *keys: object, across_runs: bool = False
    ) -> ManualGAN:
        """``module`` trained (:meth:`train_gan`) or, when the attack's state directory holds it (resume), restored.

        The file, ``attack_state/<attack>/gan/<module class>_<digest>.pt`` (each attack's own: isolated attacks share no
        folder), is named by everything the GAN depends on: the attacker's seed, the GAN settings, the prior data and
        ``keys``. ``across_runs``: a GAN that depends on nothing else (no target model) is also kept in the attack's cache
        (``cache_dir``), where later runs with the same inputs find it.
        """
        key = self._cache_key(type(module).__name__.lower(), *keys)
        saved = self.context.store.load_artifact(key)
        if saved is None and across_runs and self.context.cache is not None:
            made: list[bool] = []

            def make() -> dict[str, dict[str, Tensor]]:
                made.append(True)
                return self._trained(module, rows, seed, what)

            networks = self.context.cache.fetch(GAN_CACHE_KIND, key.replace("/", "_"), make, writer=self.engine.is_global_zero)
            self.context.store.save_artifact(key, networks)
            if made:
                return module
            saved = networks
        if saved is not None:
            module.load_networks(saved)
            log.info("%s: %s restored (%s)", self.name, what, key)
            return module.requires_grad_(False).eval().to(self.device)
        self.context.store.save_artifact(key, self._trained(module, rows, seed, what))
        return module

    def _trained(self, module: ManualGAN, rows: Callable[[int], Batchable], seed: int, what: str) -> dict[str, dict[str, Tensor]]:
        log.info("%s: training the %s (%d epochs on %d prior images)", self.name, what, self.settings.gan_epochs, len(self.view.prior_data))  # type: ignore[arg-type]
        self.train_gan(module, rows, seed, what)
        return module.networks()

    def _cache_key(self, stem: str, *keys: object) -> str:
        """The GAN's store and cache key (:func:`gan_key`)."""
        if self._prior_digest is None:
            prior = self.view.prior_data
            assert prior is not None
            self._prior_digest = digest(prior.images, prior.labels)
        code = source_digest(type(self), GANInversionAttack, lit, models)
        named = gan_key(self.context.seed, self.settings, self.view.image_shape, self._prior_digest, keys, self.engine.recipe(), code)
        return f"gan/{stem}_{named}"
