"""The terminal shows what runs now, from the first second, and each attack's score as soon as its round is scored."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from fdattack.config import compose
from fdattack.data.federated import FederatedData
from fdattack.experiment import run
from fdattack.tracking import Progress, progress_iter
from fdattack.tracking.progress import score_line
from tests.conftest import own_messages, tiny


def test_progress_auto_is_silent_when_not_a_tty(capsys: pytest.CaptureFixture[str]) -> None:
    with Progress("auto", total_rounds=3, start_round=1) as bar:
        for name in ("local_train", "upload", "aggregate"):
            bar.phase(2, name)
        bar.advance()
    assert list(progress_iter(range(4), "attack", "auto")) == [0, 1, 2, 3]
    assert list(progress_iter(range(2), "attack", "never")) == [0, 1]
    assert capsys.readouterr() == ("", "")


def test_progress_always_shows_rounds_phase_activity_and_scores(capsys: pytest.CaptureFixture[str]) -> None:
    bar = Progress("always", total_rounds=4)
    bar.skip_to(2)
    bar.phase(3, "distill")
    bar.activity("round 3: attack pli")
    bar.scores(3, "pli", {"attack/pli/accuracy": 0.4, "attack/pli/ssim": 0.38, "attack/pli/chance": 0.2, "attack/tbi/accuracy": 1.0})
    bar.advance()
    bar.close()
    bar.close()
    err = capsys.readouterr().err
    assert "round 3: phase distill" in err and "round 3: attack pli" in err and "3/4" in err
    assert "round 3  pli: accuracy 0.40  SSIM 0.380  chance 0.20" in err
    with pytest.raises(ValueError, match="progress mode"):
        Progress("sometimes", total_rounds=1)


def test_score_line_only_for_attacks_with_scores() -> None:
    assert score_line(1, "tbi", {"attack/pli/accuracy": 0.5}) is None
    assert score_line(2, "tbi", {"attack/tbi/accuracy": float("nan")}) == "round 2  tbi: accuracy nan"


@pytest.mark.slow
def test_a_run_shows_each_step_from_the_first_second(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Loading data shows before the data is read; the evaluation classifier and each attack by name; a score line
    per attack as soon as its round is scored, before the next round's first phase."""
    seen_before_loading: list[str] = []
    setup = FederatedData.setup

    def recording_setup(self: FederatedData, stage: str | None = None) -> None:
        seen_before_loading.append(capsys.readouterr().err)
        setup(self)

    monkeypatch.setattr(FederatedData, "setup", recording_setup)
    cfg = compose(
        None,
        tiny(tmp_path, "logger.progress=always", "attacks=[public_mean]", "evaluation.epochs=1", "evaluation.confidence_gap.enabled=false"),
    )
    run(cfg)
    err = seen_before_loading[0] + capsys.readouterr().err
    assert "loading data (digits)" in seen_before_loading[0]
    steps = [
        "training the evaluation classifier (pdafd_cnn, 1 epochs)",
        "round 0: phase",
        "round 1: phase",
        "round 1: attack public_mean",
        "round 1  public_mean: accuracy",
        "round 2: phase",
        "round 2  public_mean: accuracy",
    ]
    positions = [err.find(step) for step in steps]
    assert -1 not in positions, [s for s, p in zip(steps, positions) if p == -1]
    assert positions == sorted(positions)


def test_without_a_bar_the_steps_and_scores_are_log_lines(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cfg = compose(
        None,
        tiny(
            tmp_path, "attacks=[public_mean]", "evaluation.classifier=null", "protocol.rounds=1", "evaluation.confidence_gap.enabled=false"
        ),
    )
    with caplog.at_level(logging.INFO, logger="fdattack"):
        run(cfg)
    messages = own_messages(caplog)
    assert "loading data (digits)" in messages and "round 1: attack public_mean" in messages
    assert any(m.startswith("round 1  public_mean: accuracy") for m in messages)
