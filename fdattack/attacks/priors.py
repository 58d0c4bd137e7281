"""PLI's prior images x̄_j (Takahashi et al., CVPR 2023, §3.3): the naive mean prior (Eq. 8) and the learned prior (Eq. 9).

The learned prior translates every public image of the insensitive look (D_a) into the sensitive look
with a translation model A_phi trained on public data only, then averages per label (Eq. 9 as printed averages over all of D_a). A_phi is
a paired restorer when the insensitive look is a known degradation of the sensitive one (blur: pairs
(degrade(x), x) for up to ``pairs_per_label`` images x of each label in D_0, as the authors' DeblurGAN-v2)
and a CycleGAN otherwise (unpaired looks: up to ``pairs_per_label`` (D_a, D_0) pairs of each non-target
public identity, as the authors' code).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

from fdattack import lit, models
from fdattack.code_version import source_digest
from fdattack.data.imageset import AUXILIARY, SENSITIVE, ImageSet
from fdattack.engine import LocalTrainer, TensorRows
from fdattack.errors import ConfigError
from fdattack.fd.threat import AttackerView, Degradation
from fdattack.knobs import Choice, knob
from fdattack.lit.translation import CycleGANLitModule, RestorerLitModule, TranslationLitModule
from fdattack.randomness import derive_seed
from fdattack.tracking.artifact_cache import AttackCache, digest
from fdattack.tracking.progress import progress_iter

#: the learned prior's entries in the attack's cache: ``pli_prior_<digest>.<mode>.pt``
PRIOR_CACHE_KIND = "pli_prior"
#: how many public images the degradation is applied to for the cache key (its effect names it)
DEGRADATION_PROBE = 16


class PriorKind(Choice):
    auto = "auto"
    naive = "naive"
    learned = "learned"


class TranslatorKind(Choice):
    auto = "auto"
    restorer = "restorer"
    cyclegan = "cyclegan"


@dataclass
class PriorSettings:
    """Which prior (Takahashi et al., CVPR 2023, §3.3) and, for the learned one, how its translation model A_phi is trained."""

    kind: PriorKind = knob(
        PriorKind.auto,
        "naive (Eq. 8, mean sensitive public image) | learned (Eq. 9, translated insensitive public images per label; needs every public "
        "label) | auto (learned where the protocol gives the attacker every public label, naive for DS-FL / data.label_space=targets)",
    )
    translator: TranslatorKind = knob(
        TranslatorKind.auto,
        "learned prior's translation model: restorer (paired, for a known degradation such as blur) | cyclegan (unpaired looks) | auto "
        "(restorer when the degradation is known, cyclegan otherwise)",
    )
    epochs: int = knob(10, "translation-model training epochs over its public pairs (paper: 100, batch 1)", ge=0)
    lr: Optional[float] = knob(
        1e-3,
        "translation-model Adam learning rate, set for batch 8 and short CPU runs; null = the paper's 1e-4 (restorer) / 2e-4 (cyclegan), "
        "Takahashi et al., App. C (the authors' code swaps them)",
        gt=0,
    )
    batch_size: int = knob(8, "translation-model batch size (1 in the paper)", ge=1)
    width: int = knob(32, "ngf = ndf of the translation networks (64 in the paper's code)", ge=1)
    pairs_per_label: int = knob(
        100,
        "training pairs drawn per public label: restorer (degrade(x), x) for x in D_0; cyclegan (insensitive, sensitive) of each "
        "non-target identity",
        ge=1,
    )

    def resolved(self, view: AttackerView) -> "PriorSettings":
        """``auto`` made concrete from what the attacker knows: learned where it knows every public label
        (Eq. 9 averages per label), else naive; a restorer where the degradation is known, else a CycleGAN.

        Raises:
            ConfigError: a learned prior without public labels, or a restorer without a known degradation.
        """
        labeled = view.public_labels_known and view.public is not None and bool((view.public.labels >= 0).all())
        kind = self.kind if self.kind != PriorKind.auto else (PriorKind.learned if labeled else PriorKind.naive)
        if kind == PriorKind.naive:
            return dataclasses.replace(self, kind=PriorKind.naive)
        if not labeled:
            raise ConfigError(
                f"attack.pli.prior.kind=learned needs every public label, which this {view.protocol} run does not give the "
                "attacker (unlabeled public set, or data.label_space=targets); use naive"
            )
        translator = self.translator
        if translator == TranslatorKind.auto:
            translator = TranslatorKind.restorer if view.degradation is not None else TranslatorKind.cyclegan
        if translator == TranslatorKind.restorer and view.degradation is None:
            raise ConfigError("attack.pli.prior.translator=restorer needs a known degradation (data.aux_domain=blur); use cyclegan")
        if translator == TranslatorKind.cyclegan and not _has_both_looks(view.public, list(view.target_labels)):
            raise ConfigError(
                "attack.pli.prior.kind=learned: no non-target public identity has both looks (data.aux_domain=none gives none), so "
                "its CycleGAN has nothing to learn from; use attack.pli.prior.kind=naive or a data.aux_domain that makes a look"
            )
        return dataclasses.replace(self, kind=PriorKind.learned, translator=translator)


def _has_both_looks(public: ImageSet, target_labels: list[int]) -> bool:
    """Whether some non-target public identity has images in both looks (the CycleGAN's unpaired training data)."""
    sensitive, auxiliary = public.domain == SENSITIVE, public.domain == AUXILIARY
    return any(
        bool((sensitive & (public.labels == label)).any() and (auxiliary & (public.labels == label)).any())
        for label in set(public.labels[sensitive].tolist()) - set(target_labels)
    )


def build_prior(view: AttackerView, settings: PriorSettings, seed: int, engine: LocalTrainer, progress: str = "never") -> Tensor:
    """The (J, C, H, W) prior images from the attacker's view alone (``settings`` already resolved); a translation
    model trains on ``engine``."""
    assert view.public is not None
    if settings.kind == PriorKind.naive:
        return naive_prior(view.public, view.num_classes)
    return train_learned_prior(view.public, list(view.target_labels), view.num_classes, settings, view.degradation, seed, engine, progress)


def cached_prior(
    view: AttackerView, settings: PriorSettings, seed: int, engine: LocalTrainer, cache: AttackCache | None, progress: str = "never"
) -> Tensor:
    """:func:`build_prior`, the learned one kept in ``cache`` under a digest of all it depends on (its settings, seed,
    the public set as the attacker knows it, the targets and the degradation's effect on the public images) and read
    back by a later run with the same inputs, on the same engine (:meth:`~fdattack.engine.LocalTrainer.recipe`) and
    code (:func:`~fdattack.code_version.source_digest`); None: trained here."""
    if cache is None or settings.kind == PriorKind.naive:
        return build_prior(view, settings, seed, engine, progress)
    assert view.public is not None
    public = view.public
    key = prior_key(view, settings, seed, engine.recipe(), source_digest(build_prior, lit, models))
    payload = cache.fetch(
        PRIOR_CACHE_KIND,
        key,
        lambda: {"prior": build_prior(view, settings, seed, engine, progress)},
        check=lambda p: _check_prior(p["prior"], view.num_classes, public.images.shape[1:]),
        writer=engine.is_global_zero,
    )
    return payload["prior"]


def prior_key(view: AttackerView, settings: PriorSettings, seed: int, recipe: dict, code: str) -> str:
    """The learned prior's cache key: a digest of everything its training reads (its settings whole, the seed, the
    public set as the attacker knows it, the targets, the degradation's effect on the public images, the engine's
    :meth:`~fdattack.engine.LocalTrainer.recipe` and the code's :func:`~fdattack.code_version.source_digest`)."""
    public = view.public
    assert public is not None
    degraded = None if view.degradation is None else view.degradation(public.images[:DEGRADATION_PROBE])
    targets = list(view.target_labels)
    return digest(settings, seed, public.images, public.labels, public.domain, targets, view.num_classes, degraded, recipe, code)


def _check_prior(prior: Tensor, num_classes: int, image_shape: torch.Size) -> None:
    if not isinstance(prior, Tensor) or tuple(prior.shape) != (num_classes, *image_shape) or not bool(torch.isfinite(prior).all()):
        raise ValueError(f"not a finite ({num_classes}, {', '.join(map(str, image_shape))}) prior")


def naive_prior(public: ImageSet, num_classes: int) -> Tensor:
    """Eq. 8: the mean sensitive public image, the same for every label. Returns (J, C, H, W)."""
    mean = public.images[public.domain == SENSITIVE].mean(dim=0)
    return mean.expand(num_classes, *mean.shape).clone()


def translation_pairs(
    public: ImageSet, target_labels: list[int], kind: str, degrade: Optional[Degradation], pairs_per_label: int, generator: torch.Generator
) -> tuple[Tensor, Tensor]:
    """Training pairs (insensitive ``a``, sensitive ``b``) drawn from public data only."""
    sensitive = public.domain == SENSITIVE
    if kind == "restorer":
        if degrade is None:
            raise ValueError("a restorer needs the degradation that makes the insensitive look")
        rows = [torch.nonzero(sensitive & (public.labels == label)).flatten() for label in public.labels[sensitive].unique()]
        clean = public.images[torch.cat([r[torch.randperm(len(r), generator=generator)[:pairs_per_label]] for r in rows])]
        return degrade(clean), clean
    auxiliary = public.domain == AUXILIARY
    a_rows, b_rows = [], []
    for label in sorted(set(public.labels[sensitive].tolist()) - set(target_labels)):
        a_pool = torch.nonzero(auxiliary & (public.labels == label)).flatten()
        b_pool = torch.nonzero(sensitive & (public.labels == label)).flatten()
        if len(a_pool) == 0 or len(b_pool) == 0:
            continue
        n = min(pairs_per_label, len(a_pool) * len(b_pool))
        a_rows.append(a_pool[torch.randint(len(a_pool), (n,), generator=generator)])
        b_rows.append(b_pool[torch.randint(len(b_pool), (n,), generator=generator)])
    if not a_rows:
        raise ValueError("no public identity has both looks; a CycleGAN prior cannot be trained")
    return public.images[torch.cat(a_rows)], public.images[torch.cat(b_rows)]


def build_translator(settings: PriorSettings, channels: int, image_size: int, seed: int) -> TranslationLitModule:
    """A fresh A_phi of the requested kind."""
    lr = {} if settings.lr is None else {"lr": settings.lr}
    with torch.random.fork_rng(devices=[]):  # seeded initialisation that leaves the run's random stream alone
        torch.manual_seed(seed)
        if settings.translator == TranslatorKind.cyclegan:
            return CycleGANLitModule(channels, image_size, settings.width, seed=seed, **lr)
        return RestorerLitModule(channels, image_size, settings.width, **lr)


def fit_translator(
    module: TranslationLitModule,
    a: Tensor,
    b: Tensor,
    epochs: int,
    batch_size: int,
    seed: int,
    engine: LocalTrainer,
    progress: str = "never",
) -> TranslationLitModule:
    """Train A_phi on the (a, b) pairs through ``engine`` (the module's own manual-optimisation training_step)."""
    handle = engine.setup("translator", module)
    pairs = TensorRows(a=a, b=b)
    for epoch in progress_iter(range(epochs), "translation model for the prior (Eq. 9)", progress):
        engine.fit_module(handle, pairs, 1, derive_seed(seed, "translator", epoch), batch_size=batch_size)
    engine.release(handle)
    return module


def learned_prior(translator: TranslationLitModule, public: ImageSet, num_classes: int) -> Tensor:
    """Eq. 9 per label (as printed it averages over all of D_a): x̄_j = mean of A_phi(x) over the D_a images of label j; zero where
    label j has none. Returns (J, C, H, W)."""
    auxiliary = public.domain == AUXILIARY
    translated = translator.translate(public.images[auxiliary])
    labels = public.labels[auxiliary]
    prior = torch.zeros(num_classes, *public.images.shape[1:])
    for j in range(num_classes):
        rows = labels == j
        if rows.any():
            prior[j] = translated[rows].mean(dim=0)
    return prior


def train_learned_prior(
    public: ImageSet,
    target_labels: list[int],
    num_classes: int,
    settings: PriorSettings,
    degrade: Optional[Degradation],
    seed: int,
    engine: LocalTrainer,
    progress: str = "never",
) -> Tensor:
    """Pairs, A_phi and Eq. 9 in one call; returns the (J, C, H, W) prior."""
    generator = torch.Generator().manual_seed(seed)
    a, b = translation_pairs(public, target_labels, str(settings.translator), degrade, settings.pairs_per_label, generator)
    translator = build_translator(settings, public.images.shape[1], public.images.shape[-1], seed)
    fit_translator(translator, a, b, settings.epochs, settings.batch_size, seed, engine, progress)
    return learned_prior(translator, public, num_classes)
