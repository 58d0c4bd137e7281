"""VMI's miner (Wu et al., ICLR 2024, §3.1, Eq. 10): per-layer normalising flows q_l over a frozen prior generator's latents,
trained so that a frozen target model puts the generated images in one target class.

One miner attacks one target label, as the code attacks identities one at a time: its batches hold 32 samples of
that label, and the attack trains one miner per label (a label-conditional family would couple the labels' flows
for no gain in the code's setting).

The loss (minimised) is the code's form of Eq. 10 plus FedInverse's HSIC term (its Eq. 11):

    λ_attack · CE(T(x), y) + γ · (1/L) Σ_l E_{z~q_l}[log q_l(z) − log N(z; 0, I)] + sign · λ_H · HSIC(x1, x2)

with x = G(z_1..z_L) clamped to [−1, 1] (the target sees the images in fdattack's [−1, 1] convention; the code feeds [0, 1]), each
layer's KL a Monte-Carlo estimate on a fresh batch of flow samples, and HSIC on the images mapped to [0, 1], the
raw output of the GMI/KED-MI generators (as the code), through :func:`fdattack.functional.hsic.hsic_loss_term`.

Model selection (not in the paper): after every epoch :meth:`VMIMinerLitModule.end_epoch` scores fresh samples and keeps the
best flows. The default score is the *target* model's accuracy on them, which the attacker has; the code's choice,
an evaluation classifier's accuracy, is the evaluator's and leaks the metric into the attack, so it is only
available by passing a ``scorer`` explicitly.
"""

from __future__ import annotations

from typing import Callable, Literal

import lightning as L
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fdattack.functional.hsic import HSICOptions, hsic_loss_term
from fdattack.models.flows import Glow, standard_normal_log_prob

Scorer = Callable[[Tensor], float]
"""``images (N, C, H, W) in [−1, 1] -> score`` (higher is better) used to select the miner's epoch."""


def _dtype_of(module: nn.Module) -> torch.dtype:
    """The dtype of a module's first floating-point parameter or buffer (the default dtype if it has none)."""
    for tensor in (*module.parameters(), *module.buffers()):
        if tensor.is_floating_point():
            return tensor.dtype
    return torch.get_default_dtype()


class VMIMinerLitModule(L.LightningModule):
    """The "layeredflow" miner of VMI for one target label (module docstring).

    Trains under a plain ``lightning.Trainer`` (``trainer.fit(miner)``: it serves its own ``steps_per_epoch``
    empty batches, draws its samples itself and runs :meth:`end_epoch` after every epoch, stopping the Trainer when
    ``patience`` runs out) or any loop that calls :meth:`training_step` and :meth:`end_epoch`. Afterwards,
    :meth:`restore_best` loads the selected epoch's flows and :meth:`sample` draws inversions.

    The generator and the target are frozen: their parameters stop requiring gradients and they stay in eval mode
    (BatchNorm running statistics) whatever mode the miner is put in. Both are submodules, so they move with the
    miner and are part of its state dict.

    Args:
        generator: the prior G. With ``num_layers = 1`` it maps (N, latent_dim) latents to images in [−1, 1] (a
            DCGAN-style generator has one latent); with L > 1, (N, L, latent_dim) style latents (StyleGAN's mapping
            of each layer's z_l, Eq. 10).
        target: the target model, (N, C, H, W) images in [−1, 1] -> (N, classes) logits.
        label: y, the target label.
        latent_dim: d (100 for the GMI/KED-MI generators, 512 for StyleGAN).
        num_layers: L, one flow per style layer (10 for StyleGAN at 64×64).
        steps_per_level, levels, hidden, actnorm: each flow's K (10), L (3), coupling width (100) and ActNorm.
        lambda_attack: λ_attack (1). lambda_kl: γ = λ_kl (1e-3).
        lambda_h, hsic_sign, hsic_options: the HSIC term (λ_H = 0: the plain VMI baseline).
        lr, momentum, weight_decay: SGD (1e-4, 0.9, 0).
        batch_size: samples per step (32). steps_per_epoch: steps per epoch (10, i.e. 320 samples).
        eval_samples: fresh samples scored after each epoch (100). patience: epochs without a better score before
            the Trainer stops (the code's 15; None never stops).
        shared_noise: every layer's flow decodes the same ε in the CE batch, as the code's miner does (the
            marginals q_l are the same either way; False draws independent ε_l as Eq. 10 reads).
        scorer: the selection score; None is the target's accuracy on the label (leak-free).
        seed: seeds the flows' weights, shuffles and ActNorm initialisation (on 100 N(0, I) latents, as the code).
        dtype: the flows' dtype (float64 as the code); latents are cast to the generator's dtype.
    """

    def __init__(
        self,
        generator: nn.Module,
        target: nn.Module,
        label: int,
        latent_dim: int,
        num_layers: int = 1,
        *,
        steps_per_level: int = 10,
        levels: int = 3,
        hidden: int = 100,
        actnorm: bool = True,
        lambda_attack: float = 1.0,
        lambda_kl: float = 1e-3,
        lambda_h: float = 0.0,
        hsic_sign: Literal[1, -1] = 1,
        hsic_options: HSICOptions = HSICOptions(),  # noqa: B008 - a frozen dataclass, shared safely
        lr: float = 1e-4,
        momentum: float = 0.9,
        weight_decay: float = 0.0,
        batch_size: int = 32,
        steps_per_epoch: int = 10,
        eval_samples: int = 100,
        patience: int | None = 15,
        shared_noise: bool = True,
        scorer: Scorer | None = None,
        seed: int = 0,
        dtype: torch.dtype = torch.float64,
    ) -> None:
        super().__init__()
        if num_layers < 1 or batch_size < 1 or steps_per_epoch < 1 or eval_samples < 1:
            raise ValueError("num_layers, batch_size, steps_per_epoch and eval_samples must be ≥ 1")
        if hsic_sign not in (1, -1):
            raise ValueError(f"hsic_sign must be +1 or -1, got {hsic_sign!r}")
        self.save_hyperparameters(ignore=["generator", "target", "scorer"])
        self.generator = generator.requires_grad_(False).eval()
        self.target = target.requires_grad_(False).eval()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.flows = nn.ModuleList(
                Glow(latent_dim, steps_per_level, levels, hidden, actnorm, seed + layer, dtype) for layer in range(num_layers)
            )
            for flow in self.flows:
                flow.initialize(torch.randn(100, latent_dim, dtype=dtype))
        self.scorer = scorer
        self.history: list[float] = []
        self.best_score = float("-inf")
        self.best_epoch = 0
        self._best_state: dict[str, Tensor] | None = None
        self._stale_epochs = 0

    # ------------------------------------------------------------------ modes
    def train(self, mode: bool = True) -> "VMIMinerLitModule":
        """Set the flows' mode; the frozen generator and target stay in eval mode."""
        super().train(mode)
        self.generator.eval()
        self.target.eval()
        return self

    # --------------------------------------------------------------- sampling
    def _noise(self, n: int) -> Tensor:
        return torch.randn(n, self.hparams.latent_dim, dtype=self.hparams.dtype, device=self.device)

    def sample_latents(self, n: int) -> tuple[Tensor, Tensor]:
        """z ~ q_1..q_L, shape (n, L, d) in the flows' dtype, and log q_l(z_l), shape (n, L) (reparameterised)."""
        shared = self._noise(n) if self.hparams.shared_noise else None
        draws = [flow.sample_from(self._noise(n) if shared is None else shared) for flow in self.flows]
        return torch.stack([z for z, _ in draws], dim=1), torch.stack([lq for _, lq in draws], dim=1)

    def render(self, z: Tensor) -> Tensor:
        """G(z_1..z_L) for latents (N, L, d), clamped to [−1, 1] as the code does."""
        z = z.to(_dtype_of(self.generator))
        return self.generator(z[:, 0] if self.hparams.num_layers == 1 else z).clamp(-1, 1)

    @torch.no_grad()
    def sample(self, n: int) -> Tensor:
        """n inversions of the label, (n, C, H, W) in [−1, 1], drawn in batches of ``batch_size``."""
        sizes = [min(self.hparams.batch_size, n - start) for start in range(0, n, self.hparams.batch_size)]
        return torch.cat([self.render(self.sample_latents(size)[0]) for size in sizes])

    # ------------------------------------------------------------------- loss
    def kl_divergence(self, n: int) -> Tensor:
        """(1/L) Σ_l E_{z~q_l}[log q_l(z) − log N(z; 0, I)], each layer on n fresh samples (Eq. 10's KL term)."""
        terms = []
        for flow in self.flows:
            z, log_q = flow.sample(n)
            terms.append((log_q - standard_normal_log_prob(z)).mean())
        return torch.stack(terms).mean()

    def objective(self) -> dict[str, Tensor]:
        """One fresh batch: ``loss``, its parts ``ce``, ``kl`` and ``hsic`` (weighted), and the target's ``acc``."""
        hp = self.hparams
        x = self.render(self.sample_latents(hp.batch_size)[0])
        logits = self.target(x)
        y = torch.full((x.shape[0],), hp.label, dtype=torch.long, device=logits.device)
        ce = F.cross_entropy(logits, y)
        kl = self.kl_divergence(hp.batch_size)
        hsic = hsic_loss_term((x + 1) / 2, lambda_h=hp.lambda_h, sign=hp.hsic_sign, options=hp.hsic_options)
        loss = hp.lambda_attack * ce + hp.lambda_kl * kl + hsic
        acc = (logits.argmax(1) == y).float().mean()
        return {"loss": loss, "ce": ce.detach(), "kl": kl.detach(), "hsic": hsic.detach(), "acc": acc}

    def training_step(self, batch: object, batch_idx: int) -> Tensor:
        """One step on freshly drawn samples (``batch`` is ignored: the miner needs no data)."""
        terms = self.objective()
        if self._trainer is not None:  # fdattack's Fabric engine runs the steps without a Trainer
            self.log_dict({f"vmi/{k}": v for k, v in terms.items()}, prog_bar=False)
        return terms["loss"]

    def train_dataloader(self) -> list[int]:
        """``steps_per_epoch`` placeholder batches: one Trainer epoch is the code's 10 steps."""
        return list(range(self.hparams.steps_per_epoch))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        hp = self.hparams
        return torch.optim.SGD(self.flows.parameters(), lr=hp.lr, momentum=hp.momentum, weight_decay=hp.weight_decay)

    # -------------------------------------------------------------- selection
    @torch.no_grad()
    def target_accuracy(self, images: Tensor) -> float:
        """The fraction of images (N, C, H, W) in [−1, 1] that the target model puts in the label."""
        return (self.target(images).argmax(1) == self.hparams.label).float().mean().item()

    @torch.no_grad()
    def end_epoch(self) -> bool:
        """Score ``eval_samples`` fresh samples, keep the flows if the score is the best so far (strictly, as the
        code), and return whether ``patience`` epochs have passed without improvement."""
        images = self.sample(self.hparams.eval_samples)
        score = float(self.scorer(images)) if self.scorer is not None else self.target_accuracy(images)
        self.history.append(score)
        if score > self.best_score:
            self.best_score, self.best_epoch, self._stale_epochs = score, len(self.history), 0
            self._best_state = {k: v.detach().clone() for k, v in self.flows.state_dict().items()}
        else:
            self._stale_epochs += 1
        patience = self.hparams.patience
        return patience is not None and self._stale_epochs >= patience

    def on_train_epoch_end(self) -> None:
        if self.end_epoch():
            self.trainer.should_stop = True
        self.log("vmi/selection_score", self.history[-1])

    def restore_best(self) -> "VMIMinerLitModule":
        """Load the flows of the best-scored epoch (a no-op before the first :meth:`end_epoch`); returns ``self``."""
        if self._best_state is not None:
            self.flows.load_state_dict(self._best_state)
        return self
