"""Knobs whose effect no other test asserts: each test fails when its knob is ignored.

``attack.tbi.last_client_only``, ``attack.lira_distill.logprob_matching`` and ``attack.lira_distill.student_model`` on
small synthetic views; ``protocol.train_global_model`` (DS-FL), ``protocol.mixed_kd`` (Cronus) and
``protocol.label_weights`` (LabelAvg) on one tiny round of digits.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import Tensor

from fdattack.attacks.base import AttackContext
from fdattack.attacks.lira import Collected, DistillLiRAAttack, DistillSettings
from fdattack.attacks.tbi import TBIAttack, TBISettings
from fdattack.config import compose
from fdattack.data.imageset import ImageSet
from fdattack.engine import FitJob
from fdattack.experiment import Experiment
from fdattack.fd.orchestrator import RoundOrchestrator
from fdattack.fd.record import Reply, RoundRecord, open_query
from fdattack.fd.threat import AttackerView, ThreatModel
from fdattack.lit.objectives import cross_entropy, kl_to_probs, l1_to_logits, mixed_ce_kl
from fdattack.models.classifiers import build_classifier
from tests.conftest import REPO, tiny

J = 6


def _public(n: int = 24) -> ImageSet:
    g = torch.Generator().manual_seed(0)
    return ImageSet.from_images(torch.rand(n, 1, 8, 8, generator=g) * 2 - 1, torch.arange(n) % J)


# ------------------------------------------------------------------------------------------------ TBI
def _tbi_round(last_client_only: bool, logits: dict[int, Tensor]) -> tuple[list[Tensor], Tensor]:
    """One TBI round on a query answering ``logits[k]``: the outputs TBI collected and its reconstructions."""
    threat = ThreatModel("server", "logits", public_labels_known=True, query_rows="public")
    view = AttackerView(threat, "fedmd", _public(), (1, 2), J, (1, 8, 8), has_server_model=False)
    settings = TBISettings(max_width=16, lr=1e-3, epochs_per_round=1, last_client_only=last_client_only)
    attack = TBIAttack(view, settings, AttackContext(seed=0))
    query = open_query(lambda model, rows: logits[model][rows], "tbi", 1, "digest", torch.arange(24), (0, 1), has_server=False)[0]
    attack.on_record(RoundRecord(round=1, phase="digest", protocol="fedmd", participants=(0, 1), attack_point=True, query=query))
    assert attack.collected is not None
    collected = list(attack.collected.outputs)
    (result,) = attack.on_round_end(1)
    return collected, result.images  # type: ignore[attr-defined]


def test_tbi_last_client_only_trains_on_the_last_client_twice_and_ignores_the_first() -> None:
    """The authors' closure bug: every "client" is the last one, so client 0's outputs change nothing."""
    g = torch.Generator().manual_seed(1)
    last = torch.randn(24, J, generator=g)
    first_a, first_b = torch.randn(24, J, generator=g), torch.randn(24, J, generator=g)
    tempered = lambda z: torch.softmax(z / 3.0, dim=-1)  # noqa: E731 - tau = 3 (the default)

    pooled, _ = _tbi_round(False, {0: first_a, 1: last})
    torch.testing.assert_close(pooled, [tempered(first_a), tempered(last)])
    buggy, images_a = _tbi_round(True, {0: first_a, 1: last})
    torch.testing.assert_close(buggy, [tempered(last), tempered(last)])

    _, images_b = _tbi_round(True, {0: first_b, 1: last})
    assert torch.equal(images_a, images_b)
    _, pooled_a = _tbi_round(False, {0: first_a, 1: last})
    _, pooled_b = _tbi_round(False, {0: first_b, 1: last})
    assert not torch.equal(pooled_a, pooled_b)


# ----------------------------------------------------------------------------------------- LiRA distill
def _distill_attack(**knobs: object) -> tuple[DistillLiRAAttack, list[FitJob]]:
    """A distillation-LiRA attacker on a synthetic view whose clients share ``pli_cnn``, with a spy on its engine."""
    threat = ThreatModel("server", "probs", public_labels_known=False)
    public = _public()
    view = AttackerView(threat, "cronus", public, (0,), J, (1, 8, 8), has_server_model=False, candidates=_public(6), architecture="pli_cnn")
    settings = DistillSettings(**{"students": 2, "epochs": 1, "batch_size": 8, **knobs})  # type: ignore[arg-type]
    attack = DistillLiRAAttack(view, settings, AttackContext(seed=0))
    jobs: list[FitJob] = []
    fit_many = attack.engine.fit_many

    def spy(batch):  # type: ignore[no-untyped-def]
        jobs.extend(batch)
        return fit_many(batch)

    attack.engine.fit_many = spy  # type: ignore[method-assign]
    return attack, jobs


def _teacher_probs() -> Collected:
    probs = torch.softmax(torch.randn(24, J, generator=torch.Generator().manual_seed(2)) * 3, dim=-1)
    everything = torch.ones(24, dtype=torch.bool)
    return Collected(torch.arange(24), "probs", {0: Reply(probs, everything)}, {})


@pytest.mark.parametrize("logprob_matching", [False, True])
def test_lira_distill_logprob_matching_fits_students_l1_to_log_probabilities(logprob_matching: bool) -> None:
    """Probability uploads (Cronus): by default each student fits KL to the teacher's probabilities on its share of the
    rows; with ``logprob_matching`` it fits L1 to their logarithms, taken as logits."""
    attack, jobs = _distill_attack(logprob_matching=logprob_matching)
    collected = _teacher_probs()
    students = attack.trained_students(1, collected)
    teacher = collected.public[0].outputs
    assert len(jobs) == 2 and [j.handle for j in jobs] == students[0]
    for job in jobs:
        rows = job.data.source  # the public rows of the student's share (source = row index in the synthetic set)
        assert 0 < len(rows) < 24 and job.targets is not None
        if logprob_matching:
            assert job.handle.module.objective is l1_to_logits
            torch.testing.assert_close(job.targets, teacher[rows].log())
        else:
            assert job.handle.module.objective is kl_to_probs
            torch.testing.assert_close(job.targets, teacher[rows])


@pytest.mark.parametrize(("student_model", "built"), [(None, "pli_cnn"), ("mlp", "mlp")])
def test_lira_distill_student_model_picks_the_students_architecture(student_model: str | None, built: str) -> None:
    """null copies the clients' shared architecture (the view's ``pli_cnn``); a registry name builds that classifier."""
    attack, _ = _distill_attack(student_model=student_model)
    students = attack.trained_students(1, _teacher_probs())[0]
    expected = repr(build_classifier(built, 1, 8, J))
    assert [repr(h.module.net) for h in students] == [expected, expected]
    assert students[0].module(torch.zeros(3, 1, 8, 8)).shape == (3, J)


# -------------------------------------------------------------------------------------------- protocols
class _Records:
    """A probe observer: every record's phase, attack point, uploads and server outputs."""

    name = "records"

    def __init__(self) -> None:
        self.records: list[RoundRecord] = []

    def on_record(self, record: RoundRecord) -> None:
        self.records.append(record)


@pytest.mark.parametrize("train_global_model", [True, False])
def test_dsfl_train_global_model_adds_the_server_model_and_moves_the_attack_point(tmp_path: Path, train_global_model: bool) -> None:
    """On: DS-FL's global model f_0 exists, distils on the ERA labels in ``server_train`` (its weights move) and that
    phase is the attack point, with the server's outputs in its record. Off: no server model, attack point ``aggregate``."""
    cfg = compose(
        REPO / "conf" / "experiment" / "dsfl_digits.yaml",
        tiny(tmp_path, f"protocol.train_global_model={train_global_model}", "protocol.private_epochs=1", "protocol.distill_epochs=1"),
    )
    exp = Experiment(cfg)
    probe = _Records()
    server = exp.protocol.server
    assert (server is not None) is train_global_model and exp.view.has_server_model is train_global_model
    before = None if server is None else {k: v.clone() for k, v in server.module.state_dict().items()}
    RoundOrchestrator(exp.protocol, [probe]).run_round(1)  # type: ignore[list-item]
    phases = [r.phase for r in probe.records]
    points = [r.phase for r in probe.records if r.attack_point]
    if train_global_model:
        assert server is not None and before is not None
        assert phases == ["local_train", "upload", "aggregate", "server_train", "distill"] and points == ["server_train"]
        assert probe.records[3].server_outputs is not None
        assert any(not torch.equal(v, server.module.state_dict()[k]) for k, v in before.items())
    else:
        assert phases == ["local_train", "upload", "aggregate", "distill"] and points == ["aggregate"]
        assert all(r.server_outputs is None for r in probe.records)


@pytest.mark.parametrize("mixed_kd", [False, True])
def test_cronus_mixed_kd_trains_once_on_private_plus_public(tmp_path: Path, mixed_kd: bool) -> None:
    """Off: CE on the private set (``local_train``), then KL on the round's public rows (``distill``). On: no local
    phase; one ``distill`` phase on each client's private rows followed by the public rows, CE where the soft target is
    zero and KL elsewhere (:func:`~fdattack.lit.objectives.mixed_ce_kl`)."""
    cfg = compose(
        REPO / "conf" / "experiment" / "cronus_digits.yaml",
        tiny(
            tmp_path,
            f"protocol.mixed_kd={mixed_kd}",
            "protocol.warmup_private_epochs=0",
            "protocol.private_epochs=1",
            "protocol.kd_epochs=1",
            "protocol.public_per_round=40",
        ),
    )
    exp = Experiment(cfg)
    jobs: list[FitJob] = []
    fit_many = exp.engine.fit_many

    def spy(batch):  # type: ignore[no-untyped-def]
        jobs.extend(batch)
        return fit_many(batch)

    exp.engine.fit_many = spy  # type: ignore[method-assign]
    probe = _Records()
    RoundOrchestrator(exp.protocol, [probe]).run_round(1)  # type: ignore[list-item]
    private = exp.data.split.private
    assert [r.phase for r in probe.records] == ([] if mixed_kd else ["local_train"]) + ["upload", "aggregate", "distill"]
    if mixed_kd:
        assert len(jobs) == 2
        for k, job in enumerate(jobs):
            assert job.objective is mixed_ce_kl and len(job.data) == len(private[k]) + 40
            torch.testing.assert_close(job.data.images[: len(private[k])], private[k].images)
            assert job.targets is not None
            assert (job.targets[: len(private[k])] == 0).all() and torch.allclose(job.targets[len(private[k]) :].sum(-1), torch.ones(40))
    else:
        local, distill = jobs[:2], jobs[2:]
        assert len(distill) == 2
        for k, job in enumerate(local):
            assert job.objective is cross_entropy and job.targets is None
            torch.testing.assert_close(job.data.images, private[k].images)
        for job in distill:
            assert job.objective is kl_to_probs and len(job.data) == 40


@pytest.mark.parametrize("label_weights", ["beta", "ones"])
def test_labelavg_label_weights_are_p_over_p_max_or_ones(tmp_path: Path, label_weights: str) -> None:
    """Each client uploads its top-K labels with weights: ``beta`` is Eq. 10's p / p_max of its own softmax (top weight
    1, the others below 1), ``ones`` plain votes; zeros elsewhere."""
    k = 3
    cfg = compose(
        REPO / "conf" / "experiment" / "labelavg_digits.yaml",
        tiny(
            tmp_path,
            f"protocol.label_weights={label_weights}",
            f"protocol.top_k={k}",
            "protocol.transfer_public_epochs=1",
            "protocol.transfer_private_epochs=1",
            "protocol.revisit_epochs=1",
        ),
    )
    exp = Experiment(cfg)
    probe = _Records()
    clean: dict[int, Tensor] = {}

    class Clean(_Records):  # each client's own softmax on the rows it uploaded for, asked while the upload phase is open
        def on_record(self, record: RoundRecord) -> None:
            if record.phase == "upload":
                for n, upload in record.uploads.items():
                    assert upload.batch is not None
                    rows = exp.data.split.public.subset(upload.batch.rows)
                    clean[n] = torch.softmax(exp.engine.predict(exp.protocol.clients[n], rows), -1)

    RoundOrchestrator(exp.protocol, [probe, Clean()]).run_round(1)  # type: ignore[list-item]
    (upload_record,) = [r for r in probe.records if r.phase == "upload"]
    assert len(clean) == 2
    for n, upload in upload_record.uploads.items():
        sent = upload.outputs
        assert sent is not None
        top = clean[n].topk(k, dim=-1)
        assert ((sent != 0).sum(-1) == k).all()
        weights = sent.gather(-1, top.indices)  # each row's own top-K labels carry the weights
        if label_weights == "ones":
            assert torch.equal(weights, torch.ones_like(weights))
        else:
            torch.testing.assert_close(weights, top.values / top.values[:, :1])
            assert (weights[:, 1:] < 1).all()
