"""``run(cfg)``: build a run from its config and drive it to the end, with records, W&B and resume.

One run is one directory (DESIGN.md): ``config.yaml``, ``rounds.jsonl`` (one line per completed
round), ``metrics.json`` (at the end), ``partition.json``, ``images/``, ``checkpoints/`` and the W&B
files. Under DDP every rank runs the same code; only rank 0 writes files and logs.
"""

from __future__ import annotations

import json
import logging
import time
import traceback
from copy import deepcopy
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

import torch
from omegaconf import DictConfig, OmegaConf
from torchvision.utils import save_image

from fdattack.assembly import assemble, attack_root, default_output_dir, say_what_overlaps, start_isolated_attacks
from fdattack.attacks import Attack
from fdattack.config.validation import check_names
from fdattack.data.federated import FederatedData
from fdattack.engine import LocalTrainer, make_fabric
from fdattack.engine.cluster import check_launcher
from fdattack.errors import CheckpointError, FdattackError, stop_if_terminated
from fdattack.evaluation import Evaluator, Oracle, Report
from fdattack.fd import results as results_module
from fdattack.fd.adversary import Adversary
from fdattack.fd.observer import Observer
from fdattack.fd.orchestrator import RoundOrchestrator
from fdattack.fd.protocols.base import Protocol
from fdattack.fd.threat import AttackerView
from fdattack.isolation import (
    IsolatedAttack,
    MemoryWatch,
    collect_round_ends,
    concurrent_workers,
    in_process_state,
)
from fdattack.isolation.guard import GuardedAttack
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
from fdattack.tracking.exit_record import exit_record
from fdattack.tracking.logs import configure_logging
from fdattack.tracking.machine import machine_info
from fdattack.tracking.run_dir import config_fingerprint
from fdattack.tracking.stopped_attacks import without_stopped_scores

log = logging.getLogger("fdattack")


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
    """A run's loop over what its config built (:attr:`assembly`, :func:`~fdattack.assembly.assemble`): the rounds, their
    records, checkpoints and resume, and the scoring of each attack's results. ``Experiment(cfg).run()`` is :func:`run`.

    The three sides stay apart: the protocol (clients and server), the attacks (built from
    :attr:`view` alone, fed the round records) and the evaluator (the only holder of :attr:`oracle`).

    Building first runs a pre-flight that can fail fast (the W&B mode, registry names, the run
    directory and, on resume, the stored config) and locks the run directory for the whole run; only
    then are the data, the protocol, the attacks and the evaluation classifier built. Building
    launches the DDP ranks when ``trainer.strategy=ddp`` asks for them, so everything after
    construction runs on every rank. :attr:`data`, :attr:`engine`, :attr:`protocol`, :attr:`oracle`, :attr:`view` and
    :attr:`evaluator` are the assembly's.
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
        """What the config builds (:func:`~fdattack.assembly.assemble`); the attacks' list, their adversaries and the
        attacks that query are the loop's from here on (observers join, isolated workers replace the empty list)."""
        self.assembly = assemble(self.cfg, self.fabric, self.output_dir, self.progress)
        self._zygote = self.assembly.zygote
        self.attacks: list[Attack | IsolatedAttack | GuardedAttack] = list(self.assembly.attacks)
        self.adversaries: dict[str, Adversary] = dict(self.assembly.adversaries)
        self._queriers = self.assembly.queriers
        self._attack_root = self.assembly.attack_root
        self._observers: list[Observer] = []  # added by :meth:`observe`, after the attacks

    @property
    def data(self) -> FederatedData:
        return self.assembly.data

    @property
    def engine(self) -> LocalTrainer:
        return self.assembly.engine

    @property
    def protocol(self) -> Protocol:
        return self.assembly.protocol

    @property
    def oracle(self) -> Oracle:
        return self.assembly.oracle

    @property
    def view(self) -> AttackerView:
        return self.assembly.view

    @property
    def evaluator(self) -> Evaluator:
        return self.assembly.evaluator

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
                cfg, self.view, self.protocol, self.assembly.declared, self._attack_root, self.assembly.state_root, self._zygote
            )
            self.attacks = [*workers, *self._observers]  # type: ignore[list-item]
            self._memory_watch = MemoryWatch(workers) if cfg.isolation.memory_mb is not None else None
            if cfg.isolation.overlap:
                say_what_overlaps(workers)
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
        declared = self.assembly.declared.get(name)
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
