"""Offline LiRA against PDA-FD (Shi et al., PoPETs 2025, §3.3): the honest-but-curious server tests, for every target client, every
candidate sample it holds, with reference ("OUT") models it gets without the clients' private data.

Both variants attack the communication phase of one round (``round``; the paper: the first collaborative round).
The target client's outputs on the candidates reach the server through its :class:`~fdattack.fd.adversary.Adversary`,
never through a back door:

- ``insert=query`` (default, the authors' code): the server asks each client for its outputs on the candidates
  while the upload phase is open (``query_chosen_batch``); the candidates are never trained on.
- ``insert=batch``: the server appends the candidates to that round's public batch (``add_public_samples``), so the
  clients upload their outputs on them, and then distil on them, as the paper describes the insertion.

Scores are the standardised s = (φ_t − μ_out) / σ_out in float64 (:func:`~fdattack.functional.lira.offline_lira`),
which ranks as Eq. 6's λ without its float32 saturation; the authors' float32 λ is reported beside it (``paper_*``).

Evasive clients (``protocol.evasive_clients``; Shi et al., PoPETs 2025, §5.5) withhold some outputs; the server sees
which (the answered masks of :class:`~fdattack.fd.record.Reply`), never the withheld values. A reference that withheld
a candidate is left out of that candidate's μ_out and σ_out. The server knows the evasion rule (Kerckhoffs): a client
withholds every sample of its own it is asked about, plus ``protocol.evasion_decoys`` decoys per such sample, so an
answered candidate is never its member and a withheld one is with odds 1 : decoys. A candidate the target withheld
therefore scores above every candidate it answered, a predicted member (:func:`withheld_as_members`; λ = 1), ordered
among the withheld by the score Co-op LiRA's ``countermeasure`` gives it, tied without one. A candidate the target
answered that no reference answered scores lowest (−inf; λ = 0): it has no test, and its answer says it is not the
target's.
"""

from __future__ import annotations

import hashlib
import logging
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch
from torch import Tensor

from fdattack.attacks.base import ATTACKS, Attack, AttackContext
from fdattack.attacks.common import attack_engine, is_communication, new_student
from fdattack.attacks.results import AttackResult, MembershipScores
from fdattack.engine import FitJob, ModelHandle
from fdattack.errors import ConfigError
from fdattack.fd.record import Reply, RoundRecord
from fdattack.fd.threat import AttackerView, Capability, ViewPart
from fdattack.functional.information import kl_divergence
from fdattack.functional.label_distribution import estimate_from_outputs
from fdattack.functional.lira import offline_lira, offline_lira_float32_lambda, scaled_confidence, scaled_confidence_from_probs
from fdattack.knobs import Choice, knob
from fdattack.randomness import derive_seed
from fdattack.vocabulary import PayloadKind

log = logging.getLogger(__name__)


class InsertMode(Choice):
    query = "query"
    batch = "batch"


@dataclass
class MembershipSettings:
    """What every membership attack on an upload phase shares (LiRA's and RMIA's variants)."""

    round: int = knob(1, "the communication round whose upload phase is attacked (the paper: 1, the first collaborative round)", ge=1)
    insert: InsertMode = knob(
        InsertMode.query,
        "how the server gets the targets' outputs on the candidates: query (asks each client while the upload phase is open; never "
        "trained on, the authors' code) | batch (appends them to that round's public batch; the clients then distil on them)",
    )


@dataclass
class LiRASettings(MembershipSettings):
    global_variance: bool = knob(
        False, "one sigma pooled over all candidates (Carlini et al.'s option, steadier with few references) instead of the per-sample std"
    )


@dataclass(frozen=True)
class Collected:
    """What the server received in the attacked upload phase.

    Attributes:
        rows: (N,) the round's public rows S_t.
        kind: ``logits`` or ``probs``, what the clients send.
        public: client -> its upload on ``rows``, (N, M) outputs and the rows it answered.
        candidates: client -> its (C, M) outputs on the candidates and the candidates it answered.
        neighbours: client -> its outputs on the candidates' neighbours (C·n, M), candidate-major (Co-op's
            ``countermeasure=neighbours``), or None.
    """

    rows: Tensor
    kind: PayloadKind
    public: dict[int, Reply]
    candidates: dict[int, Reply]
    neighbours: Optional[dict[int, Reply]] = None


def confidences(outputs: Tensor, kind: PayloadKind, labels: Tensor) -> Tensor:
    """φ = log(p_y / (1 − p_y)) (Eq. 5) of outputs (..., C, M) on labeled candidates: exact from logits, clamped from probabilities."""
    return scaled_confidence(outputs, labels) if kind == "logits" else scaled_confidence_from_probs(outputs, labels)


class LiRAAttack(Attack, ABC):
    """What both variants share: the candidates' outputs at the attacked upload phase, and the offline-LiRA scores."""

    Settings = LiRASettings
    needs = frozenset({Capability.output_uploads})
    produces = frozenset({MembershipScores})
    reads = frozenset({ViewPart.candidates, ViewPart.public})  # the public rows: the students' and shadow targets' training data

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
            sent = upload.reply()
            public[k] = Reply(sent.outputs[:n], sent.answered[:n])
            if self.settings.insert == InsertMode.batch:
                answers[k] = Reply(sent.outputs[start : start + c], sent.answered[start : start + c])
            else:
                assert self.context.adversary is not None
                answers[k] = self.context.adversary.query(k, self.candidates.images)
        self.collected = Collected(record.batch.rows.clone(), kind, public, answers, self.query_neighbours(sorted(answers)))  # type: ignore[arg-type]

    def query_neighbours(self, clients: list[int]) -> Optional[dict[int, Reply]]:
        """Every client's outputs on the candidates' neighbours, asked while the upload phase is open; None = not needed."""
        return None

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
        target = {k: confidences(r.outputs, collected.kind, self.candidates.labels) for k, r in collected.candidates.items()}
        return self.score(round, collected, target, {k: r.answered for k, r in collected.candidates.items()})

    @abstractmethod
    def score(self, round: int, collected: Collected, target: dict[int, Tensor], answered: dict[int, Tensor]) -> list[AttackResult]:
        """The variant's membership scores, from every client's φ (C,) on the candidates and which it answered (C,)."""

    def lira(
        self,
        target: Tensor,
        references: Tensor,
        answered: Optional[Tensor] = None,
        reference_answered: Optional[Tensor] = None,
        withheld: Optional[Tensor] = None,
    ) -> tuple[Tensor, Optional[Tensor]]:
        """(s, the paper's score or None) of one target's φ (C,) against its references' φ (K, C), by :meth:`statistic`.

        Args:
            answered: (C,) the candidates ``target`` has a φ for (None = all); the others have no score of their own.
            reference_answered: (K, C) the references' answers; each candidate is tested against those that answered.
            withheld: (C,) the candidates the target client refused to answer (None = those not ``answered``): predicted
                members (:func:`withheld_as_members`; a paper score of 1). A candidate not withheld with no φ or no
                reference scores −inf (a paper score of 0).
        """
        untestable = torch.zeros(target.shape, dtype=torch.bool) if answered is None else ~answered
        if reference_answered is not None:
            untestable |= ~reference_answered.any(dim=0)
        if withheld is None:
            withheld = torch.zeros_like(untestable) if answered is None else ~answered
        s, paper = self.statistic(target, references, reference_answered, ~untestable)
        s = withheld_as_members(s.masked_fill(untestable, float("-inf")), withheld)
        return s, None if paper is None else paper.masked_fill(untestable, 0.0).masked_fill(withheld, 1.0)

    def statistic(
        self, target: Tensor, references: Tensor, reference_answered: Optional[Tensor], testable: Tensor
    ) -> tuple[Tensor, Optional[Tensor]]:
        """Offline LiRA (Eq. 6): the standardised s and the authors' float32 λ of every candidate (``testable``: the
        candidates with a φ of the target and of a reference; the others' values are replaced)."""
        s = offline_lira(target, references, self.settings.global_variance, reference_answered)
        return s, offline_lira_float32_lambda(target, references, reference_answered)


def withheld_as_members(scores: Tensor, withheld: Tensor) -> Tensor:
    """Membership scores (C,) in which every ``withheld`` (C,) candidate ranks above every other, a predicted member.

    An evasive client withholds each of its samples it is asked about and decoys beside them, so to a server that
    knows the rule an answered candidate is not the client's and a withheld one may be. Withheld candidates keep the
    order of their finite ``scores`` (a countermeasure's) above the others' highest finite score; one without a finite
    score ties at +inf. Only the ranks mean anything (the metrics rank), in float64.
    """
    s = scores.double().clone()
    others = s[~withheld]
    others = others[others.isfinite()]
    floor = float(others.max()) if len(others) else 0.0
    own = s[withheld]
    scored = own.isfinite()
    lifted = torch.full_like(own, float("inf"))
    if scored.any():
        lifted[scored] = own[scored] - own[scored].min() + floor + 1.0
    s[withheld] = lifted
    return s


class Countermeasure(Choice):
    none = "none"
    shadow_target = "shadow_target"
    neighbours = "neighbours"


@dataclass
class CoopKnobs:
    """Co-op's choice of references among the other clients, and its countermeasures to evasion."""

    beta: float = knob(0.1, "a client is a reference when KL(p^_target || p^_client) of their LDIA estimates is below beta", gt=0)
    min_references: int = knob(
        3, "fewest references: where fewer clients pass beta, the ones with the smallest KL are taken (counted in fallback_clients)", ge=2
    )
    countermeasure: Countermeasure = knob(
        Countermeasure.none,
        "against evasive clients (Shi et al., §5.5); under each, a candidate the target withheld ranks above every one it answered, a "
        "predicted member (the server knows the evasion rule: answered rows are never the client's): none (the withheld tie) | "
        "shadow_target (a student distilled from the target's answered public rows scores every candidate in its place; it orders "
        "the withheld) | neighbours (the target and the references are queried on noisy neighbours of every candidate; phi averaged "
        "over them orders the withheld)",
    )
    shadow_epochs: int = knob(20, "countermeasure=shadow_target: the shadow's training epochs (as the distillation students)", ge=1)
    shadow_lr: float = knob(1e-3, "countermeasure=shadow_target: the shadow's Adam learning rate", gt=0)
    shadow_batch_size: int = knob(64, "countermeasure=shadow_target: the shadow's mini-batch size", ge=1)
    neighbours: int = knob(16, "countermeasure=neighbours: noisy neighbours queried per candidate", ge=1)
    neighbour_std: float = knob(0.3, "countermeasure=neighbours: std of the Gaussian noise added to each pixel (images in [-1, 1])", gt=0)
    neighbour_clip: float = knob(
        0.7, "countermeasure=neighbours: the noise is clipped to +-neighbour_clip per pixel, then images to [-1, 1]", gt=0
    )


@dataclass
class CoopSettings(CoopKnobs, LiRASettings):
    pass


def neighbours_of(images: Tensor, count: int, std: float, clip: float, generator: torch.Generator) -> Tensor:
    """(C·count, ...) neighbours of images (C, ...) in [-1, 1]: each plus Gaussian noise of ``std`` clipped to ±``clip``
    per element, clamped to [-1, 1]; candidate-major (the neighbours of image c are rows c·count .. c·count + count − 1)."""
    noise = torch.randn((len(images), count, *images.shape[1:]), generator=generator) * std
    return (images.unsqueeze(1) + noise.clamp(-clip, clip)).clamp(-1, 1).flatten(0, 1)


@ATTACKS.register("lira_coop")
class CoopLiRAAttack(LiRAAttack):
    """Co-op LiRA (§3.3.1): the other clients whose LDIA estimate is within KL β of the target's are its references.

    Reports ``lira_coop`` (β references, with a fallback not in the paper to the ``min_references`` nearest) and ``lira_coop_all``
    (every other client, as the authors' code and Table 4). LDIA reads only the public rows each client answered.

    Against evasive clients (§5.5, ``countermeasure``), a candidate the target withheld ranks above every one it
    answered (:func:`withheld_as_members`); the countermeasure orders the withheld among themselves (``none`` ties them):

    - ``shadow_target`` (countermeasure 1): one student per target, distilled (as Distillation-based LiRA's, all in
      one ``fit_many``) from the target's outputs on the round's public rows it answered, never on a candidate, scores
      **every** candidate in the target's place: under [D] the target withholds all its members, so only the shadow
      can score them, and scoring the answered candidates with the target itself would mix two models' scales, a gap
      the test would read as membership. The other clients stay the references.
    - ``neighbours`` (countermeasure 2, [D]'s recipe): ``neighbours`` noisy copies of every candidate go to every
      client through the :class:`~fdattack.fd.adversary.Adversary` (counted) while the upload phase is open; each
      model's φ is averaged over the neighbours it answered, for every candidate, then tested as usual.
    """

    name = "lira_coop"
    Settings = CoopSettings
    min_clients = (3, "a target and the other clients as its references, at least two to fit a Gaussian to")

    @classmethod
    def required(cls, settings: CoopSettings) -> frozenset[Capability]:
        extra = (
            {Capability.query_chosen_batch}
            if settings.countermeasure == Countermeasure.neighbours
            else {Capability.public_data}
            if settings.countermeasure == Countermeasure.shadow_target
            else set()
        )
        return super().required(settings) | extra

    def __init__(self, view: AttackerView, settings: CoopSettings, context: AttackContext) -> None:
        super().__init__(view, settings, context)
        fewest, why = self.min_clients
        if view.num_clients < fewest:  # the config check refuses it first; this guards direct use
            raise ConfigError(f"attack lira_coop needs at least {fewest} clients ({why}); there are {view.num_clients}")
        if settings.countermeasure == Countermeasure.shadow_target:
            if view.architecture is None:
                raise ConfigError(
                    "attack.lira_coop.countermeasure=shadow_target copies the clients' shared architecture, and these clients have several"
                )
            self.engine = attack_engine(context, settings.shadow_batch_size)

    def query_neighbours(self, clients: list[int]) -> Optional[dict[int, Reply]]:
        s = self.settings
        if s.countermeasure != Countermeasure.neighbours:
            return None
        assert self.context.adversary is not None
        generator = torch.Generator().manual_seed(derive_seed(self.context.seed, self.name, s.round, "neighbours"))
        images = neighbours_of(self.candidates.images, s.neighbours, s.neighbour_std, s.neighbour_clip, generator)
        return {k: self.context.adversary.query(k, images) for k in clients}

    def score(self, round: int, collected: Collected, target: dict[int, Tensor], answered: dict[int, Tensor]) -> list[AttackResult]:
        s = self.settings
        clients = tuple(sorted(target))
        estimates = {k: estimate_from_outputs(r.outputs[r.answered], collected.kind) for k, r in collected.public.items()}
        withheld = {k: ~answered[k] for k in clients}
        fraction = float(np.mean([float(withheld[k].float().mean()) for k in clients]))
        if collected.neighbours is not None:
            target, answered = self._neighbour_confidences(collected)
        tested, tested_answered = target, answered
        if s.countermeasure == Countermeasure.shadow_target:
            tested = self._shadow_confidences(round, collected)
            tested_answered = {n: torch.ones_like(answered[n]) for n in clients}
        selected, everyone = [], []
        counts, fallbacks = [], 0
        for n in clients:
            others = [k for k in clients if k != n]
            distance = {k: float(kl_divergence(estimates[n], estimates[k])) for k in others}
            references = [k for k in others if distance[k] < s.beta]
            if len(references) < s.min_references:
                references, fallbacks = sorted(others, key=distance.__getitem__)[: s.min_references], fallbacks + 1
            counts.append(len(references))
            for scores, group in ((selected, references), (everyone, others)):
                scores.append(
                    self.lira(
                        tested[n],
                        torch.stack([target[k] for k in group]),
                        tested_answered[n],
                        torch.stack([answered[k] for k in group]),
                        withheld[n],
                    )
                )
        details = {"references_mean": float(np.mean(counts)), "fallback_clients": float(fallbacks), "withheld_fraction": fraction}
        return [_scores(clients, selected, None, details), _scores(clients, everyone, f"{self.name}_all")]

    def _neighbour_confidences(self, collected: Collected) -> tuple[dict[int, Tensor], dict[int, Tensor]]:
        """Every client's φ (C,) averaged over the neighbours it answered, and the candidates with at least one answer."""
        assert collected.neighbours is not None
        labels = self.candidates.labels.repeat_interleave(self.settings.neighbours)
        phi, answered = {}, {}
        for k, reply in collected.neighbours.items():
            values = confidences(reply.outputs, collected.kind, labels).view(len(self.candidates), -1)
            weight = reply.answered.view(len(self.candidates), -1).double()
            phi[k] = (values * weight).sum(dim=1) / weight.sum(dim=1).clamp_min(1)
            answered[k] = weight.sum(dim=1) > 0
        return phi, answered

    def _shadow_confidences(self, round: int, collected: Collected) -> dict[int, Tensor]:
        """φ (C,) on the candidates of each target's shadow, distilled from the target's answered public rows."""
        s, view = self.settings, self.view
        assert view.public is not None and view.architecture is not None
        handles, jobs = [], []
        for n, reply in sorted(collected.public.items()):
            loss, teacher = student_targets(collected.kind, False, reply.outputs[reply.answered])
            handle = new_student(
                self.engine,
                f"{self.name}_client{n}_shadow",
                view.architecture,
                view,
                loss,
                s.shadow_lr,
                derive_seed(self.context.seed, self.name, round, n, "shadow_init"),
            )
            handles.append(handle)
            jobs.append(
                FitJob(
                    handle,
                    view.public.subset(collected.rows[reply.answered]),
                    s.shadow_epochs,
                    handle.module.objective,
                    derive_seed(self.context.seed, self.name, round, n, "shadow"),
                    targets=teacher,
                )
            )
        log.info("%s: distilling a shadow target for each of %d clients (round %d)", self.name, len(jobs), round)
        self.engine.fit_many(jobs)
        logits = self.engine.predict_many(handles, self.candidates.images)
        for handle in handles:
            self.engine.release(handle)
        return {n: confidences(logits[i], "logits", self.candidates.labels) for i, n in enumerate(sorted(collected.public))}


def student_targets(kind: PayloadKind, logprob_matching: bool, teacher: Tensor) -> tuple[str, Tensor]:
    """A student's loss and soft targets for a teacher's uploads (§3.3.2, which gives no loss for probabilities): L1 to
    logits, KL to probabilities, or with ``logprob_matching`` L1 to log-probabilities as logits."""
    if kind != "probs":
        return "l1", teacher
    return ("l1", teacher.clamp_min(1e-12).log()) if logprob_matching else ("kl", teacher)


@dataclass
class DistillKnobs:
    """The distillation students that stand in for reference models."""

    students: int = knob(32, "K, students distilled from each target client (the paper: 32)", ge=2)
    fraction: float = knob(0.8, "each student's random share of the round's public rows, drawn per student", gt=0, le=1)
    epochs: int = knob(20, "student training epochs (the authors' code: 20)", ge=1)
    lr: float = knob(1e-3, "students' Adam learning rate", gt=0)
    batch_size: int = knob(64, "students' mini-batch size", ge=1)
    student_model: Optional[str] = knob(
        None, "students' classifier registry name; null = the clients' shared architecture (the paper's assumption)"
    )
    logprob_matching: bool = knob(
        False, "probability uploads (Cronus): distil L1 to log p as logits instead of KL (an option beyond the paper)"
    )


@dataclass
class DistillSettings(DistillKnobs, LiRASettings):
    pass


@ATTACKS.register("lira_distill")
class DistillLiRAAttack(LiRAAttack):
    """Distillation-based LiRA (§3.3.2): K students distilled from each target's uploads on a random ``fraction`` of
    the round's public rows are its references.

    Every student of every target trains in one :meth:`~fdattack.engine.trainer.LocalTrainer.fit_many` call, so the
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
            raise ConfigError(
                "attack.lira_distill.student_model is null and the clients have several architectures; name the students' classifier"
            )
        self.engine = attack_engine(context, settings.batch_size)

    def score(self, round: int, collected: Collected, target: dict[int, Tensor], answered: dict[int, Tensor]) -> list[AttackResult]:
        clients = tuple(sorted(target))
        students = self.trained_students(round, collected)
        scores = []
        logits = self.engine.predict_many([h for n in clients for h in students[n]], self.candidates.images)
        k = self.settings.students
        for i, n in enumerate(clients):
            references = confidences(logits[i * k : (i + 1) * k], "logits", self.candidates.labels)
            scores.append(self.lira(target[n], references, answered[n]))
        for handles in students.values():
            for handle in handles:
                self.engine.release(handle)
        return [_scores(clients, scores)]

    def trained_students(self, round: int, collected: Collected) -> dict[int, list[ModelHandle]]:
        """Every target's K students, trained on the public rows it answered (or restored from the run directory's cache)."""
        s, view = self.settings, self.view
        assert view.public is not None and self.architecture is not None
        students: dict[int, list[ModelHandle]] = {}
        jobs: list[FitJob] = []
        fresh: dict[int, str] = {}
        for n, reply in sorted(collected.public.items()):
            rows, teacher = collected.rows[reply.answered], reply.outputs[reply.answered]
            loss, targets = student_targets(collected.kind, s.logprob_matching, teacher)
            cache = self._cache_key(round, n, rows, teacher, loss)
            saved = self.context.store.load_artifact(cache)
            students[n] = []
            for k in range(s.students):
                handle = new_student(
                    self.engine,
                    f"{self.name}_client{n}_student{k}",
                    self.architecture,
                    view,
                    loss,
                    s.lr,
                    derive_seed(self.context.seed, self.name, round, n, k, "init"),
                    None if saved is None else saved[k],
                )
                students[n].append(handle)
                if saved is None:
                    rng = np.random.default_rng(derive_seed(self.context.seed, self.name, round, n, k, "subset"))
                    share = torch.as_tensor(rng.permutation(len(rows))[: max(1, int(s.fraction * len(rows) + 0.5))])
                    jobs.append(
                        FitJob(
                            handle,
                            view.public.subset(rows[share]),
                            s.epochs,
                            handle.module.objective,
                            derive_seed(self.context.seed, self.name, round, n, k),
                            targets=targets[share],
                        )
                    )
            if saved is None:
                fresh[n] = cache
        if jobs:
            log.info("%s: distilling %d students for each of %d clients (round %d)", self.name, s.students, len(fresh), round)
            self.engine.fit_many(jobs)
        for n, cache in fresh.items():
            self.context.store.save_artifact(cache, [h.module.state_dict() for h in students[n]])
        return students

    def _cache_key(self, round: int, client: int, rows: Tensor, teacher: Tensor, loss: str) -> str:
        """The store key of client's students of ``round``, named by everything they depend on."""
        digest = hashlib.blake2b(repr((self.context.seed, self.settings, self.architecture, loss)).encode(), digest_size=8)
        digest.update(rows.numpy().tobytes())
        digest.update(teacher.float().contiguous().numpy().tobytes())
        return f"students/round_{round:04d}_client_{client}_{digest.hexdigest()}"


def _scores(
    clients: tuple[int, ...],
    per_client: list[tuple[Tensor, Optional[Tensor]]],
    name: str | None = None,
    details: dict[str, float] | None = None,
) -> MembershipScores:
    papers = [paper for _, paper in per_client]
    paper = None if any(p is None for p in papers) else torch.stack(papers)  # type: ignore[arg-type]
    return MembershipScores(clients, torch.stack([s for s, _ in per_client]), name, paper, details or {})
