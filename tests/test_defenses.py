"""Upload defenses against hand-computed values and their statistics; communication cost; training-defense hooks."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from fdattack.config import compose
from fdattack.defenses import DEFENSES, Release, TrainingDefense
from fdattack.defenses.laplace import LaplaceDefense, LaplaceSettings
from fdattack.defenses.rounding import RoundingDefense, RoundingSettings
from fdattack.defenses.topk import TopKDefense, TopKSettings, index_bytes, truncate_logits, truncate_probs
from fdattack.experiment import Experiment
from tests.conftest import tiny


def _release(kind: str = "logits", client: int = 0, round: int = 1, key: bytes = b"rows") -> Release:
    return Release(client, round, "upload", kind, key)  # type: ignore[arg-type]


def test_laplace_noise_has_scale_b_and_is_reproducible_per_release() -> None:
    defense = LaplaceDefense(LaplaceSettings(scale=0.5), seed=3)
    logits = torch.zeros(200, 50)
    noisy = defense.transform(logits, _release())
    noise = noisy - logits
    assert abs(float(noise.mean())) < 0.02 and abs(float(noise.abs().mean()) - 0.5) < 0.02  # E|X| = b
    assert abs(float(noise.var()) - 2 * 0.25) < 0.03  # Var = 2 b^2
    assert torch.equal(defense.transform(logits, _release()), noisy)  # same question, same answer
    assert not torch.equal(defense.transform(logits, _release(client=1)), noisy)
    assert not torch.equal(defense.transform(logits, _release(round=2)), noisy)
    assert torch.equal(LaplaceDefense(LaplaceSettings(scale=0.0), seed=3).transform(logits, _release()), logits)


def test_laplace_on_probabilities_is_noise_on_their_logits() -> None:
    defense = LaplaceDefense(LaplaceSettings(scale=1.0), seed=0)
    logits = torch.randn(64, 10)
    probs = torch.softmax(logits, dim=-1)
    noisy = defense.transform(probs, _release("probs"))
    torch.testing.assert_close(noisy.sum(-1), torch.ones(64))
    noise = defense.transform(torch.zeros(64, 10), _release("logits"))
    torch.testing.assert_close(noisy, torch.softmax(logits + noise, dim=-1), atol=1e-5, rtol=1e-4)


def test_topk_keeps_the_largest_and_completes_by_maximum_entropy() -> None:
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    torch.testing.assert_close(truncate_probs(probs, 1), torch.tensor([[0.5, 1 / 6, 1 / 6, 1 / 6]]))
    torch.testing.assert_close(truncate_probs(probs, 2), torch.tensor([[0.5, 0.3, 0.1, 0.1]]))
    logits = torch.randn(32, 7)
    kept = truncate_logits(logits, 3)
    top = logits.topk(3, dim=-1)
    assert torch.equal(kept.gather(-1, top.indices), top.values)  # the k largest are sent exactly
    torch.testing.assert_close(torch.softmax(kept, -1), truncate_probs(torch.softmax(logits, -1), 3), atol=1e-6, rtol=1e-5)
    assert torch.equal(truncate_logits(logits, 7), logits)
    defense = TopKDefense(TopKSettings(k=2), seed=0)
    assert defense.encoded_bytes(logits, _release("logits"), logits.numel() * 4) == 32 * (2 * (4 + 1) + 4)
    assert defense.encoded_bytes(logits, _release("probs"), logits.numel() * 4) == 32 * 2 * (4 + 1)
    assert (index_bytes(10), index_bytes(256), index_bytes(257), index_bytes(70_000)) == (1, 1, 2, 4)


def test_rounding_rounds_to_d_decimals() -> None:
    payload = torch.tensor([[0.12345, -1.98765, 2.5]])
    out = RoundingDefense(RoundingSettings(decimals=2), seed=0).transform(payload, _release())
    torch.testing.assert_close(out, torch.tensor([[0.12, -1.99, 2.5]]))


def _round_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "rounds.jsonl").read_text().splitlines()]


def test_communication_cost_is_counted_per_round_and_shrinks_with_topk(tmp_path: Path) -> None:
    """FedMD on digits, K = 2: uploads N x J float32 per client, downloads the consensus to each client."""
    dense = Experiment(compose(None, tiny(tmp_path / "dense", "protocol.rounds=1", "evaluation.confidence_gap.enabled=false")))
    n, j = len(dense.data.split.public), dense.data.split.num_classes
    dense.run()
    row = _round_metrics(tmp_path / "dense" / "run")[1]
    assert row["comm/upload_bytes"] == 2 * n * j * 4 and row["comm/download_bytes"] == 2 * n * j * 4
    topk = Experiment(
        compose(
            None,
            tiny(tmp_path / "topk", "protocol.rounds=1", "evaluation.confidence_gap.enabled=false", "defenses=[topk]", "defense.topk.k=2"),
        )
    )
    topk.run()
    row = _round_metrics(tmp_path / "topk" / "run")[1]
    assert row["comm/upload_bytes"] == 2 * n * (2 * (4 + 1) + 4) and row["comm/download_bytes"] == 2 * n * j * 4


def test_uploads_in_the_records_carry_the_defense(tmp_path: Path) -> None:
    """What the server receives is the defended payload: the clients' logits plus reproducible Laplace noise."""
    exp = Experiment(
        compose(
            None,
            tiny(
                tmp_path,
                "protocol.rounds=1",
                "evaluation.confidence_gap.enabled=false",
                "defenses=[laplace,rounding]",
                "defense.laplace.scale=2.0",
                "defense.rounding.decimals=1",
            ),
        )
    )
    uploads: dict[int, torch.Tensor] = {}
    clean: dict[int, torch.Tensor] = {}

    class Spy:
        name = "spy"

        def on_record(self, record) -> None:  # type: ignore[no-untyped-def]
            if record.phase == "upload":
                for k, upload in record.uploads.items():
                    uploads[k] = upload.outputs
                    clean[k] = exp.engine.predict(exp.protocol.clients[k], exp.data.split.public.subset(upload.batch.rows))

    assert [d.name for d in exp.protocol.upload_defenses] == ["laplace", "rounding"]  # the order given
    from fdattack.fd.orchestrator import RoundOrchestrator

    orchestrator = RoundOrchestrator(exp.protocol, [Spy()])  # type: ignore[list-item]
    orchestrator.run_round(1)
    for k in uploads:
        assert torch.equal(uploads[k], torch.round(uploads[k], decimals=1))
        noise = uploads[k] - clean[k]
        assert 1.5 < float(noise.abs().mean()) < 2.5  # E|X| = b = 2, plus rounding error <= 0.05


@dataclass
class FrozenSettings:
    pass


class FreezeClients(TrainingDefense):
    """A test training defense: a zero objective (no update) and a counter on every hook."""

    name = "freeze"
    Settings = FrozenSettings
    calls: dict[str, int] = {}

    def wrap_network(self, client, net):  # type: ignore[no-untyped-def]
        FreezeClients.calls["network"] = FreezeClients.calls.get("network", 0) + 1
        return net

    def wrap_optimizer(self, client, optimizer):  # type: ignore[no-untyped-def]
        FreezeClients.calls["optimizer"] = FreezeClients.calls.get("optimizer", 0) + 1
        return optimizer

    def wrap_objective(self, client, objective):  # type: ignore[no-untyped-def]
        FreezeClients.calls["objective"] = FreezeClients.calls.get("objective", 0) + 1
        return lambda logits, batch: 0.0 * objective(logits, batch)


def test_training_defense_hooks_wrap_every_client(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(DEFENSES, "_items", {**DEFENSES._items, "freeze": FreezeClients})
    FreezeClients.calls = {}
    exp = Experiment(
        compose(
            None,
            tiny(
                tmp_path,
                "protocol.rounds=1",
                "evaluation.confidence_gap.enabled=false",
                "defenses=[freeze]",
                "protocol.optim.fresh_per_phase=true",
            ),
        )
    )
    before = [{n: t.clone() for n, t in c.module.state_dict().items()} for c in exp.protocol.clients]
    server_before = {n: t.clone() for n, t in exp.protocol.server.module.state_dict().items()}  # type: ignore[union-attr]
    exp.run()
    assert FreezeClients.calls["network"] == 2
    assert FreezeClients.calls["optimizer"] >= 2 + 2 * 4  # at set-up, then a fresh optimizer in each of the 4 client phases
    assert FreezeClients.calls["objective"] == 2 * 4  # transfer public/private, digest, revisit
    for handle, state in zip(exp.protocol.clients, before):
        for name, tensor in handle.module.state_dict().items():
            if tensor.is_floating_point():
                assert torch.equal(tensor, state[name]), name  # a zero loss never moved a client
    assert any(not torch.equal(t, server_before[n]) for n, t in exp.protocol.server.module.state_dict().items())  # type: ignore[union-attr]
    assert math.isfinite(json.loads((tmp_path / "run" / "metrics.json").read_text())["protocol/client_acc_mean"])
