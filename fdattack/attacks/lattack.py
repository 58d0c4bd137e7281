"""The L-Attack (Xiao et al., DSN 2024, §IV): a covert active server trains a generator against one client's model.

Threat model (§IV-A; "semi-honest" there, though the server injects images and answers with chosen logits): FedMD's
server, protocol-compliant in appearance, which knows the label space, the target class c* and the victim, and nothing
of the clients' data or models. Its victim's model is the discriminator of a GAN it reaches only through answers:
:meth:`Adversary.query <fdattack.fd.adversary.Adversary.query>` gives the victim's outputs on chosen images *as it would
send them* (its upload kind and upload defenses: Laplace noise gives noisy logits, LabelAvg the top-K label vector w ⊙
v). Per step, B images x = G(z) and m moved copies x + εu_i each (B(m + 1) query images, one query) give the
forward-difference estimate ĝ of ∂L/∂x (Eq. 6), and the generator steps on ĝ · ∂x/∂θ_g (Eqs. 4-5).

Schedule (Algorithm 1 in FedMD's phase order: upload, aggregate, digest, revisit): in an attack round the victim digests
the server's aggregate of its own upload alone (``return_own_outputs``, Algorithm 1: its own logits under FedMD), so it
learns nothing from the others; after its private training (the round's attack point, the model it uploads with next
round) the server takes ``steps_per_round`` generator steps on its answers. The query images never enter the public
batch, so the other clients distil on the real public rows only (the paper does not say what they receive). In the
rounds between attack rounds (``every`` > 1, Algorithm 1's "else: return f̄") the victim digests the real aggregate, so
it learns from the federation the classes it does not hold and "c*" comes to mean c* rather than "none of my other
classes": on MNIST that is what turns the generator's textures into images an independent classifier calls c*
(docs/attacks.md). With ``inject_samples`` the server also adds generated images to the next round's batch (Algorithm
1's D_pub ∪ x_fake), whose real aggregate in those rounds tells the victim what the federation makes of them.

Decoy (an optional Hitaj-style extension, not in the paper, ``decoy_class``, off by default): after its steps the server adds
``decoy_samples`` generated images to the next round's batch and tells the victim alone, in its own aggregate, that they
are the decoy class (in attack rounds: with ``every`` > 1 the images added before a round without steps get the real
aggregate). The victim, revisiting its real c*, learns to tell the generator's images from them, and the
generator must move toward real ones to keep fooling it (the discriminator's half of a GAN game). The other clients
digest the added images with the real aggregate.

Loss views (§VI-A attacks LabelAvg through its smoothed labels): ``paper`` reads each answer through the server's own
aggregation rule on the victim alone (:attr:`AttackerView.aggregation <fdattack.fd.threat.AttackerView.aggregation>`;
FedMD's mean of one = the answer, LabelAvg's v_smooth of Eqs. 11-12 with N = 1 and v_main the max vote, the images
having no label); ``strong`` takes the answer as sent (w ⊙ v under LabelAvg: c* top-1 or outside the top K gives exactly
zero differences).

Results each attack round: :class:`~fdattack.attacks.results.Inversions` of ``samples`` images of c* (fixed noise,
eval mode) with the attack's own counts as details, and a :class:`~fdattack.attacks.results.GradientProbe` of the
round's last estimate, which the evaluation side alone compares with the true gradient.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from fdattack.attacks.base import ATTACKS, Attack, AttackContext
from fdattack.attacks.common import engine_or_default, is_communication
from fdattack.attacks.results import AttackResult, GradientProbe, Inversions
from fdattack.data.imageset import UNLABELED
from fdattack.errors import ConfigError
from fdattack.fd.adversary import Adversary
from fdattack.fd.record import RoundRecord
from fdattack.fd.threat import AttackerView, Capability, ServerAggregation, ViewPart
from fdattack.functional.losses import target_class_loss
from fdattack.functional.zeroth_order import forward_difference_gradient
from fdattack.knobs import Choice, knob
from fdattack.lit.lattack import LAttackGenerator
from fdattack.randomness import derive_seed
from fdattack.tracking.progress import progress_iter


class LAttackLoss(Choice):
    ce = "ce"
    neg_logit = "neg_logit"
    neg_prob = "neg_prob"


class LAttackView(Choice):
    paper = "paper"
    strong = "strong"


@dataclass
class LAttackSettings:
    """The L-Attack's knobs (Xiao et al., DSN 2024, §IV-C, §VI-A; what they leave open is marked)."""

    target_class: int = knob(0, "c*, the class to reveal: one the victim holds and the public set lacks", ge=0)
    victim: int = knob(
        0,
        "the target client (the server knows whom it attacks, Xiao et al., §IV-A); with data.partition=two_classes client k holds "
        "classes k and k+1, so client c* holds c*",
        ge=0,
    )
    m: int = knob(
        5, "random directions per image of the forward-difference estimate (Eq. 6; the paper: 5 MNIST, 10 FMNIST, 20 CelebA)", ge=1
    )
    epsilon: float = knob(0.1, "ε, the smoothing factor of Eq. 6 (the paper: 0.1)", gt=0)
    batch_size: int = knob(100, "B, generated images per step (the paper: 100); a step queries the victim on B(m + 1) images", ge=2)
    steps_per_round: int = knob(
        20,
        "generator steps per attack round: Algorithm 1 takes 1; more reach the thousands of steps "
        "the attack needs in fewer rounds (a CPU-scale default)",
        ge=1,
    )
    lr: float = knob(1e-3, "η, the generator's Adam learning rate, β = (0.5, 0.999) (the paper: 1e-3)", gt=0)
    z_dim: int = knob(100, "size of the generator's noise z ~ N(0, I) (the paper: 100)", ge=1)
    width: int = knob(128, "channels of the generator's first feature map (a choice: the paper gives no architecture)", ge=2)
    loss: LAttackLoss = knob(
        LAttackLoss.ce,
        "L(x) on the victim's answers (left open in Xiao et al., §IV-C): ce (−log p_c*) | neg_logit (−f_c*, logit answers only) "
        "| neg_prob (−p_c*)",
    )
    view: LAttackView = knob(
        LAttackView.paper,
        "what the loss reads under LabelAvg (Xiao et al., §VI-A): paper (the server's own vote smoothing of the victim's "
        "answer alone, Eqs. 11-12) | strong (the raw top-K label vector w⊙v); under FedMD both read the logits",
    )
    start_round: int = knob(1, "the first attack round", ge=1)
    every: int = knob(
        1,
        "attack every `every` rounds from start_round; in the rounds between, the victim digests the real aggregate "
        "(Algorithm 1's normal rounds: it learns the classes it lacks from the federation)",
        ge=1,
    )
    return_own_outputs: bool = knob(
        True,
        "in attack rounds the victim receives the server's aggregate of its own upload alone in place of the "
        "real one (Algorithm 1; under FedMD its own logits), so it distils toward itself",
    )
    samples: int = knob(64, "generated images returned each attack round for scoring (fixed noise, so rounds compare)", ge=1)
    decoy_class: Optional[int] = knob(
        None,
        "Hitaj-style decoy, not in the paper (off by default): after each attack round's steps the "
        "server adds decoy_samples generated images to the next public batch and, with return_own_outputs, "
        "sends the victim this class as their consensus, so the victim learns the generator's images are "
        "not c* and the generator must move toward real ones (the GAN game); a class other than c*",
        ge=0,
    )
    decoy_samples: int = knob(200, "generated images added to the next public batch each attack round with decoy_class", ge=1)
    inject_samples: int = knob(
        0,
        "Algorithm 1's D_pub ← D_pub ∪ x_fake without a decoy label: generated images the server adds to the next "
        "public batch after each attack round's steps; the victim gets its own answers on them in attack rounds, and "
        "with every > 1 every client digests the real aggregate on them in the rounds between (0: none)",
        ge=0,
    )


#: the consensus logit of the decoy class (0 elsewhere): softmax gives it 0.9996 of the mass among ten classes
DECOY_LOGIT = 10.0


def decoy_target(decoy: int, num_classes: int, kind: str) -> Tensor:
    """(num_classes,) what the victim is told its added images are (the optional Hitaj-style decoy): one-hot probabilities,
    or logits ``DECOY_LOGIT`` at the decoy class and 0 elsewhere."""
    return F.one_hot(torch.tensor(decoy), num_classes).float() * (DECOY_LOGIT if kind == "logits" else 1.0)


def answer_loss(answers: Tensor, target: int, loss: str, view: str, server: ServerAggregation) -> Tensor:
    """Per-image L(x) (left open in Xiao et al., §IV-C) from the victim's answers (P, J): read through the server's rule
    on the victim's answer alone (``paper``; the images are unlabeled, so LabelAvg's v_main is the max vote) or as sent
    (``strong``)."""
    scores = answers
    if view == LAttackView.paper:
        scores = server.rule(answers.unsqueeze(0), torch.full((len(answers),), UNLABELED, dtype=torch.long))
    return target_class_loss(scores, target, loss, server.kind)


@ATTACKS.register("lattack")
class LAttack(Attack):
    """One generator per (victim, c*) trained on zeroth-order estimates; see the module docstring.

    Raises:
        ConfigError: the protocol declares no server rule, or a setting the run cannot satisfy (victim, c*, loss, image size).
    """

    name = "lattack"
    Settings = LAttackSettings
    needs = frozenset({Capability.query_chosen_batch, Capability.aggregation_rule, Capability.private_targets, Capability.fixed_targets})
    reads = frozenset({ViewPart.public, ViewPart.aggregation})  # the public labels and the rule the server aggregates with
    produces = frozenset({Inversions, GradientProbe})

    @classmethod
    def required(cls, settings: LAttackSettings) -> frozenset[Capability]:
        """Queries on chosen images; sending the victim its own aggregate with ``return_own_outputs``; adding images
        with ``decoy_class`` or ``inject_samples``."""
        powers = (cls.needs | {Capability.send_aggregate}) if settings.return_own_outputs else cls.needs
        return powers | {Capability.add_public_samples} if cls.added_per_round(settings) else powers

    @staticmethod
    def added_per_round(settings: LAttackSettings) -> int:
        """Generated images added to the next public batch after each attack round's steps."""
        return settings.decoy_samples if settings.decoy_class is not None else settings.inject_samples

    def __init__(self, view: AttackerView, settings: LAttackSettings, context: AttackContext) -> None:
        super().__init__(view, settings, context)
        self.settings: LAttackSettings = settings
        key = f"attack.{self.name}"
        if view.aggregation is None or view.public is None:
            raise ConfigError(
                f"attacks: {self.name} is FedMD's active server and needs its aggregation rule, which protocol.name={view.protocol} "
                "does not declare; use protocol=fedmd or protocol=labelavg"
            )
        if not 0 <= settings.victim < view.num_clients:
            raise ConfigError(f"{key}.victim={settings.victim} is not a client; allowed: 0 to {view.num_clients - 1}")
        if not 0 <= settings.target_class < view.num_classes:
            raise ConfigError(f"{key}.target_class={settings.target_class} is not a class; allowed: 0 to {view.num_classes - 1}")
        if settings.loss == LAttackLoss.neg_logit and view.aggregation.kind != "logits":
            raise ConfigError(
                f"{key}.loss=neg_logit needs logit answers and protocol.name={view.protocol} sends {view.aggregation.kind}; use ce or "
                f"neg_prob"
            )
        if settings.decoy_class is not None and not (
            settings.decoy_class < view.num_classes and settings.decoy_class != settings.target_class
        ):
            raise ConfigError(
                f"{key}.decoy_class={settings.decoy_class} must be a class other than target_class={settings.target_class}; "
                f"allowed: 0 to {view.num_classes - 1}"
            )
        if settings.decoy_class is not None and settings.inject_samples:
            raise ConfigError(
                f"{key}.inject_samples={settings.inject_samples} with {key}.decoy_class: the decoy adds {key}.decoy_samples "
                "images; set inject_samples=0"
            )
        if settings.decoy_class is not None and not settings.return_own_outputs:
            raise ConfigError(
                f"{key}.decoy_class needs {key}.return_own_outputs=true: the decoy labels reach the victim in its own aggregate"
            )
        _, h, w = view.image_shape
        if h % 4 or w % 4:
            raise ConfigError(
                f"{key}: the generator makes images whose sides are multiples of 4, got {h}x{w}; set data.image_size (e.g. 28)"
            )
        self.server = view.aggregation
        self.public_labels = view.public.labels
        self.engine = engine_or_default(context, settings.batch_size)
        with torch.random.fork_rng(devices=[]):  # the generator's initial weights leave the run's random stream alone
            torch.manual_seed(derive_seed(context.seed, self.name, "init"))
            self.generator = LAttackGenerator(view.image_shape, settings.z_dim, settings.width, settings.lr).to(self.engine.fabric.device)
        self.optimizer_state: list[dict] | None = None  # Adam's state between attack rounds
        self.steps = 0  # generator steps so far
        self.queries = 0  # query images so far, B(m + 1) per step
        self.round_losses: list[float] = []
        self.probe: GradientProbe | None = None

    def attacks_in(self, round: int) -> bool:
        """Whether ``round`` is an attack round: ``start_round``, then every ``every`` rounds."""
        s = self.settings
        return round >= s.start_round and (round - s.start_round) % s.every == 0

    # ------------------------------------------------------------------ rounds
    def on_record(self, record: RoundRecord) -> None:
        """In an attack round: the victim's own aggregate after the upload; the generator steps at the attack point."""
        if not self.attacks_in(record.round) or self.settings.victim not in record.participants:
            return
        if self.settings.return_own_outputs and is_communication(record):
            self.return_own_outputs(record)
        if record.attack_point:
            self.train(record.round)

    def return_own_outputs(self, record: RoundRecord) -> None:
        """Send the victim the server's aggregate of its own upload alone (Algorithm 1), in the shape of the round's aggregate."""
        upload = record.uploads.get(self.settings.victim)
        if upload is None or upload.outputs is None or record.batch is None:  # its upload was dropped
            return
        own = self.server.rule(upload.outputs.unsqueeze(0), record.batch.labels_in(self.public_labels))
        if self.settings.decoy_class is not None and record.batch.num_added:  # the images it added last round: the decoy class
            own[len(record.batch.rows) :] = decoy_target(self.settings.decoy_class, own.shape[1], self.server.kind)
        self.adversary.send_aggregate(self.settings.victim, own)

    @property
    def adversary(self) -> Adversary:
        """The powers the run granted (:meth:`required`)."""
        assert self.context.adversary is not None, "the run grants the L-Attack its adversary"
        return self.context.adversary

    def victim_loss(self, points: Tensor) -> Tensor:
        """L at ``points`` (P, C, H, W) from one query of the victim (the black-box loss of Eq. 6), on their device."""
        s = self.settings
        reply = self.adversary.query(s.victim, points)
        return answer_loss(reply.outputs, s.target_class, str(s.loss), str(s.view), self.server).to(points.device)

    def train(self, round: int) -> None:
        """``steps_per_round`` generator steps; each draws z and the directions from a stream seeded by (run seed, round, step)."""
        s, module = self.settings, self.generator
        handle = self.engine.setup(f"{self.name}_generator", module)  # set up for the round's steps only, as the attacks' networks are
        if self.optimizer_state is not None:
            for optimizer, state in zip(handle.optimizers, self.optimizer_state, strict=True):
                optimizer.load_state_dict(state)
        handle.wrapped.train()
        values: list[Tensor] = []  # the losses a step's query answered

        def loss(points: Tensor) -> Tensor:
            values.append(self.victim_loss(points))
            return values[-1]

        for step in progress_iter(range(s.steps_per_round), f"{self.name}: generator steps of round {round}", self.context.progress):
            stream = torch.Generator().manual_seed(derive_seed(self.context.seed, self.name, round, step))
            x = handle.wrapped(module.noise(s.batch_size, stream))
            values.clear()
            estimate, used = forward_difference_gradient(loss, x.detach(), s.m, s.epsilon, stream)
            module.apply_estimate(x, estimate)
            self.steps += 1
            self.queries += used
            self.round_losses.append(float(values[0][: s.batch_size].mean()))  # L at the B generated images
            self.probe = GradientProbe(x.detach().cpu(), estimate.detach().cpu(), s.victim, s.target_class, str(s.loss))
        self.optimizer_state = [optimizer.state_dict() for optimizer in handle.optimizers]
        self.engine.release(handle)
        if added := self.added_per_round(s):
            stream = torch.Generator().manual_seed(derive_seed(self.context.seed, self.name, round, "decoy"))
            self.adversary.add_public_samples(module.sample(module.noise(added, stream)).cpu())

    def on_round_end(self, round: int) -> list[AttackResult]:
        """The round's generated images of c* and its last gradient estimate (nothing in a round without steps)."""
        if not self.round_losses:
            return []
        s = self.settings
        z = self.generator.noise(s.samples, torch.Generator().manual_seed(derive_seed(self.context.seed, self.name, "samples")))
        images = self.generator.sample(z).cpu()
        details = {
            "loss": self.round_losses[-1],
            "loss_round": sum(self.round_losses) / len(self.round_losses),
            "steps": float(self.steps),
            "queries_total": float(self.queries),
        }
        self.round_losses = []
        probe, self.probe = self.probe, None
        assert probe is not None
        return [Inversions(images.unsqueeze(1), torch.tensor([s.target_class]), details=details), probe]

    # ------------------------------------------------------------------ resume
    def state_dict(self) -> dict:
        return {"generator": self.generator.state_dict(), "optimizer": self.optimizer_state, "steps": self.steps, "queries": self.queries}

    def load_state_dict(self, state: dict) -> None:
        if "generator" in state:
            self.generator.load_state_dict(state["generator"])
            self.optimizer_state = state["optimizer"]
            self.steps, self.queries = int(state["steps"]), int(state["queries"])
