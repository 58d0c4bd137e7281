"""The Adversary capability: granted only what the threat model gives the server, every power acts, every use is counted."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from fdattack.attacks import ATTACKS, Attack
from fdattack.config import compose
from fdattack.engine import predict_logits
from fdattack.errors import ConfigError
from fdattack.experiment import Experiment
from fdattack.fd.record import QueryRefusedError, RoundRecord, StaleQueryError
from fdattack.fd.threat import Capability
from tests.conftest import tiny
from tests.object_graph import reachable


@dataclass
class ActiveSettings:
    pass


class ActiveAttack(Attack):
    """Round 1: chooses round 2's public rows, adds three images, sends client 0 a zero aggregate, queries client 1."""

    name = "active"
    Settings = ActiveSettings
    needs = frozenset(
        {Capability.choose_public_batch, Capability.add_public_samples, Capability.send_aggregate, Capability.query_chosen_batch}
    )
    probes = torch.linspace(-1, 1, 3 * 64).reshape(3, 1, 8, 8)
    seen: dict[str, object] = {}

    def on_record(self, record: RoundRecord) -> None:
        adversary = self.context.adversary
        assert adversary is not None
        if record.round == 1 and record.phase == "upload":
            adversary.choose_public_rows(torch.arange(10))
            adversary.add_public_samples(self.probes)
            ActiveAttack.seen["answer"] = adversary.query(1, self.probes).outputs
            ActiveAttack.seen["open_walk"] = list(reachable(adversary))
        if record.round == 1 and record.phase == "aggregate":
            assert record.aggregate is not None
            ActiveAttack.seen["aggregate"] = record.aggregate
            adversary.send_aggregate(0, torch.zeros_like(record.aggregate))
        if record.round == 2 and record.phase == "upload":
            ActiveAttack.seen["batch"] = record.batch
            ActiveAttack.seen["upload_shape"] = record.uploads[0].outputs.shape  # type: ignore[union-attr]


@pytest.fixture
def active(monkeypatch: pytest.MonkeyPatch) -> type[ActiveAttack]:
    monkeypatch.setattr(ATTACKS, "_items", {**ATTACKS._items, "active": ActiveAttack})
    ActiveAttack.seen = {}
    return ActiveAttack


def test_every_power_acts_and_is_counted(tmp_path: Path, active: type[ActiveAttack]) -> None:
    exp = Experiment(
        compose(None, tiny(tmp_path, "attacks=[active]", "evaluation.confidence_gap.enabled=false", "evaluation.classifier=null"))
    )
    targets: dict[int, torch.Tensor] = {}
    fit_many = exp.engine.fit_many

    def spy(jobs):  # type: ignore[no-untyped-def]
        for job in jobs:
            if (
                job.targets is not None
                and job.targets.shape[0] > 0
                and job.epochs == exp.cfg.protocol.digest_epochs
                and "client" in job.handle.name
            ):
                targets.setdefault(int(job.handle.name.removeprefix("client")), job.targets)
        return fit_many(jobs)

    exp.engine.fit_many = spy  # type: ignore[method-assign]
    client1 = exp.protocol.clients[1].module.net
    clean = {}

    original = exp.protocol.open_phase

    def open_phase(ctx, phase):  # type: ignore[no-untyped-def]
        if ctx.round == 1 and phase == "upload":
            clean["probes"] = predict_logits(client1, active.probes, torch.device("cpu"), 64)
        return original(ctx, phase)

    exp.protocol.open_phase = open_phase  # type: ignore[method-assign]
    exp.run()
    seen = active.seen
    # query on chosen images: the client's own logits on them (FedMD sends raw logits, no defense)
    torch.testing.assert_close(seen["answer"], clean["probes"])
    # send_aggregate: client 0 distilled towards zeros, client 1 towards the real consensus
    torch.testing.assert_close(targets[0], torch.zeros_like(targets[0]))
    torch.testing.assert_close(targets[1], seen["aggregate"])
    # round 2's public batch: the chosen rows, then the added images; every upload answers all 13
    batch = seen["batch"]
    assert torch.equal(batch.rows, torch.arange(10)) and torch.equal(batch.added, active.probes)  # type: ignore[union-attr]
    assert seen["upload_shape"] == (13, exp.data.split.num_classes)
    rounds = [json.loads(line) for line in (tmp_path / "run" / "rounds.jsonl").read_text().splitlines()]
    assert {k: v for k, v in rounds[1].items() if k.startswith("adversary/")} == {
        "adversary/active/added_samples": 3.0,
        "adversary/active/chosen_rows": 10.0,
        "adversary/active/queries": 1.0,
        "adversary/active/query_bytes": 3 * exp.data.split.num_classes * 4.0,
        "adversary/active/query_samples": 3.0,
        "adversary/active/sent_aggregates": 1.0,
    }
    assert not any(k.startswith("adversary/") for k in rounds[2])
    # while open, the adversary reaches no network (it holds its answerer's token), the protocol, its data or a module
    private = {p.images.untyped_storage().data_ptr() for p in exp.data.split.private}
    for obj in seen["open_walk"]:  # type: ignore[union-attr]
        assert not isinstance(obj, torch.nn.Module)
        assert type(obj).__name__ not in ("Protocol", "FederatedSplit", "LocalTrainer", "Fabric", "ClassifierLitModule", "ModelHandle")
        assert not (torch.is_tensor(obj) and obj.numel() and obj.untyped_storage().data_ptr() in private)


def test_powers_are_checked_against_the_grant_and_the_phase(tmp_path: Path, active: type[ActiveAttack]) -> None:
    with pytest.raises(
        ConfigError,
        match=r"attacks: active needs the power to add images to the round's public batch \(add_public_samples\), "
        r"which protocol.name=fedgems does not offer here",
    ):
        compose(None, tiny(tmp_path, "protocol=fedgems", "attacks=[active]"))
    # built, never run: no evaluation classifier of TBI's reconstructions is trained (it took all of this test's 30 s)
    exp = Experiment(
        compose(None, tiny(tmp_path, "attacks=[tbi]", "evaluation.confidence_gap.enabled=false", "evaluation.classifier=null"))
    )
    adversary = exp.protocol.grant_adversary(frozenset({Capability.query_chosen_batch}))
    with pytest.raises(QueryRefusedError, match="not granted choose_public_batch"):
        adversary.choose_public_rows(torch.arange(3))
    with pytest.raises(StaleQueryError, match="only while a phase is open"):
        adversary.query(0, ActiveAttack.probes)
    with pytest.raises(ConfigError, match="gives the server no white_box"):
        exp.protocol.grant_adversary(frozenset({Capability.white_box}))
