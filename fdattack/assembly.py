"""What a run's config builds, before its first round (:func:`assemble`): the data, the protocol, the evaluator's oracle,
the attacks' declarations, settings, seeds and views, the membership candidates, the defenses, the attacks (in process,
a plugin's guarded; isolated ones start in sandboxed workers once the run directory is laid out) and the evaluator.
:class:`fdattack.experiment.Experiment` drives the loop (rounds, records, checkpoints, scoring) of what this builds.
"""

from __future__ import annotations

import logging
import secrets
import tempfile
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Sequence

import torch
from lightning.fabric import Fabric
from omegaconf import DictConfig, OmegaConf

from fdattack.attacks import ATTACKS, Attack, AttackContext
from fdattack.attacks.declaration import Declaration, DeclarationError, declare, settings_of
from fdattack.attacks.state_store import ClientStateStore
from fdattack.data.domains import DOMAIN_TRANSFORMS
from fdattack.data.federated import FederatedData
from fdattack.defenses import DEFENSES, Defense
from fdattack.engine import LocalTrainer, make_fabric
from fdattack.errors import ConfigError
from fdattack.evaluation import SCORERS, ConfidenceGapDiagnostic, Evaluator, Oracle, ScoringContext
from fdattack.evaluation.candidates import CandidatePool, candidate_pool
from fdattack.fd.adversary import Adversary
from fdattack.fd.protocols import PROTOCOLS
from fdattack.fd.protocols.base import Protocol
from fdattack.fd.threat import AttackerView, Capability, Degradation, ViewPart, attacker_view
from fdattack.isolation import (
    AdversaryShape,
    Budget,
    IsolatedAttack,
    WorkerBrief,
    Zygote,
    concurrent_workers,
    worker_devices,
)
from fdattack.isolation.guard import GuardedAttack
from fdattack.isolation.processes import log_of
from fdattack.plugins import plugin_components
from fdattack.randomness import derive_seed, seed_everything_quietly
from fdattack.tracking import Progress
from fdattack.tracking.artifact_cache import AttackCache

log = logging.getLogger("fdattack")


def default_output_dir(cfg: DictConfig) -> Path:
    """``runs/<name>-<YYYYmmdd-HHMMSS>`` under the working directory."""
    return Path("runs") / f"{cfg.name}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"


def known_degradation(cfg: DictConfig) -> Degradation | None:
    """The transform that made the public set's insensitive look, where it is a known one (blur): public knowledge."""
    if cfg.data.split != "pli" or cfg.data.aux_domain in ("second_look", "none"):
        return None
    return partial(DOMAIN_TRANSFORMS.get(cfg.data.aux_domain), k=cfg.data.blur_strength)


def attack_settings(cfg: DictConfig, name: str) -> dict:
    """``attack.<name>`` as a plain dict (what an attack's ``Settings`` are made from where it runs)."""
    return OmegaConf.to_container(cfg.attack[name], resolve=True)  # type: ignore[return-value]


def declare_attacks(cfg: DictConfig, zygote: Zygote | None) -> dict[str, Declaration]:
    """Each attack's declarations with its settings, by name (:mod:`fdattack.attacks.declaration`): read by a confined
    child of ``zygote`` (``isolation.mode=process``: no attack code runs in the run for them), else in this process."""
    settings = {name: attack_settings(cfg, name) for name in cfg.attacks}
    if zygote is not None:
        return zygote.declare(list(cfg.plugins), settings)
    try:
        return {name: declare(ATTACKS.get(name), plain) for name, plain in settings.items()}
    except DeclarationError as err:
        raise ConfigError(f"attacks: {err}") from None


def membership_candidates(cfg: DictConfig, data: FederatedData, declared: dict[str, Declaration]) -> CandidatePool | None:
    """The candidate samples of the membership attacks (None when none runs), drawn with the run seed.

    Raises:
        ConfigError: the test set, whence every client's non-members come, is empty (``data.test_fraction=0`` on a
            dataset without a test split of its own): no client could be scored.
    """
    readers = [name for name in cfg.attacks if ViewPart.candidates in declared[name].reads]
    if not readers:
        return None
    if len(data.split.test) == 0:
        raise ConfigError(
            f"attacks=[{','.join(readers)}] score each client's members against non-members from the test set, which is empty "
            f"(data.test_fraction={cfg.data.test_fraction} with data.name={cfg.data.name}), so no client could be scored; "
            "set data.test_fraction > 0 (e.g. 0.2)"
        )
    return candidate_pool(data.split, cfg.evaluation.max_candidates, derive_seed(cfg.seed, "membership_candidates"))


def view_for(cfg: DictConfig, protocol: Protocol, data: FederatedData, candidates: CandidatePool | None = None) -> AttackerView:
    """The attacker's view of this run, from the protocol's declared threat model."""
    shared = set(protocol.client_archs)
    return attacker_view(
        data.split,
        protocol.threat_model,
        protocol.name,
        protocol.server is not None,
        known_degradation(cfg),
        candidates=None if candidates is None else candidates.as_known(),
        architecture=shared.pop() if len(shared) == 1 else None,
        network_changes=tuple(protocol.network_changes.values()),
        aggregation=protocol.aggregation(),
    )


def build_defenses(cfg: DictConfig) -> list[Defense]:
    """The defenses of ``cfg.defenses``, in order, each from its own ``defense.<name>`` settings."""
    return [DEFENSES.get(name)(OmegaConf.to_object(cfg.defense[name]), cfg.seed) for name in cfg.defenses]


def attack_root(cfg: DictConfig, kept: int | None = None) -> int:
    """The root of the attacks' randomness (``attack_seed``): given, kept in a checkpoint (``kept``, on resume), the run
    seed in process, or with ``isolation.mode=process`` 63 random bits, which no search of the run's seeds finds."""
    if cfg.attack_seed is not None:
        return int(cfg.attack_seed)
    if kept is not None:
        return kept
    return secrets.randbits(63) if cfg.isolation.mode == "process" else int(cfg.seed)


def attacker_seed(root: int) -> int:
    """The attacker's seed, derived from the attacks' root (:func:`attack_root`), never the run seed, from which the
    run's secrets derive (the candidates' order, the non-member draws, the defenses' noise, the evasive clients' salts,
    the data split)."""
    return derive_seed(root, "attacker")


def _grant(name: str, declared: Declaration, protocol: Protocol, adversaries: dict[str, Adversary]) -> None:
    """An adversary with the powers attack ``name`` declares, where it declares any, granted by ``protocol`` and kept in
    ``adversaries`` under ``name``."""
    if declared.powers:
        adversaries[name] = protocol.grant_adversary(declared.powers)


def attack_cache(cfg: DictConfig, name: str) -> Path:
    """The folder of attack ``name``'s cached networks under ``cache_dir`` (one per attack: an isolated worker may write
    its own and read no other's, nor the evaluation side's)."""
    return Path(cfg.cache_dir) / "attacks" / name


def build_attacks(
    cfg: DictConfig,
    view: AttackerView,
    protocol: Protocol,
    declared: dict[str, Declaration],
    root: int,
    engine: LocalTrainer | None = None,
    state_root: Path | None = None,
) -> tuple[list[Attack | GuardedAttack], dict[str, Adversary]]:
    """The attacks of ``cfg.attacks``, each built from its own copy of the attacker's view
    (:meth:`~fdattack.fd.threat.AttackerView.for_attack`), its own ``attack.<name>`` settings and a context; an attack
    that needs server powers gets an :class:`~fdattack.fd.adversary.Adversary` with exactly those.

    Args:
        protocol: grants the adversaries (the attacks never receive it).
        declared: each attack's declarations (:func:`declare_attacks`).
        root: the attacks' root (:func:`attack_root`).
        engine: the attacks' engine (a Fabric of their own on the run's devices), which their training goes through.
        state_root: folder where attacks keep their per-client networks between rounds (None: memory), with the
            rounds of the ``keep_checkpoints`` newest checkpoints.

    Returns:
        The attacks (a plugin's wrapped in a :class:`~fdattack.isolation.guard.GuardedAttack`), and the adversaries
        granted, by attack name: the run's own references (an attack may replace
        the one its context holds; the run never calls into what an attack holds).
    """
    attacks: list[Attack | GuardedAttack] = []
    adversaries: dict[str, Adversary] = {}
    for name in cfg.attacks:
        _grant(name, declared[name], protocol, adversaries)
        context = AttackContext(
            seed=attacker_seed(root),
            store=ClientStateStore(state_root / name if state_root is not None else None, keep=cfg.keep_checkpoints),
            progress=str(cfg.logger.progress),
            engine=engine,
            adversary=adversaries.get(name),
            cache=None if cfg.cache_dir is None else AttackCache(attack_cache(cfg, name), name, "in_process"),
        )
        cls = ATTACKS.get(name)
        own_view, settings = view.for_attack(name, declared[name].reads), settings_of(cls, attack_settings(cfg, name))
        if name in plugin_components("attack"):  # a plugin's failure costs its attack only (fdattack.isolation.guard)
            log_path = log_of(state_root / name) if state_root is not None else None
            attacks.append(GuardedAttack(name, partial(cls, own_view, settings, context), log_path))
        else:
            attacks.append(cls(own_view, settings, context))
    return attacks, adversaries


def start_isolated_attacks(
    cfg: DictConfig,
    view: AttackerView,
    protocol: Protocol,
    declared: dict[str, Declaration],
    root: int,
    state_root: Path,
    zygote: Zygote,
) -> tuple[list[IsolatedAttack], dict[str, Adversary]]:
    """``isolation.mode=process``: the attacks of ``cfg.attacks``, each in a worker process of its own (forked by
    ``zygote``) built from the brief :func:`build_attacks` would build it from (:mod:`fdattack.isolation`); the workers
    build their attacks at once, each on a GPU of its own where the machine has more than the run's
    (:func:`~fdattack.isolation.worker_devices`). With ``isolation.overlap``, the first attacks that :func:`can_overlap`
    end their rounds beside the next round's simulation, as many as the cores give the run's threads to each beside it
    (:func:`~fdattack.isolation.concurrent_workers` less one)."""
    t = cfg.trainer
    trainer = {"precision": str(t.precision), "vectorise": t.vectorise, "batch_size": int(cfg.protocol.optim.batch_size)}
    gpus = torch.cuda.device_count() if protocol.engine.fabric.device.type == "cuda" else 0
    devices = worker_devices(str(protocol.engine.fabric.device), gpus, len(cfg.attacks))
    budget = Budget(cfg.isolation.seconds, cfg.isolation.memory_mb)
    beside = concurrent_workers(torch.get_num_threads()) - 1 if cfg.isolation.overlap else 0  # the simulation keeps its share
    attacks: list[IsolatedAttack] = []
    adversaries: dict[str, Adversary] = {}
    for name, (accelerator, on) in zip(cfg.attacks, devices):
        _grant(name, declared[name], protocol, adversaries)
        powers = declared[name].powers
        shape = AdversaryShape(powers, len(protocol.split.public), tuple(protocol.split.image_shape)) if powers else None
        brief = WorkerBrief(
            attack=name,
            plugins=tuple(cfg.plugins),
            settings=attack_settings(cfg, name),
            view=view.for_attack(name, declared[name].reads),
            seed=attacker_seed(root),
            globals_seed=derive_seed(root, "worker globals", name),
            state_root=str(state_root.resolve()),
            keep=int(cfg.keep_checkpoints),
            threads=torch.get_num_threads(),
            trainer={**trainer, "accelerator": accelerator, "devices": on},
            adversary=shape,  # type: ignore[arg-type]
            cache=None if cfg.cache_dir is None else str(attack_cache(cfg, name).resolve()),
        )
        overlaps = len([a for a in attacks if a.overlaps]) < beside and can_overlap(declared[name], name in adversaries)
        attacks.append(IsolatedAttack(brief, adversaries.get(name), budget, state_root / name, zygote, overlaps))
    for attack in attacks:
        attack.wait_ready()
    confined = [attack.sandbox_abi for attack in attacks if attack.alive]  # a worker that failed to start said why
    if confined and min(confined) == 0:
        log.warning(
            "attack workers: no Landlock sandbox on this system; each worker holds nothing of the run in memory but can read "
            "the files the run's user can (docs/threat-model.md)"
        )
    elif confined:
        log.info(
            "attack workers: each confined by Landlock (ABI %d) to reading Python's files and writing its state folder, and by "
            "seccomp to starting no process, socket or program",
            min(confined),
        )
    return attacks, adversaries


def can_overlap(declared: Declaration, has_adversary: bool) -> bool:
    """Whether an attack may end its rounds beside the next round's simulation: not with an adversary (its actions
    shape the next round), nor with results scored on the round's networks
    (:meth:`~fdattack.evaluation.scoring.ScorerRegistry.on_round_models`)."""
    return not has_adversary and not any(SCORERS.on_round_models(t) for t in declared.produces)


def say_what_overlaps(workers: Sequence[IsolatedAttack]) -> None:
    """Log which attacks end their rounds beside the simulation (``isolation.overlap``), or why none does here."""
    threads = torch.get_num_threads()
    overlapping = [w.name for w in workers if w.overlaps]
    if overlapping:
        log.info("isolation.overlap: %s end each round beside the next round's simulation", ", ".join(overlapping))
    elif concurrent_workers(threads) < 2:
        log.warning(
            "isolation.overlap=true: this machine's cores leave no room beside the simulation for a worker of %d thread(s), so the "
            "attacks end their rounds in step (with fewer threads a process, e.g. OMP_NUM_THREADS=1, one can overlap)",
            threads,
        )
    else:
        log.info("isolation.overlap: no attack here ends its rounds beside the simulation (each holds an adversary or is scored live)")


def build_evaluator(
    cfg: DictConfig,
    oracle: Oracle,
    declared: dict[str, Declaration],
    progress: Progress | None = None,
    candidates: CandidatePool | None = None,
    cache_dir: Path | None = None,
) -> Evaluator:
    """The evaluation side: the diagnostics and, for each result type the attacks declare in ``produces`` (``declared``), its registered
    scorer (:data:`~fdattack.evaluation.SCORERS`) built from one :class:`~fdattack.evaluation.ScoringContext` (the
    membership scorer against ``candidates``, the evaluation classifiers kept under ``cache_dir``)."""
    diagnostics = []
    if cfg.evaluation.confidence_gap.enabled:
        diagnostics.append(ConfidenceGapDiagnostic(oracle, cfg.evaluation.confidence_gap.max_samples, cfg.evaluation.confidence_gap.bins))
    produced = set().union(*(d.produces for d in declared.values()))
    context = ScoringContext(cfg, oracle, derive_seed(cfg.seed, "evaluation"), progress, candidates, cache_dir)
    return Evaluator(oracle, {t: SCORERS.get(t)(context) for t in sorted(produced, key=lambda t: t.__name__)}, diagnostics)


@dataclass
class Assembly:
    """Everything a run's config builds before its first round.

    Attributes:
        data: the federated split (the evaluator's ground truth among it).
        engine: the protocol's trainer.
        protocol: the clients and the server, their defenses applied.
        oracle: the ground truth the evaluator alone holds.
        declared: each attack's declaration (reads, needs, produces), from its class or its worker.
        attack_root: the attacks' seed root.
        view: what the attacker is granted (:class:`~fdattack.fd.threat.AttackerView`).
        state_root: where the attacks keep their states (a scratch folder on the ranks that write nothing).
        scratch: that scratch folder, removed with it (None on rank 0).
        attacks: the attacks built in process (none under ``isolation.mode=process``: their workers start later).
        adversaries: the adversaries the attacks hold, by attack.
        queriers: the attacks whose records carry a query handle.
        evaluator: the scorers of the attacks' result types and the diagnostics.
        zygote: the isolated workers' parent process (``isolation.mode=process``), else None.
    """

    data: FederatedData
    engine: LocalTrainer
    protocol: Protocol
    oracle: Oracle
    declared: dict[str, Declaration]
    attack_root: int
    candidates: CandidatePool | None
    view: AttackerView
    state_root: Path
    scratch: tempfile.TemporaryDirectory | None
    attacks: list[Attack | GuardedAttack]
    adversaries: dict[str, Adversary]
    queriers: frozenset[str]
    evaluator: Evaluator
    zygote: Zygote | None


def assemble(cfg: DictConfig, fabric: Fabric, output_dir: Path, progress: Progress) -> Assembly:
    """Build a run from ``cfg`` on ``fabric``: data, protocol, attacker view, in-process attacks and evaluator (the
    evaluation classifier trains here); the isolated workers' zygote starts first, importing while the rest builds,
    and is closed again if building fails."""
    t = cfg.trainer
    zygote = Zygote(list(cfg.plugins)) if cfg.isolation.mode == "process" and cfg.attacks else None
    try:
        seed_everything_quietly(cfg.seed)
        progress.activity(f"loading data ({cfg.data.name})")
        data = FederatedData(cfg.data, cfg.protocol.num_clients, cfg.seed)
        data.setup()
        progress.activity(f"building {cfg.protocol.name} with {cfg.protocol.num_clients} clients")
        engine = LocalTrainer(fabric, batch_size=cfg.protocol.optim.batch_size, vectorise=t.vectorise)
        protocol = PROTOCOLS.get(cfg.protocol.name)(cfg.protocol, cfg.model, data.split, engine, cfg.seed, build_defenses(cfg))
        oracle = Oracle(data.split, engine, tuple(protocol.clients), protocol.server, protocol.client_accuracy)
        declared = declare_attacks(cfg, zygote)
        root = attack_root(cfg)  # isolated, a resumed run goes on with its checkpoint's (Experiment.run)
        candidates = membership_candidates(cfg, data, declared)
        view = view_for(cfg, protocol, data, candidates)
        # only rank 0 writes the run directory; the other ranks keep their attack states in a scratch folder
        scratch = None if fabric.is_global_zero else tempfile.TemporaryDirectory(prefix="fdattack-attack-state-")
        state_root = output_dir / "attack_state" if scratch is None else Path(scratch.name)
        attacks: list[Attack | GuardedAttack] = []
        adversaries: dict[str, Adversary] = {}
        if cfg.isolation.mode != "process":
            # the attacks' own Fabric on the same devices: the run's Fabric lists every client module it set up
            attack_engine = LocalTrainer(
                make_fabric(t.accelerator, t.devices, t.strategy, t.num_nodes, t.precision),
                batch_size=cfg.protocol.optim.batch_size,
                vectorise=t.vectorise,
            )
            attacks, adversaries = build_attacks(cfg, view, protocol, declared, root, attack_engine, state_root)
        queriers = frozenset(name for name in cfg.attacks if Capability.public_outputs in declared[name].needs)
        evaluation_cache = Path(cfg.cache_dir) / "evaluation" if cfg.cache_dir else output_dir / "artifacts"
        evaluator = build_evaluator(cfg, oracle, declared, progress, candidates, evaluation_cache)
    except BaseException:
        if zygote is not None:
            zygote.close()
        raise
    return Assembly(
        data=data,
        engine=engine,
        protocol=protocol,
        oracle=oracle,
        declared=declared,
        attack_root=root,
        candidates=candidates,
        view=view,
        state_root=state_root,
        scratch=scratch,
        attacks=attacks,
        adversaries=adversaries,
        queriers=queriers,
        evaluator=evaluator,
        zygote=zygote,
    )
