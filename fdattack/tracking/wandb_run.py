"""One W&B run per experiment, which never prompts and, without credentials, never goes online.

``mode="auto"`` runs online only where credentials exist (``WANDB_API_KEY``, or an entry for the
W&B host in ``$NETRC`` / ``~/.netrc``), and offline otherwise; a failed online start in ``auto``
falls back to offline. ``disabled`` never imports ``wandb`` and writes nothing. Every metric uses
``round`` as its step metric, so resumed runs and per-round images line up on the same axis.
"""

from __future__ import annotations

import logging
import math
import netrc
import os
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import urlparse

import torch

from fdattack.errors import ConfigError

log = logging.getLogger("fdattack")

MODES = ("auto", "online", "offline", "disabled")


def _wandb_host() -> str:
    """The API host whose netrc entry holds the W&B key (``WANDB_BASE_URL`` or api.wandb.ai)."""
    return urlparse(os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai").hostname or "api.wandb.ai"


def has_credentials() -> bool:
    """Whether W&B could log in without prompting: ``WANDB_API_KEY`` or a netrc entry for its host."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    path = Path(os.environ.get("NETRC") or Path.home() / ".netrc").expanduser()
    try:
        entry = netrc.netrc(str(path)).authenticators(_wandb_host())
    except (OSError, netrc.NetrcParseError):
        return False
    return bool(entry and entry[2])


def resolve_mode(mode: str) -> str:
    """Turn a configured mode into the one W&B runs in.

    ``auto`` honours ``WANDB_MODE=offline|dryrun|disabled`` from the environment, otherwise it is
    ``online`` with credentials and ``offline`` without.

    Raises:
        ConfigError: an unknown mode, or ``online`` without credentials (which would prompt).
    """
    if mode not in MODES:
        raise ConfigError(f"logger.wandb.mode={mode!r} is not allowed; choose one of: {' | '.join(MODES)}")
    if mode == "auto":
        env_mode = os.environ.get("WANDB_MODE", "").lower()
        if env_mode in ("offline", "dryrun", "disabled"):
            return "disabled" if env_mode == "disabled" else "offline"
        return "online" if has_credentials() else "offline"
    if mode == "online" and not has_credentials():
        raise ConfigError("logger.wandb.mode=online but no W&B credentials were found (set WANDB_API_KEY or run "
                          "`wandb login`); use logger.wandb.mode=auto or offline to log locally")
    return mode


def _scalar(value: Any) -> float | int | bool | None:
    """A Python number for W&B (tensors and numpy scalars converted)."""
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().item()
    elif hasattr(value, "item"):
        value = value.item()
    return value


def _image_array(image: torch.Tensor) -> Any:
    """(C,H,W) or (H,W) float image in [0, 1] → uint8 (H,W[,C]) numpy array."""
    array = image.detach().cpu().float().clamp(0, 1).mul(255).round().to(torch.uint8)
    if array.dim() == 3:
        array = array[0] if array.shape[0] == 1 else array.permute(1, 2, 0)
    return array.numpy()


class WandbRun:
    """A started W&B run (or a no-op stand-in when disabled); use :meth:`start` to create one.

    Args:
        run: the ``wandb`` run object, or None for a disabled run.
        mode: the resolved mode: ``online``, ``offline`` or ``disabled``.

    Attributes:
        run_id: the W&B run id, stored in checkpoints so a resumed run continues it; None when disabled.
        directory: the run's folder under ``run_dir/wandb/``; None when disabled.
    """

    def __init__(self, run: Any | None, mode: str) -> None:
        self._run = run
        self.mode = mode
        self.run_id: str | None = run.id if run is not None else None
        self.directory: Path | None = Path(run.dir).parent if run is not None else None

    @classmethod
    def start(cls, cfg: Any, run_dir: Path, config: dict, name: str, resume_id: str | None = None) -> WandbRun:
        """Start (or resume) the W&B run of one experiment.

        Args:
            cfg: a ``WandbConfig`` (or its DictConfig node): mode, project, entity, group, tags.
            run_dir: the run directory; W&B writes ``run_dir/wandb/``.
            config: the resolved experiment config, stored as the run's config.
            name: the run's display name.
            resume_id: the id of the run to continue (from a checkpoint); None starts a new one.

        Raises:
            ConfigError: an unknown mode, or ``online`` without credentials.
        """
        mode = resolve_mode(str(cfg.mode))
        if mode == "disabled":
            return cls(None, mode)
        import wandb

        os.environ.setdefault("WANDB_SILENT", "true")
        run_dir = Path(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        kwargs = dict(project=cfg.project, entity=cfg.entity, group=cfg.group, tags=list(cfg.tags or []) or None,
                      name=name, config=config, dir=str(run_dir), id=resume_id, resume="allow" if resume_id else None,
                      reinit="create_new")

        def init(run_mode: str) -> Any:
            lean = run_mode == "offline"  # offline: skip console capture and system probes (start-up time)
            settings = wandb.Settings(silent=True, disable_git=True, save_code=False, x_save_requirements=False,
                                      console="off" if lean else "auto", x_disable_stats=lean, x_disable_meta=lean,
                                      x_disable_machine_info=lean)
            return wandb.init(mode=run_mode, settings=settings, **kwargs)

        try:
            run = init(mode)
        except Exception as err:
            if str(cfg.mode) != "auto" or mode != "online":
                raise
            log.warning("W&B online start failed (%s: %s); logging offline to %s", type(err).__name__, err, run_dir / "wandb")
            mode, run = "offline", init("offline")
        run.define_metric("round")
        run.define_metric("*", step_metric="round")
        return cls(run, mode)

    @property
    def enabled(self) -> bool:
        """Whether anything is logged."""
        return self._run is not None

    def log_round(self, round: int, metrics: dict[str, Any]) -> None:
        """Log one round's scalar metrics against ``round``."""
        if self._run is not None:
            self._run.log({"round": round, **{k: _scalar(v) for k, v in metrics.items()}})

    def log_image(self, key: str, round: int, image: torch.Tensor | Path | str, caption: str = "") -> None:
        """Log an image: a (C,H,W) or (H,W) tensor with values in [0, 1], or an image file."""
        if self._run is None:
            return
        import wandb

        data = str(image) if isinstance(image, (str, Path)) else _image_array(image)
        self._run.log({"round": round, key: wandb.Image(data, caption=caption or None)})

    def log_histogram(self, key: str, round: int, values: torch.Tensor, num_bins: int = 64) -> None:
        """Log a histogram of ``values`` (non-finite values are left out)."""
        if self._run is None:
            return
        import wandb

        flat = values.detach().cpu().double().flatten()
        flat = flat[torch.isfinite(flat)]
        if flat.numel():
            self._run.log({"round": round, key: wandb.Histogram(flat.numpy(), num_bins=num_bins)})

    def set_summary(self, metrics: dict[str, Any]) -> None:
        """Write ``metrics`` into the run summary (the final values shown in W&B tables)."""
        if self._run is None:
            return
        for key, value in metrics.items():
            value = _scalar(value)
            self._run.summary[key] = None if isinstance(value, float) and math.isnan(value) else value

    def finish(self, exit_code: int = 0) -> None:
        """Finish the run (idempotent)."""
        run, self._run = self._run, None
        if run is not None:
            run.finish(exit_code=exit_code)

    def __enter__(self) -> WandbRun:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if exc_type is None:
            self.finish(0)
            return
        try:
            self.finish(1)
        except Exception as err:  # never hide the error that ended the run
            log.warning("W&B finish failed: %s", err)
