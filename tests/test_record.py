"""The round record carries what crossed the wire and never private data."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import MappingProxyType

import pytest
import torch

from fdattack.attacks.base import Attack, AttackContext
from fdattack.config import compose
from fdattack.experiment import Experiment
from fdattack.fd.record import UPLOAD_PHASE, PublicBatch, PublicQuery, RoundRecord, Upload
from tests.conftest import REPO, tiny


class Collector(Attack):
    name = "collector"

    def __init__(self, name: str = "collector") -> None:
        super().__init__(None, None, AttackContext(seed=0))  # type: ignore[arg-type]  # a test observer: no view needed
        self.name = name
        self.records: list[RoundRecord] = []

    def on_record(self, record: RoundRecord) -> None:
        self.records.append(record)


def _tensors(obj: object, seen: set[int] | None = None) -> list[torch.Tensor]:
    """Every tensor reachable from a record's fields (not through the query's closure)."""
    seen = seen if seen is not None else set()
    if id(obj) in seen:
        return []
    seen.add(id(obj))
    if torch.is_tensor(obj):
        return [obj]
    if isinstance(obj, (dict, MappingProxyType)):
        return [t for v in obj.values() for t in _tensors(v, seen)]
    if isinstance(obj, (list, tuple)):
        return [t for v in obj for t in _tensors(v, seen)]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return [t for f in dataclasses.fields(obj) for t in _tensors(getattr(obj, f.name), seen)]
    return []


@pytest.mark.parametrize("protocol", ["fedmd", "fedgems", "dsfl", "cronus"])
def test_records_hold_no_private_data(tmp_path: Path, protocol: str) -> None:
    name = {"fedmd": "fedmd_digits", "fedgems": "fedgems_digits", "dsfl": "dsfl_digits", "cronus": "cronus_digits"}[protocol]
    cfg = compose(REPO / "conf" / "experiment" / f"{name}.yaml", tiny(tmp_path, "protocol.rounds=1"))
    exp = Experiment(cfg)
    collector, silent = Collector(), Collector("silent")
    exp.observe(collector, query=True)
    exp.observe(silent)  # declares no public_outputs: it gets the records without a query handle
    exp.run()
    assert len(silent.records) == len(collector.records) and all(r.query is None for r in silent.records)
    split = exp.data.split
    private_images = torch.cat([p.images for p in split.private]).flatten(1)
    assert collector.records, "no record was published"
    assert any(r.attack_point for r in collector.records)
    for record in collector.records:
        allowed = {f.name for f in dataclasses.fields(RoundRecord)}
        assert set(vars(record)) <= allowed
        for tensor in _tensors(record):
            # no private image, in any shape
            if tensor.numel() % private_images.shape[1] == 0 and tensor.is_floating_point() and tensor.numel():
                rows = tensor.reshape(-1, private_images.shape[1])
                assert not (torch.cdist(rows.float(), private_images) < 1e-6).any()
        for upload in record.uploads.values():
            assert upload.kind in ("logits", "probs")
            # outputs refer to public rows only
            assert upload.batch is not None and int(upload.batch.rows.max()) < len(split.public) and upload.batch.added is None
            assert upload.outputs is not None and upload.outputs.shape == (len(upload.batch), split.num_classes)
        # a query only after the uploads and at the attack point (after the other phases it would read model states
        # that never cross the wire)
        assert isinstance(record.query, PublicQuery) == (record.attack_point or record.phase == UPLOAD_PHASE)
        assert not any(isinstance(v, type(exp.data)) for v in vars(record).values())


def test_uploads_are_copies_observers_cannot_alter() -> None:
    outputs = torch.zeros(3, 2)
    upload = Upload(client=0, kind="logits", batch=PublicBatch(torch.arange(3)), outputs=outputs)
    copy = upload.frozen_copy()
    copy.outputs.add_(1.0)  # type: ignore[union-attr]
    assert float(outputs.abs().sum()) == 0.0
