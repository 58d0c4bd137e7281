"""LabelAvg (lattack.md §3): hand-computed labels, weights and smoothing; Table V's communication volume; the client
side as an upload transform; a tiny end-to-end run whose uploads and query answers are top-K label uploads."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest
import torch

from fdattack.attacks import ATTACKS, Attack
from fdattack.cli import main
from fdattack.config import compose
from fdattack.defenses import Release
from fdattack.defenses.labelavg import LabelAvgUpload, LabelAvgUploadSettings
from fdattack.experiment import Experiment
from fdattack.fd.record import RoundRecord
from fdattack.fd.threat import Capability
from fdattack.functional import label_vector, labelavg_comm_mib, smooth_labels, top_k_labels
from tests.conftest import error_of, tiny

# ------------------------------------------------------------------ Eqs. 7-10: top-K labels and β


def test_top_k_labels_beta_weights_and_ties_to_the_lowest_index() -> None:
    probs = torch.tensor(
        [
            [0.10, 0.50, 0.25, 0.15],  # top-2: 1 (0.5), 2 (0.25)          β = 1, 0.25/0.5
            [0.40, 0.20, 0.20, 0.20],  # 1, 2, 3 tie at 0.2: 1 is kept      β = 1, 0.2/0.4
            [0.25, 0.25, 0.25, 0.25],
        ]
    )  # all tie: 0 then 1                  β = 1, 1
    labels, weights = top_k_labels(probs, 2)
    assert labels.dtype == torch.long and labels.tolist() == [[1, 2], [0, 1], [0, 1]]
    torch.testing.assert_close(weights, torch.tensor([[1.0, 0.5], [1.0, 0.5], [1.0, 1.0]]))
    assert bool((weights[:, 0] == 1.0).all())  # the top-1 weight is exactly 1
    labels, _ = top_k_labels(probs, 3)
    assert labels.tolist() == [[1, 2, 3], [0, 1, 2], [0, 1, 2]]


def test_top_k_labels_ties_are_stable_on_a_long_row() -> None:
    probs = torch.full((1, 40), 0.02)
    probs[0, 17] = 0.22  # the other 39 tie: the lowest indices come next
    labels, weights = top_k_labels(probs, 4)
    assert labels.tolist() == [[17, 0, 1, 2]]
    torch.testing.assert_close(weights, torch.tensor([[1.0, 0.02 / 0.22, 0.02 / 0.22, 0.02 / 0.22]]))


def test_top_k_labels_all_ones_and_bad_k() -> None:
    labels, weights = top_k_labels(torch.tensor([[0.1, 0.6, 0.3]]), 2, weights="ones")
    assert labels.tolist() == [[1, 2]] and weights.tolist() == [[1.0, 1.0]]
    with pytest.raises(ValueError, match="k must be in"):
        top_k_labels(torch.tensor([[0.1, 0.6, 0.3]]), 4)


def test_an_underflowed_probability_still_counts_as_an_uploaded_label() -> None:
    probs = torch.softmax(torch.tensor([[0.0, -200.0, -300.0]]), dim=-1)  # p_1, p_2 underflow to 0 in float32
    labels, weights = top_k_labels(probs, 2)
    assert labels.tolist() == [[0, 1]] and bool((weights > 0).all())


def test_label_vector_is_dense_w_times_v() -> None:
    out = label_vector(torch.tensor([[1, 2], [3, 0]]), torch.tensor([[1.0, 0.5], [1.0, 0.25]]), 4)
    torch.testing.assert_close(out, torch.tensor([[0.0, 1.0, 0.5, 0.0], [0.25, 0.0, 0.0, 1.0]]))


# ------------------------------------------------------------------ Eqs. 11-12: voting-based smoothing
# Two clients P = A, B, three public samples, four classes, K = 2 (each row below is w_P ⊙ v_P).
UPLOADS = torch.tensor(
    [
        [
            [1.0, 0.0, 0.0, 0.5],  # A, s0: labels 0 (β 1), 3 (β 0.5)
            [0.0, 0.0, 0.25, 1.0],  # A, s1: labels 3, 2
            [0.5, 1.0, 0.0, 0.0],
        ],  # A, s2: labels 1, 0
        [
            [0.0, 1.0, 0.0, 0.5],  # B, s0: labels 1, 3
            [0.0, 0.0, 1.0, 0.75],  # B, s1: labels 2, 3
            [0.0, 0.0, 1.0, 0.5],
        ],  # B, s2: labels 2, 3
    ]
)
# Eq. 11, mass / (K N) = mass / 4:
#   s0: mass [1, 1, 0, 1]         -> [0.25, 0.25, 0, 0.25]
#   s1: mass [0, 0, 1.25, 1.75]   -> [0, 0, 0.3125, 0.4375]
#   s2: mass [0.5, 1, 1, 0.5]     -> [0.125, 0.25, 0.25, 0.125]
EQ11 = torch.tensor([[0.25, 0.25, 0.0, 0.25], [0.0, 0.0, 0.3125, 0.4375], [0.125, 0.25, 0.25, 0.125]])
# Max vote: s0 votes [1, 1, 0, 2] -> 3 (votes are counts: the mass ties 0, 1 and 3); s1 votes [0, 0, 2, 2], a tie
# broken by mass (1.75 > 1.25) -> 3; s2 votes [1, 1, 1, 1], the mass ties 1 and 2 at 1.0 -> the lower index, 1.
VOTED = torch.tensor([[0.0, 0, 0, 1], [0, 0, 0, 1], [0, 1, 0, 0]])


def test_eq11_is_the_weighted_vote_over_k_n() -> None:
    torch.testing.assert_close(smooth_labels(UPLOADS, 2, 1.0), EQ11)


def test_eq12_with_the_max_vote_ties_broken_by_mass_then_index() -> None:
    # α = 0.5: 0.5 one-hot(vote) + 0.5 Eq. 11, e.g. s1 = [0, 0, 0.15625, 0.5 + 0.21875]
    expected = torch.tensor([[0.125, 0.125, 0.0, 0.625], [0.0, 0.0, 0.15625, 0.71875], [0.0625, 0.625, 0.125, 0.0625]])
    torch.testing.assert_close(smooth_labels(UPLOADS, 2, 0.5), expected)
    torch.testing.assert_close(smooth_labels(UPLOADS, 2, 0.0), VOTED)  # α = 0: hard labels


def test_eq12_with_ground_truth_and_an_unlabeled_row() -> None:
    # gt main [1, 2, unlabeled]: s0 = 0.5 e_1 + 0.5 Eq. 11 = [0.125, 0.625, 0, 0.125]; s2 falls back to the vote (1)
    expected = torch.tensor([[0.125, 0.625, 0.0, 0.125], [0.0, 0.0, 0.65625, 0.21875], [0.0625, 0.625, 0.125, 0.0625]])
    torch.testing.assert_close(smooth_labels(UPLOADS, 2, 0.5, main=torch.tensor([1, 2, -1])), expected)


def test_renorm_scales_eq11_to_sum_one_before_mixing() -> None:
    # every row of Eq. 11 sums to 0.75 here: renormalised s0 = [1/3, 1/3, 0, 1/3], mixed 0.5 e_3 + 0.5 that
    renormed = EQ11 / 0.75
    torch.testing.assert_close(smooth_labels(UPLOADS, 2, 1.0, renorm=True), renormed)
    torch.testing.assert_close(smooth_labels(UPLOADS, 2, 0.5, renorm=True), 0.5 * VOTED + 0.5 * renormed)
    assert smooth_labels(UPLOADS, 2, 0.5, renorm=True)[0, 3].item() == pytest.approx(0.5 + 1 / 6)


def test_all_ones_weights_make_v_smooth_the_vote_histogram() -> None:
    torch.testing.assert_close(smooth_labels((UPLOADS > 0).float(), 2, 1.0).sum(dim=-1), torch.ones(3))
    probs = torch.softmax(torch.randn(3, 20, 7, generator=torch.Generator().manual_seed(0)), dim=-1)
    uploads = torch.stack([label_vector(*top_k_labels(p, 4, weights="ones"), 7) for p in probs])
    torch.testing.assert_close(smooth_labels(uploads, 4, 1.0).sum(dim=-1), torch.ones(20))


# ------------------------------------------------------------------ §3.6: communication volume, Table V (N = 10, C = 16)


@pytest.mark.parametrize(
    ("public", "rounds", "k", "mib"),
    [
        (120, 50, None, 7.3242),
        (120, 50, 2, 4.5776),
        (120, 50, 3, 5.0354),
        (120, 50, 4, 5.4932),
        (120, 50, 5, 5.9509),
        (3000, 200, None, 732.4219),
        (3000, 200, 2, 457.7637),
        (3000, 200, 3, 503.5400),
        (3000, 200, 4, 549.3164),
        (3000, 200, 5, 595.0928),
    ],
)
def test_communication_reproduces_table_v(public: int, rounds: int, k: int | None, mib: float) -> None:
    assert round(labelavg_comm_mib(10, rounds, public, 16, k), 4) == mib


# ------------------------------------------------------------------ the client side as an upload transform


def test_upload_transform_sends_k_labels_and_k_weights() -> None:
    logits = torch.tensor([[2.0, 0.0, 1.0, -1.0], [0.0, 0.0, 0.0, 3.0]])
    defense = LabelAvgUpload(LabelAvgUploadSettings(k=2), seed=0)
    as_logits = defense.transform(logits, Release(0, 1, "upload", "logits", b""))
    as_probs = defense.transform(torch.softmax(logits, dim=-1), Release(0, 1, "upload", "probs", b""))
    torch.testing.assert_close(as_logits, as_probs)
    # row 0: labels 0, 2 with β = e^1 / e^2; row 1: label 3 (β 1), then 0 (lowest of the ties) with β = e^0 / e^3
    torch.testing.assert_close(as_logits, torch.tensor([[1.0, 0.0, math.exp(-1), 0.0], [math.exp(-3), 0.0, 0.0, 1.0]]))
    assert defense.encoded_bytes(as_logits, Release(0, 1, "upload", "probs", b""), size=2 * 4 * 4) == 2 * 2 * (4 + 4)


# ------------------------------------------------------------------ a tiny run: bytes, accuracy, what the server sees
K, PUBLIC = 2, 30


@dataclass
class QuerySettings:
    pass


class LabelProbe(Attack):
    """Round 1: at the upload it keeps client 0's upload and queries client 1 on chosen images; at the aggregate it
    keeps every upload, the public rows and what the server sent back."""

    name = "label_probe"
    Settings = QuerySettings
    needs = frozenset({Capability.query_chosen_batch})
    seen: dict[str, torch.Tensor] = {}

    def on_record(self, record: RoundRecord) -> None:
        if record.round == 1 and record.phase == "upload":
            assert self.context.adversary is not None
            probes = torch.linspace(-1, 1, 5 * 64).reshape(5, 1, 8, 8)
            LabelProbe.seen["answer"] = self.context.adversary.query(1, probes).outputs
            LabelProbe.seen["upload"] = record.uploads[0].outputs  # type: ignore[union-attr]
        if record.round == 1 and record.phase == "aggregate":
            assert record.batch is not None and record.aggregate is not None
            LabelProbe.seen["uploads"] = torch.stack([u.outputs for _, u in sorted(record.uploads.items())])  # type: ignore[union-attr]
            LabelProbe.seen["rows"] = record.batch.rows
            LabelProbe.seen["aggregate"] = record.aggregate


@pytest.fixture(scope="module")
def labelavg_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Experiment, list[dict]]]:
    tmp_path = tmp_path_factory.mktemp("labelavg")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ATTACKS, "_items", {**ATTACKS._items, "label_probe": LabelProbe})
        cfg = compose(
            None,
            [
                "protocol=labelavg",
                *tiny(
                    tmp_path,
                    f"protocol.top_k={K}",
                    f"protocol.public_per_round={PUBLIC}",
                    "protocol.transfer_public_epochs=1",
                    "protocol.transfer_private_epochs=1",
                    "protocol.revisit_epochs=1",
                    "attacks=[label_probe]",
                    "evaluation.classifier=null",
                    "evaluation.confidence_gap.enabled=false",
                ),
            ],
        )
        exp = Experiment(cfg)
        exp.run()
        yield exp, [json.loads(line) for line in (tmp_path / "run" / "rounds.jsonl").read_text().splitlines()]


def test_run_counts_k_labels_up_and_c_smoothed_entries_down(labelavg_run: tuple[Experiment, list[dict]]) -> None:
    exp, rounds = labelavg_run
    n, c = exp.cfg.protocol.num_clients, exp.data.split.num_classes
    assert exp.protocol.server is None and [r["round"] for r in rounds] == [0, 1, 2]
    for row in rounds[1:]:
        assert row["comm/upload_bytes"] == n * PUBLIC * 2 * K * 4
        assert row["comm/download_bytes"] == n * PUBLIC * c * 4
        assert math.isfinite(row["protocol/digest_loss"])
    assert 0.0 <= rounds[-1]["protocol/client_acc_mean"] <= 1.0


def test_the_server_sends_eq12_with_the_public_labels(labelavg_run: tuple[Experiment, list[dict]]) -> None:
    exp, _ = labelavg_run
    seen = LabelProbe.seen
    main = exp.data.split.public.labels[seen["rows"]]
    assert bool((main >= 0).all())  # the digits public set is labeled: v_main is the ground truth (vmain=gt)
    torch.testing.assert_close(seen["aggregate"], smooth_labels(seen["uploads"], K, 0.5, main))


def test_uploads_and_query_answers_are_top_k_label_uploads(labelavg_run: tuple[Experiment, list[dict]]) -> None:
    for key in ("upload", "answer"):
        out = LabelProbe.seen[key]
        assert int((out > 0).sum(dim=-1).max()) <= K, key
        assert bool((out.max(dim=-1).values == 1.0).all()), key  # the top label weighs exactly 1


def test_top_k_above_the_number_of_classes_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "protocol=labelavg", *tiny(tmp_path, "protocol.top_k=11")]) == 2
    assert error_of(capsys.readouterr().err) == "fdattack: error: protocol.top_k=11 is more than the data's 10 classes; allowed: 1 to 10"
