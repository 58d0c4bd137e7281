"""``run(cfg)``: build a run from its config and drive it to the end, with records, W&B and resume.

One run is one directory (DESIGN.md): ``config.yaml``, ``rounds.jsonl`` (one line per completed
round), ``metrics.json`` (at the end), ``partition.json``, ``images/``, ``checkpoints/`` and the W&B
files. Under DDP every rank runs the same code; only rank 0 writes files and logs.
"""

from __future__ import annotations

import json
import logging
import secrets
import tempfile
import time
import traceback
from copy import deepcopy
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Callable, Optional, Sequence

import torch
from omegaconf import DictConfig, OmegaConf
from torchvision.utils import save_image

from fdattack.attacks import ATTACKS, Attack, AttackContext
from fdattack.attacks.declaration import Declaration, DeclarationError, declare, settings_of
from fdattack.attacks.state_store import ClientStateStore
from fdattack.config.validation import check_names
from fdattack.data.domains import DOMAIN_TRANSFORMS
from fdattack.data.federated import FederatedData
from fdattack.defenses import DEFENSES, Defense
from fdattack.engine import LocalTrainer, make_fabric
from fdattack.engine.cluster import check_launcher
from fdattack.errors import CheckpointError, ConfigError, FdattackError, stop_if_terminated
from fdattack.evaluation import SCORERS, ConfidenceGapDiagnostic, Evaluator, Oracle, Report, ScoringContext
from fdattack.evaluation.candidates import CandidatePool, candidate_pool
from fdattack.fd import results as results_module
from fdattack.fd.adversary import Adversary
from fdattack.fd.observer import Observer
from fdattack.fd.orchestrator import RoundOrchestrator
from fdattack.fd.protocols import PROTOCOLS
from fdattack.fd.protocols.base import Protocol
from fdattack.fd.threat import AttackerView, Capability, Degradation, ViewPart, attacker_view
from fdattack.isolation import (
    AdversaryShape,
    Budget,
    IsolatedAttack,
    MemoryWatch,
    WorkerBrief,
    Zygote,
    collect_round_ends,
    concurrent_workers,
    in_process_state,
    worker_devices,
)
from fdattack.isolation.guard import GuardedAttack
from fdattack.isolation.proxy import log_of
from fdattack.plugins import plugin_components
from fdattack.randomness import derive_seed, seed_everything_quietly
from fdattack.seeds import run_seeds
from fdattack.tracking import (
    Progress,
    RunDirectory,
    WandbRun,
    attack_summary,
    load_checkpoint,
    resolve_mode,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from fdattack.tracking.artifact_cache import AttackCache
from fdattack.tracking.exit_record import exit_record
from fdattack.tracking.logs import configure_logging
from fdattack.tracking.machine import machine_info
from fdattack.tracking.run_dir import config_fingerprint
from fdattack.tracking.stopped_attacks import without_stopped_scores

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


def _say_what_overlaps(workers: Sequence[IsolatedAttack]) -> None:
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
class EndingRound:
    """A round whose attacks are not all scored yet: its report so far, when it started, the workers still ending it
    (``isolation.overlap``) and the run's side of its checkpoint (None when none is due)."""

    round: int
    report: Report
    started: float
    overlapping: list[IsolatedAttack]
    state: Optional[dict]


def _flat_config(cfg: DictConfig) -> dict:
    return OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)  # type: ignore[return-value]


class Experiment:
    """A built run: Fabric, data, protocol, attacks, evaluator. ``Experiment(cfg).run()`` is :func:`run`.

    The three sides stay apart: the protocol (clients and server), the attacks (built from
    :attr:`view` alone, fed the round records) and the evaluator (the only holder of :attr:`oracle`).

    Building first runs a pre-flight that can fail fast (the W&B mode, registry names, the run
    directory and, on resume, the stored config) and locks the run directory for the whole run; only
    then are the data, the protocol, the attacks and the evaluation classifier built. Building
    launches the DDP ranks when ``trainer.strategy=ddp`` asks for them, so everything after
    construction runs on every rank.
    """

    def __init__(self, cfg: DictConfig) -> None:
        configure_logging(str(cfg.logger.level))
        self.cfg = cfg
        self._fingerprint = config_fingerprint(cfg)
        self.started = time.perf_counter()
        t = cfg.trainer
        check_launcher(int(t.num_nodes))
        self.fabric = make_fabric(t.accelerator, t.devices, t.strategy, t.num_nodes, t.precision)
        output_dir = Path(cfg.output_dir) if cfg.output_dir else default_output_dir(cfg)
        self.output_dir = Path(self.fabric.broadcast(str(output_dir)))
        self.run_dir = RunDirectory(self.output_dir, is_writer=self.fabric.is_global_zero, keep_checkpoints=cfg.keep_checkpoints)
        self._on_rank_zero(self._preflight)
        self.progress = Progress(cfg.logger.progress if self.fabric.is_global_zero else "never", total_rounds=int(cfg.protocol.rounds))
        try:
            with exit_record(self.run_dir):  # a stop while the data, networks and evaluation classifier are built is recorded
                self._build()
        except BaseException:
            self.close_workers()
            self.progress.close()
            self.run_dir.release()
            raise

    def _preflight(self) -> None:
        """The checks that can fail, before anything is built; claims (locks) the run directory."""
        resolve_mode(str(self.cfg.logger.wandb.mode))
        check_names(self.cfg)
        self.run_dir.claim(self.cfg)

    def _build(self) -> None:
        """Data, protocol, attacker view, attacks and evaluator (the evaluation classifier trains here)."""
        cfg, t = self.cfg, self.cfg.trainer
        # the workers' zygote imports what they need while the run builds (isolation.mode=process)
        self._zygote = Zygote(list(cfg.plugins)) if cfg.isolation.mode == "process" and cfg.attacks else None
        seed_everything_quietly(cfg.seed)
        self.progress.activity(f"loading data ({cfg.data.name})")
        self.data = FederatedData(cfg.data, cfg.protocol.num_clients, cfg.seed)
        self.data.setup()
        self.progress.activity(f"building {cfg.protocol.name} with {cfg.protocol.num_clients} clients")
        self.engine = LocalTrainer(self.fabric, batch_size=cfg.protocol.optim.batch_size, vectorise=t.vectorise)
        self.protocol = PROTOCOLS.get(cfg.protocol.name)(
            cfg.protocol, cfg.model, self.data.split, self.engine, cfg.seed, build_defenses(cfg)
        )
        self.oracle = Oracle(
            self.data.split, self.engine, tuple(self.protocol.clients), self.protocol.server, self.protocol.client_accuracy
        )
        self.declared = declare_attacks(cfg, self._zygote)
        self._attack_root = attack_root(cfg)  # isolated, a resumed run goes on with its checkpoint's (run())
        candidates = membership_candidates(cfg, self.data, self.declared)
        self.view = view_for(cfg, self.protocol, self.data, candidates)
        # only rank 0 writes the run directory; the other ranks keep their attack states in a scratch folder
        self._scratch = None if self.fabric.is_global_zero else tempfile.TemporaryDirectory(prefix="fdattack-attack-state-")
        state_root = self.output_dir / "attack_state" if self._scratch is None else Path(self._scratch.name)
        self.attacks: list[Attack | IsolatedAttack | GuardedAttack] = []
        self.adversaries: dict[str, Adversary] = {}
        self._observers: list[Observer] = []  # added by :meth:`observe`, after the attacks
        self._state_root = state_root
        # the attacks whose records carry a query handle, from their declarations
        self._queriers = frozenset(name for name in cfg.attacks if Capability.public_outputs in self.declared[name].needs)
        if cfg.isolation.mode != "process":  # workers start in run(), once the run directory is laid out
            # the attacks' own Fabric on the same devices: the run's Fabric lists every client module it set up
            attack_engine = LocalTrainer(
                make_fabric(t.accelerator, t.devices, t.strategy, t.num_nodes, t.precision),
                batch_size=cfg.protocol.optim.batch_size,
                vectorise=t.vectorise,
            )
            self.attacks, self.adversaries = build_attacks(
                cfg, self.view, self.protocol, self.declared, self._attack_root, attack_engine, state_root
            )
        evaluation_cache = Path(cfg.cache_dir) / "evaluation" if cfg.cache_dir else self.output_dir / "artifacts"
        self.evaluator = build_evaluator(cfg, self.oracle, self.declared, self.progress, candidates, evaluation_cache)

    def observe(self, observer: Observer, query: bool = False) -> None:
        """Hand ``observer`` (a probe, a logger of one's own) every round record after the attacks, and end its rounds
        with theirs; ``query``: its records carry a query handle, as an attack's that declares ``public_outputs``."""
        self._observers.append(observer)
        self.attacks.append(observer)  # type: ignore[arg-type]
        if query:
            self._queriers = self._queriers | {observer.name}

    def run(self) -> dict[str, float]:
        """Run (or resume) every round; write the run directory; return the final metrics. The run directory's lock is
        released at the end."""
        try:
            return self._run()
        finally:
            self.close_workers()
            self.progress.close()
            self.run_dir.release()

    def close_workers(self) -> None:
        """Stop the attacks' worker processes (``isolation.mode=process``); nothing without them."""
        if getattr(self, "_memory_watch", None) is not None:
            self._memory_watch.stop()
            self._memory_watch = None
        for attack in getattr(self, "attacks", []):
            if isinstance(attack, IsolatedAttack):
                attack.close()
        if getattr(self, "_zygote", None) is not None:
            self._zygote.close()
            self._zygote = None

    def _run(self) -> dict[str, float]:
        """:meth:`run` while the run directory is locked."""
        cfg, fabric, run_dir, progress = self.cfg, self.fabric, self.run_dir, self.progress
        self._on_rank_zero(self._prepare_run_dir)
        last = run_dir.checkpoints.latest() if cfg.resume else None
        state = load_checkpoint(last[1]) if last is not None else None  # the pre-flight checked its keys, round and fingerprint
        if self._zygote is not None:
            self._attack_root = attack_root(cfg, None if state is None else state.get("attack_seed"))
            progress.activity(f"starting {len(cfg.attacks)} attack worker(s)")
            workers, self.adversaries = start_isolated_attacks(
                cfg, self.view, self.protocol, self.declared, self._attack_root, self._state_root, self._zygote
            )
            self.attacks = [*workers, *self._observers]  # type: ignore[list-item]
            self._memory_watch = MemoryWatch(workers) if cfg.isolation.memory_mb is not None else None
            if cfg.isolation.overlap:
                _say_what_overlaps(workers)
        start_round, elapsed_before, wandb_id = 0, 0.0, None
        if last is not None and state is not None:
            self._restore(state, last[1])
            start_round, elapsed_before, wandb_id = int(state["round"]), float(state["elapsed_s"]), state["wandb_id"]
            run_dir.truncate_rounds(start_round)
            run_dir.forget_stop()
            progress.skip_to(start_round)
            log.info("resuming %s after round %d", self.output_dir, start_round)
        elif fabric.is_global_zero:
            self.data.save_partition(self.output_dir / "partition.json")
        machine = machine_info(str(cfg.trainer.accelerator))
        run_dir.record_machine(machine, start_round)
        if fabric.is_global_zero:
            log.info("fdattack: %s", ", ".join(f"{k}={v}" for k, v in self.protocol.describe().items()))
            log.info("data: %s", ", ".join(f"{k}={v}" for k, v in self.data.split.info.items()))

        rounds = int(cfg.protocol.rounds)
        orchestrator = RoundOrchestrator(
            self.protocol, self.attacks, cfg.protocol.on_bad_upload, self._on_phase, self._queriers, self._attack_root
        )
        wandb_cfg = cfg.logger.wandb if fabric.is_global_zero else _disabled(cfg)
        tracker = WandbRun.start(wandb_cfg, self.output_dir, {**_flat_config(cfg), "machine": machine}, resume_id=wandb_id)
        with exit_record(run_dir), tracker:
            if last is None:
                progress.activity("round 0: set-up phases")
                setup_metrics = orchestrator.run_setup().metrics
                report = self.evaluator.setup_report()
                report.metrics = {**setup_metrics, **report.metrics}
                _record(run_dir, tracker, 0, report)
                self._save_checkpoint(self._run_side_state(0, copy=False), {}, elapsed_before, tracker)
            # metrics.json holds every metric's latest value (an attack of round 1 stays in it), as W&B's summary does
            final = _latest_metrics(self.output_dir) if last is not None and fabric.is_global_zero else {}
            ending: EndingRound | None = None
            for round_index in range(start_round + 1, rounds + 1):
                round_started = time.perf_counter()
                report = self._simulate(orchestrator, round_index)
                if ending is not None:  # the overlapping workers ended the last round while this one simulated
                    final.update(self._finish(ending, round_started, elapsed_before, tracker))
                due = round_index % cfg.checkpoint_every == 0 or round_index == rounds
                ending = self._end_round(orchestrator, round_index, report, round_started, due)
                if not ending.overlapping:
                    final.update(self._finish(ending, time.perf_counter(), elapsed_before, tracker))
                    ending = None
            if ending is not None:
                final.update(self._finish(ending, time.perf_counter(), elapsed_before, tracker))
            progress.close()
            final["time/total_s"] = elapsed_before + time.perf_counter() - self.started
            final = without_stopped_scores(final)  # a stopped attack's scores of earlier rounds are not its answer
            run_dir.write_metrics(final)
            tracker.set_summary(final)
            latest = run_dir.checkpoints.latest()
            tracker.log_run_directory(self.output_dir, str(wandb_cfg.artifacts), None if latest is None else latest[1])
        if fabric.is_global_zero:
            table = attack_summary(final)
            if table:
                print(f"after round {rounds}:\n{table}")
            print(f"fdattack: results in {self.output_dir.resolve()} (metrics.json, rounds.jsonl)")
        return final

    def _simulate(self, orchestrator: RoundOrchestrator, round_index: int) -> Report:
        """The round's protocol phases (records go to the attacks), then the evaluator's report on the protocol."""
        protocol_metrics = orchestrator.run_round(round_index).metrics
        report = self.evaluator.round_report()
        report.metrics = {**protocol_metrics, **report.metrics}
        return report

    def _end_round(
        self, orchestrator: RoundOrchestrator, round_index: int, report: Report, started: float, checkpoint_due: bool
    ) -> EndingRound:
        """The attacks' end of the round. The overlapping workers' round ends start (:meth:`_finish` collects them, after
        the next round simulated); the other attacks end the round now and are scored: isolated ones in their workers,
        as many at once as the cores the overlapping ones leave give each the run's threads
        (:func:`~fdattack.isolation.concurrent_workers`).
        With a checkpoint due, the run's side of it is taken now (copied where the protocol moves on before it is written)."""
        isolated = [a for a in self.attacks if isinstance(a, IsolatedAttack)]
        overlapping = [a for a in isolated if a.overlaps and a.alive]
        for attack in overlapping:
            attack.dispatch_round_end(round_index, orchestrator.round_end_streams(attack.name, round_index), with_state=checkpoint_due)
        in_step = [a for a in isolated if a not in overlapping]
        results: dict[str, list] = {}
        at_once = max(1, concurrent_workers(torch.get_num_threads()) - len(overlapping))
        for first in range(0, len(in_step), at_once):
            wave = in_step[first : first + at_once]
            self.progress.activity(f"round {round_index}: attack worker(s) {', '.join(a.name for a in wave)}")
            for attack in wave:
                attack.dispatch_round_end(round_index, orchestrator.round_end_streams(attack.name, round_index))
            results.update(collect_round_ends(wave))
        for attack in self.attacks:
            if attack in overlapping:
                continue
            stop_if_terminated()
            self.progress.activity(f"round {round_index}: attack {attack.name}")
            if isinstance(attack, IsolatedAttack):
                self._score(report, round_index, attack, results[attack.name])
            else:
                self._score(report, round_index, attack, orchestrator.end_round(attack, round_index))
            adversary = self.adversaries.get(attack.name)
            if adversary is not None:
                report.metrics.update({f"adversary/{attack.name}/{key}": value for key, value in adversary.end_round().items()})
        state = self._run_side_state(round_index, copy=bool(overlapping), skip=overlapping) if checkpoint_due else None
        return EndingRound(round_index, report, started, overlapping, state)

    def _finish(self, ending: EndingRound, ended: float, elapsed_before: float, tracker: WandbRun) -> dict[str, float]:
        """Score the overlapping workers' results of ``ending``, record the round (its time: from its start to ``ended``)
        and write its checkpoint if one is due; the round's metrics."""
        round_index, report = ending.round, ending.report
        collected = collect_round_ends(ending.overlapping)
        for attack in ending.overlapping:
            stop_if_terminated()
            self._score(report, round_index, attack, collected[attack.name])
            report.metrics.update(attack.overlap_metrics())
        report.metrics["time/round_s"] = ended - ending.started
        _record(self.run_dir, tracker, round_index, report)
        if ending.state is not None:
            self.progress.activity(f"round {round_index}: checkpoint")
            workers = {attack.name: attack.state_dict() for attack in ending.overlapping}
            self._save_checkpoint(ending.state, workers, elapsed_before, tracker)
        self.progress.advance()
        return report.metrics

    def _score(self, report: Report, round_index: int, attack: Attack | IsolatedAttack, results: list) -> None:
        """Score ``attack``'s results of the round into ``report`` (with why it was stopped, if it was). An isolated or a
        plugin's attack whose results cannot be scored (a type it does not declare, fields its scorer refuses) is
        stopped, and the run goes on without it; fdattack's own attack in process ends the run (fdattack's bug)."""
        if isinstance(attack, (IsolatedAttack, GuardedAttack)):
            try:
                self._check_declared(attack.name, results)
                scored = self.evaluator.score(attack.name, results)
            except Exception as err:  # noqa: BLE001 - whatever its results make the scorers raise costs this attack only
                line = f"its results could not be scored ({type(err).__name__}: {err})"
                if isinstance(attack, IsolatedAttack):
                    attack.stop("failed", line)
                else:
                    attack.stop(line, traceback.format_exc())
                scored = Report()
            scored.metrics.update(attack.stopped_metrics())
        else:
            self._check_declared(attack.name, results)
            scored = self.evaluator.score(attack.name, results)
        self.progress.scores(round_index, attack.name, scored.metrics)
        report.update(scored)

    def _check_declared(self, name: str, results: list) -> None:
        """Raise RuntimeError where attack ``name`` returned a result type it does not declare in ``produces`` (another
        attack's declaring it built its scorer; an observer of :meth:`observe` declares nothing and is not checked).
        Types are compared by identity, which runs no code of theirs; what is not a result type at all is the
        evaluator's to refuse (:func:`~fdattack.fd.boundary.plain_result`)."""
        declared = self.declared.get(name)
        if declared is None:
            return
        for kind in (type(r) for r in results):
            if any(kind is t for t in results_module.RESULT_TYPES) and not any(kind is t for t in declared.produces):
                raise RuntimeError(
                    f"attack {name} returned {kind.__name__} but does not declare them: set produces = frozenset({{{kind.__name__}}}) "
                    "on its class"
                )

    def _on_phase(self, round_index: int, name: str) -> None:
        """Before each protocol phase: stop for a SIGTERM whose first exception Python dropped, then show the phase."""
        stop_if_terminated()
        self.progress.phase(round_index, name)

    def _restore(self, state: dict, path: Path) -> None:
        """Load the protocol's, the attacks' and the RNGs' states of a checkpoint.

        Raises:
            CheckpointError: a state that does not fit this run's networks or attacks (a checkpoint without a config
                fingerprint, from before issue 30, is checked by nothing else).
        """
        try:
            self.protocol.load_state_dict(state["protocol"])
            for attack in self.attacks:
                saved = state.get("attacks", state.get("observers", {})).get(attack.name, {})  # "observers" before issue 29
                attack.load_state_dict(saved if isinstance(attack, IsolatedAttack) else in_process_state(saved, attack.name))
            set_rng_state(state["rng"])
        except (KeyError, IndexError, TypeError, ValueError, RuntimeError, AttributeError) as err:
            reason = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
            raise CheckpointError(
                f"{path}: does not fit this run ({type(err).__name__}: {reason}); delete it to resume from an earlier checkpoint, "
                "or choose another output_dir"
            ) from None

    def _prepare_run_dir(self) -> None:
        """Lay out the run directory (clearing a stranded run's files) and write ``config.yaml``."""
        self.run_dir.prepare(resume=self.cfg.resume)
        self.run_dir.write_config(self.cfg)

    def _on_rank_zero(self, step: Callable[[], None]) -> None:
        """Run ``step`` on rank 0; its :class:`FdattackError` is raised on every rank (no rank waits forever)."""
        error = None
        if self.fabric.is_global_zero:
            try:
                step()
            except FdattackError as err:
                error = err
        error = self.fabric.broadcast(error)
        if error is not None:
            raise error

    def _run_side_state(self, round_index: int, copy: bool, skip: Sequence[IsolatedAttack] = ()) -> dict:
        """The run's side of the checkpoint of ``round_index``: the protocol's, the attacks' (but ``skip``'s: their workers
        send theirs later) and the RNGs' states; deep copies with ``copy`` (the protocol moves on before it is written)."""
        state = {
            "round": round_index,
            "config_fingerprint": self._fingerprint,
            "protocol": self.protocol.state_dict(),
            "attacks": {a.name: a.state_dict() for a in self.attacks if a not in skip},
            "rng": rng_state(),
            "attack_seed": self._attack_root,
        }
        return deepcopy(state) if copy else state

    def _save_checkpoint(self, state: dict, workers: dict[str, dict], elapsed_before: float, tracker: WandbRun) -> None:
        """Write the checkpoint of ``state`` with the overlapping ``workers``' states, in the attacks' order."""
        saved = {**state["attacks"], **workers}
        self.run_dir.checkpoints.save(
            state["round"],
            {
                **state,
                "attacks": {a.name: saved[a.name] for a in self.attacks},
                "elapsed_s": elapsed_before + time.perf_counter() - self.started,
                "wandb_id": tracker.run_id,
            },
        )


def run(cfg: DictConfig) -> dict[str, float]:
    """Run the experiment described by ``cfg`` (from :func:`fdattack.config.compose`); with ``cfg.seeds``, one replica
    per seed and their aggregate (:func:`fdattack.seeds.run_seeds`).

    Returns:
        The final flat metrics (also written to ``output_dir/metrics.json``): with ``seeds``, their mean, ``_seed_std``
        and 95 % interval across the seeds.

    Raises:
        FdattackError: bad data, refused output directory, corrupt checkpoint, NaN upload.
    """
    if cfg.seeds is not None:
        return run_seeds(cfg, Path(cfg.output_dir) if cfg.output_dir else default_output_dir(cfg), run)
    return Experiment(cfg).run()


def _latest_metrics(output_dir: Path) -> dict[str, float]:
    """Every metric's latest value over the rounds of ``rounds.jsonl`` after round 0 (a resumed run's earlier rounds)."""
    path = output_dir / "rounds.jsonl"
    latest: dict[str, float] = {}
    for line in path.read_text().splitlines() if path.is_file() else []:
        row = json.loads(line)
        if row.pop("round") > 0:
            latest.update(row)
    return latest


def _disabled(cfg: DictConfig) -> DictConfig:
    node = OmegaConf.to_container(cfg.logger.wandb, enum_to_str=True)
    node["mode"] = "disabled"  # type: ignore[index]
    return OmegaConf.create(node)


def _record(run_dir: RunDirectory, tracker: WandbRun, round_index: int, report: Report) -> None:
    """One line in rounds.jsonl and one W&B step (scalars, histograms and images) for a finished round."""
    run_dir.append_round({"round": round_index, **report.metrics})
    tracker.log_round(round_index, report.metrics, report.histograms, report.images)
    for key, image in report.images.items():
        if run_dir.is_writer:
            save_image(image, run_dir.image_path(key.replace("/", "_"), round_index))
    for name, tensors in report.artifacts.items():
        if run_dir.is_writer:
            (run_dir.path / "artifacts").mkdir(exist_ok=True)
            save_checkpoint(run_dir.path / "artifacts" / f"{name}_round_{round_index:04d}.pt", tensors)
