"""Offline LiRA against PDA-FD (pdafd.md §6): the honest-but-curious server tests, for every target client, every
candidate sample it holds, with reference ("OUT") models it gets without the clients' private data.

Both variants attack the communication phase of one round (``round``; the paper: the first collaborative round).
The target client's outputs on the candidates reach the server through its :class:`~fdattack.fd.adversary.Adversary`,
never through a back door:

- ``insert=query`` (default, the authors' code, A16): the server asks each client for its outputs on the candidates
  while the upload phase is open (``query_chosen_batch``); the candidates are never trained on.
- ``insert=batch``: the server appends the candidates to that round's public batch (``add_public_samples``), so the
  clients upload their outputs on them, and then distil on them, as the paper describes the insertion.

Scores are the standardised s = (φ_t − μ_out) / σ_out in float64 (:func:`~fdattack.functional.lira.offline_lira`),
which ranks as Eq. 6's λ without its float32 saturation; the authors' float32 λ is reported beside it (``paper_*``).
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import torch
from torch import Tensor

from fdattack.attacks.base import ATTACKS, Attack, AttackContext
from fdattack.attacks.ldia import is_communication
from fdattack.attacks.results import AttackResult, MembershipScores
from fdattack.config.knobs import Choice, knob
from fdattack.errors import ConfigError
from fdattack.fd.engine import FitJob, LocalTrainer, ModelHandle, default_engine, derive_seed
from fdattack.fd.record import PayloadKind, RoundRecord
from fdattack.fd.threat import AttackerView, Capability
from fdattack.functional.information import kl_divergence
from fdattack.functional.label_distribution import estimate_from_outputs
from fdattack.functional.lira import offline_lira, offline_lira_float32_lambda, scaled_confidence, scaled_confidence_from_probs
from fdattack.lit.student import DistillationStudent

log = logging.getLogger(__name__)


class InsertMode(Choice):
    query = "query"
    batch = "batch"


@dataclass
class LiRASettings:
    round: int = knob(1, "the communication round whose upload phase is attacked (the paper: 1, the first collaborative round)", ge=1)
    insert: InsertMode = knob(InsertMode.query, "how the server gets the targets' outputs on the candidates: query (asks each client while the upload phase is open; never trained on, the authors' code) | batch (appends them to that round's public batch; the clients then distil on them)")
    global_variance: bool = knob(False, "one sigma pooled over all candidates (Carlini et al.'s option, steadier with few references) instead of the per-sample std")


@dataclass(frozen=True)
class Collected:
    """What the server received in the attacked upload phase.

    Attributes:
        rows: (N,) the round's public rows S_t.
        kind: ``logits`` or ``probs``, what the clients send.
        public: client -> (N, M) its upload on ``rows``.
        candidates: client -> (C, M) its outputs on the candidates.
    """

    rows: Tensor
    kind: PayloadKind
    public: dict[int, Tensor]
    candidates: dict[int, Tensor]


def confidences(outputs: Tensor, kind: PayloadKind, labels: Tensor) -> Tensor:
    """φ = log(p_y / (1 − p_y)) (Eq. 5) of outputs (..., C, M) on labeled candidates: exact from logits, clamped from probabilities."""
    return scaled_confidence(outputs, labels) if kind == "logits" else scaled_confidence_from_probs(outputs, labels)


class LiRAAttack(Attack, ABC):
    """What both variants share: the candidates' outputs at the attacked upload phase, and the offline-LiRA scores."""

    Settings = LiRASettings
    needs = frozenset({Capability.output_uploads})
    produces = frozenset({MembershipScores})
    wants_candidates = True

    @classmethod
    def required(cls, settings: LiRASettings) -> frozenset[Capability]:
        power = Capability.query_chosen_batch if settings.insert == InsertMode.query else Capability.add_public_samples
        return cls.needs | {power}

    def __init__(self, view: AttackerView, settings: LiRASettings, context: AttackContext) -> None:
        super().__init__(view, settings, context)
        if view.candidates is None:
            raise ConfigError(f"attack {self.name} needs membership candidates, which this run did not build")
        self.candidates = view.candidates
        self.collected: Optional[Collected] = None
        if settings.round == 1:
            self._insert_candidates()

    def _insert_candidates(self) -> None:
        """``insert=batch``: queue the candidates for the next round's public batch."""
        if self.settings.insert == InsertMode.batch:
            assert self.context.adversary is not None
            self.context.adversary.add_public_samples(self.candidates.images)

    def on_record(self, record: RoundRecord) -> None:
        if record.round != self.settings.round or not is_communication(record):
            return
        assert record.batch is not None
        n, c = len(record.batch.rows), len(self.candidates)
        kind = next(iter(record.uploads.values())).kind
        public, answers = {}, {}
        start = n + self._added_at(record.batch.added) if self.settings.insert == InsertMode.batch else 0
        for k, upload in sorted(record.uploads.items()):
            assert upload.outputs is not None
            public[k] = upload.outputs[:n]
            if self.settings.insert == InsertMode.batch:
                answers[k] = upload.outputs[start : start + c]
            else:
                assert self.context.adversary is not None
                answers[k] = self.context.adversary.query(k, self.candidates.images)
        self.collected = Collected(record.batch.rows.clone(), kind, public, answers)  # type: ignore[arg-type]

    def _added_at(self, added: Tensor | None) -> int:
        """Where the candidates start among the images the server added to the batch (other attacks may add theirs)."""
        c = len(self.candidates)
        first = self.candidates.images[:1]
        for start in range(0, 0 if added is None else len(added) - c + 1):
            if torch.equal(added[start : start + 1], first) and torch.equal(added[start : start + c], self.candidates.images):  # type: ignore[index]
                return start
        raise RuntimeError(f"attack {self.name}: the candidates it added are not in round {self.settings.round}'s public batch")

    def on_round_end(self, round: int) -> list[AttackResult]:
        if round + 1 == self.settings.round:
            self._insert_candidates()
        collected, self.collected = self.collected, None
        if round != self.settings.round or collected is None:
            return []
        target = {k: confidences(out, collected.kind, self.candidates.labels) for k, out in collected.candidates.items()}
        return self.score(round, collected, target)

    @abstractmethod
    def score(self, round: int, collected: Collected, target: dict[int, Tensor]) -> list[AttackResult]:
        """The variant's membership scores, from every client's φ (C,) on the candidates."""

    def lira(self, target: Tensor, references: Tensor) -> tuple[Tensor, Tensor]:
        """(s, float32 λ) of one target's φ (C,) against its references' φ (K, C)."""
        return offline_lira(target, references, self.settings.global_variance), offline_lira_float32_lambda(target, references)


@dataclass
class CoopSettings(LiRASettings):
    beta: float = knob(0.1, "a client is a reference when KL(p^_target || p^_client) of their LDIA estimates is below beta", gt=0)
    min_references: int = knob(3, "fewest references: where fewer clients pass beta, the ones with the smallest KL are taken (counted in fallback_clients)", ge=2)


@ATTACKS.register("lira_coop")
class CoopLiRAAttack(LiRAAttack):
    """Co-op LiRA (§6.3): the other clients whose LDIA estimate is within KL β of the target's are its references.

    Reports ``lira_coop`` (β references, A13's fallback to the ``min_references`` nearest) and ``lira_coop_all``
    (every other client, as the authors' code and Table 4).
    """

    name = "lira_coop"
    Settings = CoopSettings

    def __init__(self, view: AttackerView, settings: CoopSettings, context: AttackContext) -> None:
        super().__init__(view, settings, context)
        if view.num_clients < 3:
            raise ConfigError(f"attack lira_coop takes the other clients as references and needs at least 3 clients; protocol.num_clients={view.num_clients}")

    def score(self, round: int, collected: Collected, target: dict[int, Tensor]) -> list[AttackResult]:
        s = self.settings
        clients = tuple(sorted(target))
        estimates = {k: estimate_from_outputs(out, collected.kind) for k, out in collected.public.items()}
        selected, everyone = [], []
        counts, fallbacks = [], 0
        for n in clients:
            others = [k for k in clients if k != n]
            distance = {k: float(kl_divergence(estimates[n], estimates[k])) for k in others}
            references = [k for k in others if distance[k] < s.beta]
            if len(references) < s.min_references:
                references, fallbacks = sorted(others, key=distance.__getitem__)[: s.min_references], fallbacks + 1
            counts.append(len(references))
            selected.append(self.lira(target[n], torch.stack([target[k] for k in references])))
            everyone.append(self.lira(target[n], torch.stack([target[k] for k in others])))
        details = {"references_mean": float(np.mean(counts)), "fallback_clients": float(fallbacks)}
        return [_scores(clients, selected, None, details), _scores(clients, everyone, f"{self.name}_all")]


@dataclass
class DistillSettings(LiRASettings):
    students: int = knob(32, "K, students distilled from each target client (the paper: 32)", ge=2)
    fraction: float = knob(0.8, "each student's random share of the round's public rows, drawn per student", gt=0, le=1)
    epochs: int = knob(20, "student training epochs (the authors' code: 20)", ge=1)
    lr: float = knob(1e-3, "students' Adam learning rate", gt=0)
    batch_size: int = knob(64, "students' mini-batch size", ge=1)
    student_model: Optional[str] = knob(None, "students' classifier registry name; null = the clients' shared architecture (the paper's assumption)")
    logprob_matching: bool = knob(False, "probability uploads (Cronus): distil L1 to log p as logits instead of KL (stronger than the paper, A19)")


@ATTACKS.register("lira_distill")
class DistillLiRAAttack(LiRAAttack):
    """Distillation-based LiRA (§6.4): K students distilled from each target's uploads on a random ``fraction`` of
    the round's public rows are its references.

    Every student of every target trains in one :meth:`~fdattack.fd.engine.LocalTrainer.fit_many` call, so the
    engine's vectorised path trains them as one batch. With a run directory the trained students are kept under
    ``attack_state/lira_distill/students/`` and reused when the round is run again (resume).
    """

    name = "lira_distill"
    Settings = DistillSettings
    needs = LiRAAttack.needs | {Capability.public_data}

    def __init__(self, view: AttackerView, settings: DistillSettings, context: AttackContext) -> None:
        super().__init__(view, settings, context)
        self.architecture = settings.student_model or view.architecture
        if self.architecture is None:
            raise ConfigError("attack.lira_distill.student_model is null and the clients have several architectures; name the students' classifier")
        self.engine = LocalTrainer(context.engine.fabric, settings.batch_size, vectorise=context.engine.vectorise) \
            if context.engine is not None else default_engine(settings.batch_size)

    def score(self, round: int, collected: Collected, target: dict[int, Tensor]) -> list[AttackResult]:
        clients = tuple(sorted(target))
        students = self.trained_students(round, collected)
        scores = []
        logits = self.engine.predict_many([h for n in clients for h in students[n]], self.candidates.images)
        k = self.settings.students
        for i, n in enumerate(clients):
            references = confidences(logits[i * k : (i + 1) * k], "logits", self.candidates.labels)
            scores.append(self.lira(target[n], references))
        for handles in students.values():
            for handle in handles:
                self.engine.release(handle)
        return [_scores(clients, scores)]

    def trained_students(self, round: int, collected: Collected) -> dict[int, list[ModelHandle]]:
        """Every target's K students, trained (or restored from the run directory's cache)."""
        s, view = self.settings, self.view
        assert view.public is not None
        loss = "kl" if collected.kind == "probs" and not s.logprob_matching else "l1"
        c, h, _ = view.image_shape
        students: dict[int, list[ModelHandle]] = {}
        jobs: list[FitJob] = []
        fresh: dict[int, Path | None] = {}
        for n, teacher in sorted(collected.public.items()):
            targets = teacher.clamp_min(1e-12).log() if collected.kind == "probs" and s.logprob_matching else teacher
            cache = self._cache_path(round, n, collected.rows, teacher, loss)
            saved = torch.load(cache, map_location="cpu", weights_only=True) if cache is not None and cache.is_file() else None
            students[n] = []
            for k in range(s.students):
                torch.manual_seed(derive_seed(self.context.seed, self.name, round, n, k, "init"))
                module = DistillationStudent(self.architecture, view.num_classes, loss, s.lr, in_channels=c, image_size=h)
                if saved is not None:
                    module.load_state_dict(saved[k])
                handle = self.engine.setup(f"{self.name}_client{n}_student{k}", module)
                students[n].append(handle)
                if saved is None:
                    rng = np.random.default_rng(derive_seed(self.context.seed, self.name, round, n, k, "subset"))
                    share = torch.as_tensor(rng.permutation(len(collected.rows))[: max(1, int(s.fraction * len(collected.rows) + 0.5))])
                    jobs.append(FitJob(handle, view.public.subset(collected.rows[share]), s.epochs, module.objective,
                                       derive_seed(self.context.seed, self.name, round, n, k), targets=targets[share]))
            if saved is None:
                fresh[n] = cache
        if jobs:
            log.info("%s: distilling %d students for each of %d clients (round %d)", self.name, s.students, len(fresh), round)
            self.engine.fit_many(jobs)
        for n, cache in fresh.items():
            if cache is not None:
                cache.parent.mkdir(parents=True, exist_ok=True)
                torch.save([h.module.state_dict() for h in students[n]], cache)
        return students

    def _cache_path(self, round: int, client: int, rows: Tensor, teacher: Tensor, loss: str) -> Path | None:
        """Where client's students of ``round`` are kept, named by everything they depend on; None without a run directory."""
        directory = self.context.store.directory
        if directory is None:
            return None
        digest = hashlib.blake2b(repr((self.context.seed, self.settings, self.architecture, loss)).encode(), digest_size=8)
        digest.update(rows.numpy().tobytes())
        digest.update(teacher.float().contiguous().numpy().tobytes())
        return directory / "students" / f"round_{round:04d}_client_{client}_{digest.hexdigest()}.pt"


def _scores(clients: tuple[int, ...], per_client: list[tuple[Tensor, Tensor]], name: str | None = None,
            details: dict[str, float] | None = None) -> MembershipScores:
    return MembershipScores(clients, torch.stack([s for s, _ in per_client]), name, torch.stack([lam for _, lam in per_client]), details or {})
