"""VMI (Wang et al., NeurIPS 2021) against FedAvg, with FedInverse's HSIC term (Wu et al., ICLR 2024, §3.1, Eq. 10, and §3.2).

The paper's prior is a StyleGAN2 of 10 style layers; here it is GMI's WGAN-GP generator trained on the attacker's prior
data (one latent, so L = 1 flow), the same cached network GMI uses: the miner, the KL to the prior's N(0, I), the CE
on the target and the HSIC term are the paper's, only the prior is smaller (no StyleGAN weights can be downloaded here).

Every round, against the global model after the aggregation (as the FedInverse code), one
:class:`~fdattack.lit.vmi.VMIMinerLitModule` per target label trains through the attacks' engine: each "epoch" is
``steps_per_epoch`` SGD steps on fresh batches of ``batch_size`` samples, after which the miner scores fresh samples
with the *target* model and keeps the best flows (leak-free; the code selects by the evaluation classifier); a label's
miner stops after ``patience`` epochs without improvement, the search after ``iterations`` epochs. The result holds
``samples`` draws of each label's best miner.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Optional

import torch
from torch import Tensor, nn

from fdattack.attacks.base import ATTACKS, AttackContext
from fdattack.attacks.gan_inversion import GANInversionAttack, GANInversionSettings
from fdattack.engine import ModelHandle, TensorRows
from fdattack.errors import ConfigError
from fdattack.fd.threat import AttackerView
from fdattack.knobs import knob
from fdattack.lit.gan import WGANGP
from fdattack.lit.vmi import VMIMinerLitModule
from fdattack.models.gan import to_signed
from fdattack.randomness import derive_seed, seeded


@dataclass
class VMISettings(GANInversionSettings):
    """VMI's knobs (defaults from the FedInverse code); the GAN keys train the GMI prior it mines."""

    iterations: int = knob(100, "most miner epochs per target label and round (the code's command-line maximum: 100)", ge=1)
    lr: float = knob(1e-4, "SGD learning rate of the flows (the code: 1e-4, momentum 0.9)", gt=0)
    momentum: float = knob(0.9, "SGD momentum of the flows", ge=0, lt=1)
    lambda_kl: float = knob(1e-3, "γ = λ_kl, weight of the KL of each flow to the prior's N(0, I) (Eq. 10; the code: 1e-3)", ge=0)
    gan_epochs: int = knob(300, "WGAN-GP prior training epochs (the GMI prior, shared with attack gmi when their GAN keys agree)", ge=0)
    batch_size: int = knob(32, "flow samples per step, and per HSIC split (the code: 32)", ge=2)
    steps_per_epoch: int = knob(10, "SGD steps per miner epoch (the code: 10, i.e. 320 samples)", ge=1)
    eval_samples: int = knob(100, "fresh samples the target model scores after every epoch to select the best flows (the code: 100)", ge=1)
    patience: int = knob(15, "epochs without a better selection score before a label's miner stops (the code's runs: 15)", ge=1)
    flow_steps: int = knob(10, "Glow steps per level K (the code: 10)", ge=1)
    flow_levels: int = knob(3, "Glow levels L (the code: 3)", ge=1)
    flow_hidden: int = knob(100, "width of each additive coupling's network", ge=1)
    samples: int = knob(10, "draws per target label from its best miner in the result", ge=1)


class SignedGenerator(nn.Module):
    """A [0, 1] generator seen in [−1, 1] (2G(z) − 1), the range the miner and the target model use."""

    def __init__(self, generator: nn.Module) -> None:
        super().__init__()
        self.generator = generator

    def forward(self, z: Tensor) -> Tensor:
        return to_signed(self.generator(z))


@ATTACKS.register("vmi")
class VMIAttack(GANInversionAttack):
    """VMI with the HSIC term on the GMI prior: a flow miner per target label, every round (module docstring).

    ``Inversions.images`` holds ``samples`` draws per label, (samples, T, C, H, W); ``details`` adds the mean epochs
    the miners ran and their mean best selection score (the target's accuracy on their samples).
    """

    name = "vmi"
    Settings = VMISettings

    def __init__(self, view: AttackerView, settings: VMISettings, context: AttackContext) -> None:
        super().__init__(view, settings, context)
        self.settings: VMISettings = settings

    def check_hsic_batch(self, needed: int) -> None:
        """The HSIC term splits each label's batch of flow samples, not the label batches."""
        if self.settings.batch_size < needed:
            raise ConfigError(
                f"attack.vmi.hsic_lambda > 0 splits each batch of flow samples in halves of at least {needed // 2} "
                f"({self.settings.hsic_estimator}); raise attack.vmi.batch_size to {needed} or more"
            )

    def gan(self, round: int, target: nn.Module, state: dict[str, Tensor]) -> WGANGP:
        """The WGAN-GP prior (:meth:`~fdattack.attacks.gan_inversion.GANInversionAttack.wgan_prior`), the same every round."""
        return self.wgan_prior()

    def miner(self, gan: WGANGP, target: nn.Module, label: int, round: int) -> VMIMinerLitModule:
        s = self.settings
        return VMIMinerLitModule(
            SignedGenerator(gan.generator),
            target,
            label,
            s.z_dim,
            1,
            steps_per_level=s.flow_steps,
            levels=s.flow_levels,
            hidden=s.flow_hidden,
            lambda_kl=s.lambda_kl,
            lambda_h=s.hsic_lambda,
            hsic_sign=s.hsic_sign,
            hsic_options=s.hsic_options(),
            lr=s.lr,
            momentum=s.momentum,  # type: ignore[arg-type]
            batch_size=s.batch_size,
            steps_per_epoch=s.steps_per_epoch,
            eval_samples=s.eval_samples,
            patience=s.patience,
            seed=derive_seed(self.context.seed, self.name, "miner", round, label),
        ).to(self.device)

    def search(
        self, gan: WGANGP, target: nn.Module, labels: Tensor, steps: Iterable[int], round: int, chunk: slice
    ) -> tuple[Tensor, dict[str, float]]:  # type: ignore[override]
        """Every label's miner takes one epoch per element of ``steps`` until its patience runs out."""
        s = self.settings
        miners = [self.miner(gan, target, int(label), round) for label in labels.tolist()]
        handles: list[Optional[ModelHandle]] = [self.engine.setup(f"{self.name}_miner", miner) for miner in miners]
        placeholder = TensorRows(step=torch.zeros(s.steps_per_epoch))  # the miner draws its own samples
        epochs = [0] * len(miners)
        seed = derive_seed(self.context.seed, self.name, "search", round, chunk.start)
        with seeded(seed, self.device):
            for epoch in steps:
                for i, handle in enumerate(handles):
                    if handle is None:
                        continue
                    self.engine.fit_module(handle, placeholder, 1, derive_seed(seed, i, epoch), batch_size=1)
                    epochs[i] += 1
                    if miners[i].end_epoch():
                        self.engine.release(handle)
                        handles[i] = None
                if all(handle is None for handle in handles):
                    break
            for handle in handles:
                if handle is not None:
                    self.engine.release(handle)
            with torch.no_grad():
                z = torch.stack([miner.restore_best().sample_latents(s.samples)[0][:, 0].float() for miner in miners], dim=1)
                last = [miner.objective() for miner in miners]
        details = {
            "ce_loss": float(torch.stack([t["ce"] for t in last]).mean()),
            "kl": float(torch.stack([t["kl"] for t in last]).mean()),
            "hsic_loss": float(torch.stack([t["hsic"] for t in last]).mean()),
            "miner_epochs": sum(epochs) / len(epochs),
            "selection_score": sum(m.best_score for m in miners) / len(miners),
        }
        return z.detach(), details
