"""Batch runs show fdattack's INFO lines as the docs promise, whatever a dependency did to logging first (issue 30):
opacus calls ``logging.basicConfig`` at import, which made fdattack's own ``basicConfig`` a no-op (no INFO lines, and
warnings with a foreign prefix)."""

from __future__ import annotations

import logging
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fdattack.tracking.logs import LOGGER, configure_logging
from tests.conftest import REPO

OPACUS_FIRST = "import opacus, sys\nfrom fdattack.cli import main\nsys.exit(main(sys.argv[1:]))"


def test_a_batch_run_prints_its_steps_and_scores_after_opacus_configured_logging(tmp_path: Path) -> None:
    args = [
        "run",
        "attacks=[ldia]",
        "protocol.rounds=1",
        "protocol.num_clients=2",
        f"output_dir={tmp_path / 'run'}",
        "logger.wandb.mode=disabled",
        "logger.progress=never",
        "protocol.transfer_public_epochs=1",  # the run's size is not what is tested: its INFO lines are
        "protocol.transfer_private_epochs=1",
        "data.max_per_class=30",
    ]
    proc = subprocess.run([sys.executable, "-c", OPACUS_FIRST, *args], capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    stamp = re.compile(r"^\[\d{2}:\d{2}:\d{2}\] ")  # no terminal: each line says when it ran (issue 58)
    lines = proc.stderr.splitlines()
    assert all(stamp.match(line) for line in lines if not line.startswith("fdattack: results")), lines
    messages = [stamp.sub("", line) for line in lines]
    assert "loading data (digits)" in messages and "round 1: attack ldia" in messages  # our messages, no other prefix
    assert [line for line in messages if line.startswith("round 1  ldia: KL ")], lines
    assert not [line for line in messages if line.startswith(("INFO", "WARNING")) or ":fdattack" in line]


def test_on_a_terminal_a_line_is_the_message_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    try:
        configure_logging("INFO")
        for stream, expected in ((Terminal(), "a step\n"), (io.StringIO(), None)):
            monkeypatch.setattr(sys, "stderr", stream)
            LOGGER.info("a step")
            written = stream.getvalue()
            assert written == expected if expected else re.fullmatch(r"\[\d{2}:\d{2}:\d{2}\] a step\n", written), written
    finally:
        configure_logging("INFO")


def test_configuring_twice_keeps_one_handler_and_the_latest_level() -> None:
    try:
        configure_logging("INFO")
        configure_logging("WARNING")
        own = [h for h in LOGGER.handlers if type(h).__name__ == "_OwnHandler"]
        assert len(own) == 1 and LOGGER.level == logging.WARNING and not LOGGER.propagate
    finally:
        configure_logging("INFO")


def test_a_line_logged_while_a_progress_bar_shows_is_written_once(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 58: the handler was no console ``StreamHandler``, so tqdm's redirect wrote each line beside it: twice, the
    first copy glued to the bar."""
    from fdattack.tracking.progress import Progress

    try:
        configure_logging("INFO")
        bar = Progress("always", total_rounds=2)
        LOGGER.info("a line while the bar shows")
        bar.close()
        LOGGER.info("a line after it")
        err = capsys.readouterr().err
        assert err.count("a line while the bar shows") == 1 and err.count("a line after it") == 1
    finally:
        configure_logging("INFO")
