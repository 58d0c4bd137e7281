"""DP-SGD (Abadi et al. 2016) through opacus: PDA-FD's training defense (Shi et al., PoPETs 2025, §5.4).

In every phase listed in ``phases`` (by default the local updates on the client's private set; distillation
on public data stays non-private, a choice: the paper does not say) each client trains with DP-SGD: every step draws a Poisson batch (each
of the n rows with probability q = B/n), clips each sample's gradient to L2 norm C, adds N(0, σ²C²) to their
sum and divides by the expected batch size B, then takes the client's optimizer step (Adam or SGD). Opacus'
RDP accountant, one per client, composes the steps; after every round the defense reports the ε each client
has spent so far at ``delta`` (``defense/dpsgd/epsilon``, the largest over clients, and ``epsilon_mean``).

Two implementations of one training, chosen by the engine per phase. Each private job carries a description of
its steps (:class:`~fdattack.engine.PrivateSteps`) and the Poisson sampler: where the vectorised path applies
(``trainer.vectorise=auto``, several clients of one architecture; on a CPU, no convolution of another layer's output,
see :func:`fdattack.engine.vectorised.copies.unsupported`), all clients' steps are one vmapped per-sample gradient
computation (:mod:`fdattack.engine.vectorised.private`); elsewhere each client trains in turn through opacus
(:func:`private_steps`, the job's ``session``). Both draw the same batches and the same noise from
the job's seeds, so they agree to float rounding, and both tell the client's accountant the same steps. Opacus' hooks
are on the client's network only during its private phases, so ``module.net`` stays the plain network everywhere
else: same ``state_dict`` keys, same checkpoints, same queries.
"""

from __future__ import annotations

import functools
import importlib.util
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Iterator

import torch
from torch import Tensor, nn

from fdattack.defenses.base import DEFENSES, TrainingDefense
from fdattack.engine import FitJob, ModelHandle, PrivateSteps
from fdattack.errors import ConfigError
from fdattack.knobs import Choice, knob
from fdattack.models import CLASSIFIERS, build_classifier
from fdattack.randomness import derive_seed

if TYPE_CHECKING:  # opacus is the optional ``dp`` extra: imported where DP-SGD runs (require_opacus says what is missing)
    from opacus.accountants import RDPAccountant


def require_opacus() -> None:
    """Check that opacus, which DP-SGD trains and accounts with, is installed (the ``dp`` extra).

    Raises:
        ConfigError: it is not, with the command that installs it.
    """
    if importlib.util.find_spec("opacus") is None:
        raise ConfigError("defenses=[dpsgd] trains with opacus, which is not installed: pip install 'fdattack[dp]'")


class DPPhase(Choice):
    """The protocols' client-training phases (a protocol that adds one adds it here)."""

    transfer_public = "transfer_public"
    transfer_private = "transfer_private"
    digest = "digest"
    revisit = "revisit"
    warmup = "warmup"
    local_train = "local_train"
    distill = "distill"

    def __repr__(self) -> str:  # as written in a config (``--help-config`` shows the default list)
        return repr(self.value)


#: the phases in which a client trains on its private set alone (FedMD, DS-FL, Cronus, FedGEMS, FedAvg)
PRIVATE_PHASES = [DPPhase.transfer_private, DPPhase.revisit, DPPhase.warmup, DPPhase.local_train]


@dataclass
class DPSGDSettings:
    noise_multiplier: float = knob(
        1.0, "σ: the Gaussian noise on each step's sum of clipped per-sample gradients has std σ·C (0 = clipping only)", ge=0
    )
    max_grad_norm: float = knob(10.0, "C: each sample's gradient is clipped to L2 norm C (PDA-FD Table 9: 10)", gt=0)
    delta: float = knob(1e-5, "δ of the (ε, δ) reported after every round (opacus RDP accountant)", gt=0, lt=1)
    poisson_sampling: bool = knob(
        True,
        "each step takes every row with probability q = B/n (opacus); false: the usual shuffled batches "
        "of B (the reported ε still assumes Poisson sampling at q)",
    )
    phases: list[DPPhase] = knob(
        PRIVATE_PHASES,
        "client phases trained with DP-SGD; default: the local updates on private data, "
        "distillation on public data stays non-private; cronus with protocol.mixed_kd=true trains on "
        f"private data in distill [any of: {' | '.join(DPPhase)}]",
    )


def sample_rate(n: int, batch_size: int) -> float:
    """q = B / n, the probability that a step takes a given row (at most 1)."""
    return min(1.0, batch_size / n)


def poisson_batches(n: int, seed: int, batch_size: int) -> list[Tensor]:
    """One epoch of Poisson sampling, as opacus' ``DPDataLoader``: int(1/q) steps, each taking every row with
    probability q = B/n, independently (a step may be empty); seeded with ``seed``."""
    from opacus.utils.uniform_sampler import UniformWithReplacementSampler

    sampler = UniformWithReplacementSampler(
        num_samples=n, sample_rate=sample_rate(n, batch_size), generator=torch.Generator().manual_seed(seed)
    )
    return [torch.tensor(rows, dtype=torch.long) for rows in sampler]


def unsupported_layers(net: nn.Module) -> list[str]:
    """Layer types of ``net`` that opacus' validators refuse to train per sample (BatchNorm mixes the samples of a batch)."""
    from opacus.validators import ModuleValidator

    validators = ModuleValidator.VALIDATORS
    return sorted({type(m).__name__ for m in net.modules() if type(m) in validators and validators[type(m)](m)})


@functools.cache
def trainable_classifiers() -> tuple[str, ...]:
    """The registered classifiers that DP-SGD can train (no :func:`unsupported_layers`), for error messages."""
    return tuple(sorted(name for name in CLASSIFIERS if not unsupported_layers(build_classifier(name, 3, 32, 10))))


def record_steps(accountant: RDPAccountant, noise_multiplier: float, rate: float, steps: int) -> None:
    """Record ``steps`` DP-SGD steps at noise ``noise_multiplier`` and sampling rate ``rate``, as opacus' optimizer hook
    records each of them (the history keeps one (σ, q, count) entry per run of equal steps)."""
    for _ in range(steps):
        accountant.step(noise_multiplier=noise_multiplier, sample_rate=rate)


@functools.lru_cache(maxsize=256)
def epsilon_of(history: tuple[tuple[float, float, int], ...], delta: float) -> float:
    """opacus' RDP ε at ``delta`` of an accountant's history of (σ, q, steps) entries. Clients with the same schedule
    share one history, and each round asks again for the rounds before it; the RDP over every order is most of a
    DP-SGD run's accounting, so each history is computed once."""
    from opacus.accountants import RDPAccountant

    accountant = RDPAccountant()
    accountant.history = [tuple(entry) for entry in history]
    return float(accountant.get_epsilon(delta=delta))


@contextmanager
def private_steps(handle: ModelHandle, steps: PrivateSteps, *, rate: float, accountant: RDPAccountant) -> Iterator[ModelHandle]:
    """The client's model with per-sample gradient hooks on its network and an optimizer that takes ``steps`` (opacus).

    Each step: per-sample gradients g_i (opacus hooks), g̃ = (Σ_i g_i · min(1, C/(‖g_i‖ + 1e-6)) + N(0, σ²C² I)) / E,
    then the client's own optimizer on g̃; ``accountant`` records the step at sampling rate ``rate``. The noise is
    drawn from a generator seeded with ``steps.noise_seed``. On exit the hooks and opacus' attributes are removed.
    """
    from opacus import GradSampleModule
    from opacus.optimizers import DPOptimizer

    net = handle.module.net
    hooks = GradSampleModule(net, loss_reduction="mean")
    generator = torch.Generator(device=next(net.parameters()).device).manual_seed(steps.noise_seed)
    optimizer = DPOptimizer(
        handle.optimizer,
        noise_multiplier=steps.noise_multiplier,
        max_grad_norm=steps.max_grad_norm,
        expected_batch_size=steps.expected_batch_size,
        generator=generator,
    )
    optimizer.attach_step_hook(accountant.get_optimizer_hook_fn(rate))
    try:
        with warnings.catch_warnings():  # torch's note that the first layer's input needs no gradient: expected here
            warnings.filterwarnings("ignore", "Full backward hook is firing", UserWarning)
            yield replace(handle, optimizers=[optimizer])
    finally:
        hooks.cleanup()
        for p in optimizer.params:
            if hasattr(p, "summed_grad"):
                del p.summed_grad


@DEFENSES.register("dpsgd")
class DPSGDDefense(TrainingDefense):
    """Every client trains its ``phases`` with DP-SGD (vectorised, or one client at a time through opacus); ε per client
    from an RDP accountant.

    Refused at build time: a network with BatchNorm (its per-sample gradients are not defined) and DDP (each
    client trains in one process here, without opacus' distributed optimizer). With ``poisson_sampling=false``
    and σ = 0, C large, a client whose private set fits in one batch trains as without the defense.
    """

    vectorised = True
    name = "dpsgd"
    Settings = DPSGDSettings

    def __init__(self, settings: DPSGDSettings, seed: int) -> None:
        require_opacus()
        super().__init__(settings, seed)
        self.accountants: dict[int, RDPAccountant] = {}

    def wrap_network(self, client: int, net: nn.Module) -> nn.Module:
        """Check that opacus can train ``net`` per sample, and open the client's accountant; the network is unchanged."""
        if torch.distributed.is_available() and torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
            raise ConfigError(
                f"defense {self.name}: trainer.devices and trainer.num_nodes run {torch.distributed.get_world_size()} processes (DDP); "
                "DP-SGD trains each client in one process: set trainer.devices=1 and trainer.num_nodes=1"
            )
        layers = unsupported_layers(net)
        if layers:
            raise ValueError(
                f"has {', '.join(layers)}, which DP-SGD cannot train per sample; choose a model without it: "
                f"{', '.join(trainable_classifiers())}"
            )
        from opacus.accountants import RDPAccountant

        self.accountants[client] = RDPAccountant()
        return net

    def wrap_job(self, client: int, phase: str, job: FitJob, batch_size: int) -> FitJob:
        """In a listed phase: Poisson batches (or the plain shuffle) and DP-SGD steps at q = B/n, described for the
        vectorised path (``private``) and taken by opacus in the per-client loop (``session``, :func:`private_steps`);
        both tell the client's accountant their steps. Else ``job``."""
        if phase not in self.settings.phases or job.epochs <= 0 or len(job.data) == 0:
            return job
        n, s, accountant = len(job.data), self.settings, self.accountants[client]
        sigma, rate = float(s.noise_multiplier), sample_rate(n, batch_size)
        steps = PrivateSteps(
            noise_multiplier=sigma,
            max_grad_norm=float(s.max_grad_norm),
            expected_batch_size=min(batch_size, n),
            noise_seed=derive_seed(job.seed, self.name),
            account=functools.partial(record_steps, accountant, sigma, rate),
        )
        session = functools.partial(private_steps, steps=steps, rate=rate, accountant=accountant)
        return replace(job, sampler=poisson_batches if s.poisson_sampling else None, session=session, private=steps)

    def epsilons(self) -> dict[int, float]:
        """ε spent so far by each client at ``delta`` (0 before its first private step, inf with σ = 0)."""
        delta = float(self.settings.delta)
        return {k: epsilon_of(tuple(map(tuple, a.history)), delta) for k, a in sorted(self.accountants.items())}

    def round_metrics(self) -> dict[str, float]:
        eps = list(self.epsilons().values())
        return {"epsilon": max(eps), "epsilon_mean": sum(eps) / len(eps)} if eps else {}

    def state_dict(self) -> dict:
        return {"accountants": {k: dict(a.state_dict()) for k, a in self.accountants.items()}}

    def load_state_dict(self, state: dict) -> None:
        for k, saved in state["accountants"].items():
            self.accountants[int(k)].load_state_dict(saved)
