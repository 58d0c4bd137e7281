"""Evasive clients and Co-op LiRA's countermeasures (pdafd.md §6.7): a client withholds exactly its own samples and
``protocol.evasion_decoys`` decoys per sample, on uploads and on queries alike; the server learns only which rows were
withheld and, knowing the rule, scores a withheld candidate as a predicted member; the countermeasures query and train
as specified; bad settings stop with one line."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from fdattack.attacks import ATTACKS, Attack
from fdattack.attacks.lira import CoopLiRAAttack, LiRAAttack, LiRASettings, neighbours_of, withheld_as_members
from fdattack.attacks.results import MembershipScores
from fdattack.config import compose
from fdattack.engine import LocalTrainer, predict_logits
from fdattack.evaluation.membership import MembershipScorer
from fdattack.experiment import Experiment
from fdattack.fd.aggregation import era
from fdattack.fd.evasion import Evasion, image_digests
from fdattack.fd.record import QueryRefusedError, RoundRecord
from fdattack.fd.threat import Capability
from fdattack.functional.membership_metrics import membership_metrics
from fdattack.randomness import derive_seed
from tests.conftest import tiny
from tests.test_bad_input import _one_line

#: DS-FL on digits, 4 clients, one round, every knob small (as tests/test_pdafd_attacks.py)
SMALL = [
    "protocol=dsfl_pdafd",
    "data.split=random",
    "data.partition=dirichlet",
    "data.min_client_size=16",
    "protocol.num_clients=4",
    "protocol.rounds=1",
    "protocol.warmup_private_epochs=2",
    "protocol.private_epochs=1",
    "protocol.distill_epochs=1",
    "protocol.public_per_round=100",
    "evaluation.max_candidates=300",
]


def test_a_client_withholds_its_own_samples_and_as_many_decoys_whatever_the_order() -> None:
    own = torch.arange(3 * 4, dtype=torch.float32).reshape(3, 1, 2, 2)
    others = -1 - torch.arange(5 * 4, dtype=torch.float32).reshape(5, 1, 2, 2)
    evasion = Evasion({0: own}, seed=7)
    request = torch.cat([own[:2], others])  # two of client 0's samples among five others
    withheld = evasion.withheld(0, image_digests(request))
    assert withheld[:2].all() and int(withheld[2:].sum()) == 2  # its two, and two decoys
    order = torch.randperm(len(request), generator=torch.Generator().manual_seed(0))
    assert torch.equal(evasion.withheld(0, image_digests(request[order])), withheld[order])  # the same samples, asked in any order
    assert not evasion.withheld(0, image_digests(others)).any()  # nothing of its own: nothing withheld
    assert not evasion.withheld(1, image_digests(request)).any()  # client 1 is not evasive
    assert evasion.withheld(0, image_digests(torch.cat([own, others[:1]]))).all()  # fewer others than its own: all of them
    assert image_digests(torch.zeros(1, 1, 2, 2)) == image_digests(-torch.zeros(1, 1, 2, 2))  # -0.0 is 0.0
    parts = evasion.withheld_parts(0, [image_digests(others), image_digests(request)])
    assert not parts[:5].any() and torch.equal(parts[5:], withheld)  # decoys stay in the part that holds the members


def test_the_decoy_rate_sets_how_many_others_are_withheld_and_a_higher_rate_adds_to_them() -> None:
    own = torch.arange(2 * 4, dtype=torch.float32).reshape(2, 1, 2, 2)
    others = -1 - torch.arange(7 * 4, dtype=torch.float32).reshape(7, 1, 2, 2)
    request = image_digests(torch.cat([own, others]))
    counts = {0.0: 0, 0.5: 1, 1.0: 2, 2.0: 4, 2.4: 5, 3.0: 6, 9.0: 7, math.inf: 7}  # rate x 2 own, rounded half up, at most 7
    previous = torch.zeros(9, dtype=torch.bool)
    for decoys, count in counts.items():
        withheld = Evasion({0: own}, seed=7, decoys=decoys).withheld(0, request)
        assert withheld[:2].all() and int(withheld[2:].sum()) == count, decoys
        assert not (previous & ~withheld).any()  # the same keys: a higher rate withholds the lower rate's decoys and more
        previous = withheld
    assert not Evasion({0: own}, seed=7, decoys=math.inf).withheld(0, image_digests(others)).any()  # none of its own: nothing


def test_a_withheld_candidate_is_a_predicted_member_tied_with_the_decoys() -> None:
    """3 members, all withheld; of 5 non-members 2 withheld (decoys), one answered with no reference answering it.
    Every member ties with the 2 decoys above the 3 answered non-members: AUC = 1 − k/(2n) = 1 − 2/10 = 0.8; the tie
    gives no ROC point below FPR 2/5, so TPR at 1 % FPR is 0; balanced accuracy ½(1 + 1 − 2/5) = 0.8."""
    attack = SimpleNamespace(settings=LiRASettings())
    attack.statistic = LiRAAttack.statistic.__get__(attack)
    lira = LiRAAttack.lira.__get__(attack)
    target = torch.tensor([9.0, 9.0, 9.0, 9.0, 9.0, 0.5, -1.0, 2.0], dtype=torch.float64)  # withheld rows: zeros sent, φ junk
    references = torch.tensor([[0.0, 0, 0, 0, 0, 0.0, 0.0, 0], [1, 1, 1, 1, 1, 1.0, 0.0, 0], [2, 2, 2, 2, 2, 0.5, 1.0, 0]])
    answered = torch.tensor([0, 0, 0, 0, 0, 1, 1, 1], dtype=torch.bool)
    reference_answered = torch.ones(3, 8, dtype=torch.bool)
    reference_answered[:, 7] = False
    s, lam = lira(target, references, answered, reference_answered)
    assert torch.isposinf(s[:5]).all() and s[7] == -math.inf and torch.isfinite(s[5:7]).all() and s[5] > s[6]
    assert torch.equal(lam[:5], torch.ones(5)) and lam[7] == 0 and 0 < lam[6] < lam[5] < 1
    is_member = torch.tensor([1, 1, 1, 0, 0, 0, 0, 0], dtype=torch.bool)
    metrics = membership_metrics(is_member, s)
    assert metrics["auc"] == pytest.approx(0.8) and metrics["tpr_at_1pct_fpr"] == 0.0 and metrics["balanced_accuracy"] == pytest.approx(0.8)
    everything, _ = lira(target, references, torch.zeros(8, dtype=torch.bool))  # a client that withholds every candidate
    assert membership_metrics(is_member, everything)["auc"] == 0.5  # the mask tells nothing: chance
    # a countermeasure's scores order the withheld among themselves, all above the answered ones
    scores = torch.tensor([0.3, -1.0, 2.0, 5.0, 0.1, -math.inf, 1.0], dtype=torch.float64)
    lifted = withheld_as_members(scores, torch.tensor([1, 1, 0, 0, 1, 0, 0], dtype=torch.bool))
    torch.testing.assert_close(lifted, torch.tensor([7.3, 6.0, 2.0, 5.0, 7.1, -math.inf, 1.0], dtype=torch.float64))


@dataclass
class ProbeSettings:
    pass


class EvasionProbe(Attack):
    """Round 1: queries client 0 on ``request`` and appends ``request`` to round 2's batch; keeps what it receives."""

    name = "evasion_probe"
    Settings = ProbeSettings
    needs = frozenset({Capability.output_uploads, Capability.add_public_samples, Capability.query_chosen_batch})
    request: torch.Tensor = torch.empty(0)
    seen: dict[str, object] = {}

    def on_record(self, record: RoundRecord) -> None:
        adversary = self.context.adversary
        assert adversary is not None
        if record.phase != "upload":
            if record.round == 2 and record.phase == "aggregate":
                EvasionProbe.seen["aggregate"] = record.aggregate
            return
        if record.round == 1:
            EvasionProbe.seen["reply0"] = adversary.query(0, self.request)
            EvasionProbe.seen["reply1"] = adversary.query(1, self.request)
            adversary.add_public_samples(self.request)
        else:
            EvasionProbe.seen["uploads"] = dict(record.uploads)
            EvasionProbe.seen["rows"] = len(record.batch.rows)  # type: ignore[union-attr]


def test_the_evasive_client_withholds_the_same_rows_on_queries_and_uploads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ATTACKS, "_items", {**ATTACKS._items, "evasion_probe": EvasionProbe})
    exp = Experiment(
        compose(
            None,
            tiny(
                tmp_path,
                "protocol=dsfl",
                "protocol.evasive_clients=[0]",
                "attacks=[evasion_probe]",
                "evaluation.confidence_gap.enabled=false",
                "evaluation.classifier=null",
            ),
        )
    )
    split = exp.data.split
    EvasionProbe.request = torch.cat([split.private[0].images[:3], split.test.images[:4], split.private[1].images[:2]])
    EvasionProbe.seen = {}
    truth = {}
    original = exp.protocol.open_phase

    def open_phase(ctx, phase):  # type: ignore[no-untyped-def]
        if ctx.round == 1 and phase == "upload":
            truth["logits"] = predict_logits(exp.protocol.clients[0].module.net, EvasionProbe.request, torch.device("cpu"), 64)
        return original(ctx, phase)

    exp.protocol.open_phase = open_phase  # type: ignore[method-assign]
    exp.run()
    seen = EvasionProbe.seen
    reply0, reply1 = seen["reply0"], seen["reply1"]
    # the query: its 3 members and 3 decoys among the 6 others withheld, zeros in their place; the rest as it would send them
    assert reply0.answered[:3].sum() == 0 and int((~reply0.answered[3:]).sum()) == 3  # type: ignore[attr-defined]
    assert torch.equal(reply0.outputs[~reply0.answered], torch.zeros(6, split.num_classes))  # type: ignore[attr-defined]
    torch.testing.assert_close(reply0.outputs[reply0.answered], torch.softmax(truth["logits"], -1)[reply0.answered])  # type: ignore[attr-defined]
    assert reply1.answered.all()  # type: ignore[attr-defined]  # client 1 is not evasive
    # the upload on round 2's batch: the public rows answered, the same images withheld among the added ones
    uploads, rows = seen["uploads"], seen["rows"]
    assert uploads[1].answered is None and torch.equal(uploads[0].reply().answered[rows:], reply0.answered)  # type: ignore[index]
    assert uploads[0].reply().answered[:rows].all() and not uploads[0].outputs[rows:][~reply0.answered].any()  # type: ignore[index]
    # the aggregate of a withheld row is ERA over the clients that answered it
    aggregate = seen["aggregate"]
    assert torch.allclose(aggregate[rows], era(uploads[1].outputs[rows : rows + 1].unsqueeze(0), 0.1)[0])  # type: ignore[index]
    both = rows + int(torch.nonzero(reply0.answered).flatten()[0])  # type: ignore[attr-defined]
    assert torch.allclose(aggregate[both], era(torch.stack([u.outputs[both : both + 1] for u in uploads.values()]), 0.1)[0])  # type: ignore[index]


def _scores_seen(monkeypatch: pytest.MonkeyPatch) -> list:
    """Every membership result the evaluator scores."""
    seen: list = []
    scorer = MembershipScorer.__call__

    def spy(self, attack, result):  # type: ignore[no-untyped-def]
        seen.append(result)
        return scorer(self, attack, result)

    monkeypatch.setattr(MembershipScorer, "__call__", spy)
    return seen


@pytest.mark.parametrize("insert", ["query", "batch"])
def test_the_attacker_sees_no_withheld_output_and_nothing_nan_is_scored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, insert: str
) -> None:
    results = _scores_seen(monkeypatch)
    collected = {}
    on_round_end = CoopLiRAAttack.on_round_end

    def keep(self, round):  # type: ignore[no-untyped-def]
        collected["c"] = self.collected
        return on_round_end(self, round)

    monkeypatch.setattr(CoopLiRAAttack, "on_round_end", keep)
    exp = Experiment(
        compose(None, [*tiny(tmp_path), *SMALL, "attacks=[lira_coop]", f"attack.lira_coop.insert={insert}", "protocol.evasive_clients=all"])
    )
    final = exp.run()
    pool = exp.evaluator.scorers[MembershipScores].pool  # type: ignore[attr-defined]
    for k, reply in collected["c"].candidates.items():
        members = pool.origin == k
        assert not reply.answered[members].any() and int((~reply.answered).sum()) == 2 * int(
            members.sum()
        )  # its members and as many decoys
        assert not reply.outputs[~reply.answered].any()  # zeros, not the client's outputs
    answered = {k: reply.answered for k, reply in collected["c"].candidates.items()}
    for result in results:  # withheld by the target: predicted members; answered but by no reference: non-members; no NaN
        assert not torch.isnan(result.scores).any() and not torch.isnan(result.paper_scores).any()
        for row, k in enumerate(result.clients):
            withheld = ~answered[k]
            untestable = ~withheld & ~torch.stack([answered[j] for j in answered if j != k]).any(dim=0)
            assert torch.equal(torch.isposinf(result.scores[row]), withheld) and (result.paper_scores[row][withheld] == 1).all()
            assert torch.equal(torch.isneginf(result.scores[row]), untestable) and not (result.paper_scores[row][untestable]).any()
    assert all(v == v for v in final.values()) and final["attack/lira_coop/withheld_fraction"] > 0


def test_neighbours_are_noisy_clipped_copies_and_every_query_is_counted(tmp_path: Path) -> None:
    images = torch.zeros(3, 1, 8, 8)
    images[1] = 1.0
    near = neighbours_of(images, 16, 0.3, 0.7, torch.Generator().manual_seed(0))
    assert near.shape == (48, 1, 8, 8) and float(near.abs().max()) <= 1.0
    noise = near[:16] - images[0]  # candidate-major: the first 16 rows are candidate 0's
    assert float(noise.abs().max()) == pytest.approx(0.7) and 0.25 < float(noise.std()) < 0.32  # clipped at 0.7, std about 0.3
    assert float(near[16:32].max()) == 1.0 and float((near[16:32] - 1).min()) >= -0.7  # clamped into [-1, 1]
    exp = Experiment(
        compose(
            None,
            [
                *tiny(tmp_path),
                *SMALL,
                "attacks=[lira_coop]",
                "protocol.evasive_clients=all",
                "attack.lira_coop.countermeasure=neighbours",
                "attack.lira_coop.neighbours=3",
            ],
        )
    )
    c = len(exp.view.candidates)  # type: ignore[arg-type]
    final = exp.run()
    assert final["adversary/lira_coop/queries"] == 4 * 2  # the candidates, then their neighbours, from each client
    assert final["adversary/lira_coop/query_samples"] == 4 * c * (1 + 3)
    assert final["attack/lira_coop/clients_scored"] == 4 and 0 <= final["attack/lira_coop/auc"] <= 1


def test_the_shadow_target_trains_only_on_the_public_rows_its_target_answered(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    jobs: dict[str, object] = {}
    fit_many = LocalTrainer.fit_many

    def spy(self, batch):  # type: ignore[no-untyped-def]
        jobs.update({job.handle.name: job for job in batch if job.handle.name.startswith("lira_coop")})
        return fit_many(self, batch)

    monkeypatch.setattr(LocalTrainer, "fit_many", spy)
    uploads = {}
    on_record = CoopLiRAAttack.on_record

    def keep(self, record):  # type: ignore[no-untyped-def]
        if record.phase == "upload":
            uploads.update(record.uploads)
            with pytest.raises(QueryRefusedError, match="client 0 withholds"):
                record.query(0, record.batch.rows)
        return on_record(self, record)

    monkeypatch.setattr(CoopLiRAAttack, "on_record", keep)
    monkeypatch.setattr(CoopLiRAAttack, "needs", CoopLiRAAttack.needs | {Capability.public_outputs})  # its records carry a query
    exp = Experiment(
        compose(
            None,
            [
                *tiny(tmp_path),
                *SMALL,
                "attacks=[lira_coop]",
                "protocol.evasive_clients=[0]",
                "protocol.public_per_round=null",
                "attack.lira_coop.countermeasure=shadow_target",
                "attack.lira_coop.shadow_epochs=1",
            ],
        )
    )
    split = exp.data.split  # client 0 also holds public rows 0..4: it withholds them and five decoys among the public rows
    exp.protocol.evasion = Evasion({0: torch.cat([split.private[0].images, split.public.images[:5]])}, derive_seed(exp.cfg.seed, "evasion"))
    exp.run()
    assert sorted(jobs) == [f"lira_coop_client{k}_shadow" for k in range(4)]
    answered = uploads[0].reply().answered
    assert not answered[:5].any() and int((~answered).sum()) == 10
    for k in range(4):
        job = jobs[f"lira_coop_client{k}_shadow"]
        rows = torch.nonzero(uploads[k].reply().answered).flatten()
        assert torch.equal(job.data.source, rows) and torch.equal(job.targets, uploads[k].outputs[rows])  # type: ignore[attr-defined]
    assert len(jobs["lira_coop_client1_shadow"].data) == len(split.public)  # type: ignore[attr-defined]


def test_bad_evasion_settings_stop_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = ["run", *tiny(tmp_path), *SMALL, "attacks=[lira_coop]"]
    for value in ("some", "[0,4]", "[1,1]", "2", "[true]"):
        _one_line(
            capsys,
            [*run, f"protocol.evasive_clients={value}"],
            "protocol.evasive_clients=",
            "none, all, or a list of distinct client indices in 0..3",
        )
    for value in ("-1", "nan", "many"):
        _one_line(capsys, [*run, "protocol.evasive_clients=all", f"protocol.evasion_decoys={value}"], "protocol.evasion_decoys")
    _one_line(capsys, [*run, "attack.lira_coop.countermeasure=both"], "attack.lira_coop.countermeasure", "shadow_target")
    for key in ("neighbours=0", "neighbour_std=0", "neighbour_clip=-1", "shadow_epochs=0"):
        _one_line(capsys, [*run, f"attack.lira_coop.{key}"], f"attack.lira_coop.{key.split('=')[0]}", "out of range")
    _one_line(
        capsys,
        ["run", *tiny(tmp_path), "protocol=fedavg", "data.split=random", "data.partition=iid", "protocol.evasive_clients=all"],
        "protocol.evasive_clients='all'",
        "upload weights",
    )
    assert not (tmp_path / "run").exists()


def test_withholding_gives_members_away_unless_every_candidate_is_withheld_on_digits(tmp_path: Path) -> None:
    """DS-FL on scikit-learn digits, 5 clients, Dirichlet(10), every client evasive; co-op LiRA (all other clients) at
    round 1 on every private and test sample (about 230 members per client), withheld candidates read as members.

    With the default decoy rate (one per member) every member is withheld and about a fifth of the non-members, so the
    mask alone ranks the members: AUC = 1 − (withheld share of the non-members) / 2 whatever the models learnt (the
    answered candidates are all non-members), so these runs train 1 warm-up epoch. Members tie with the decoys, so no
    ROC point lies below 1 % FPR: TPR there is 0. With ``evasion_decoys=inf`` a client withholds every candidate, the
    mask says nothing (AUC 0.5 exactly, the hand-computed test above), and the neighbours countermeasure (60 warm-up
    epochs) finds membership on its own.

    Measured on one AMD EPYC core, seeds 0 / 1 / 2 (about 2 s and 5 s a run):

    - default decoys, countermeasure none: AUC 0.917 / 0.908 / 0.897, spread 0.020; TPR at 1 % FPR 0; withheld share
      0.320. The bound 0.8 leaves 0.097 at the worst seed, 4.9x the spread (the former scoring, withheld = non-member,
      read the same masks as AUC 0.08-0.09, "no signal left").
    - every candidate withheld, neighbours: AUC 0.618 / 0.586 / 0.601, spread 0.032; the bound 0.5 (chance) leaves 0.086,
      2.7x (without evasion, the same seeds: 0.627 / 0.596 / 0.610).
    """
    base = [
        "protocol=dsfl_pdafd",
        "data.split=random",
        "data.partition=dirichlet",
        "data.dirichlet_alpha=10",
        "data.min_client_size=32",
        "protocol.num_clients=5",
        "protocol.rounds=1",
        "protocol.private_epochs=1",
        "protocol.distill_epochs=1",
        "protocol.public_per_round=200",
        "protocol.evasive_clients=all",
        "attacks=[lira_coop]",
        "evaluation.confidence_gap.enabled=false",
    ]
    runs = {
        "default_decoys": ["protocol.warmup_private_epochs=1"],
        "all_withheld": ["protocol.warmup_private_epochs=60", "protocol.evasion_decoys=inf", "attack.lira_coop.countermeasure=neighbours"],
    }
    for seed in (0, 1, 2):
        m = {}
        for name, extra in runs.items():
            m[name] = Experiment(compose(None, [*tiny(tmp_path / f"{name}{seed}"), *base, f"seed={seed}", *extra])).run()
        evaded, hidden = m["default_decoys"], m["all_withheld"]
        assert evaded["attack/lira_coop_all/auc"] > 0.8 and evaded["attack/lira_coop_all/tpr_at_1pct_fpr"] == 0.0, (seed, evaded)
        assert 0.2 < evaded["attack/lira_coop/withheld_fraction"] < 0.5, (seed, evaded)
        assert hidden["attack/lira_coop/withheld_fraction"] == 1.0 and hidden["attack/lira_coop_all/auc"] > 0.5, (seed, hidden)
