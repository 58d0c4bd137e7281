"""One W&B run per experiment, which never prompts, never stalls for long, and without credentials never goes online.

``mode="auto"`` runs online where W&B's own credential lookup finds a key for the server ``wandb.init``
would use (``WANDB_API_KEY``; the netrc entry and the ``base_url`` that ``wandb login [--host URL]``
writes; a settings file's ``api_key``), and offline otherwise. An online start may take
``init_timeout_s`` seconds: after that ``auto`` logs offline (one line says so and where) and
``online`` stops with a :class:`~fdattack.errors.ConfigError`, leaving no files of the failed start.
``disabled`` never imports ``wandb`` and writes nothing.

Each round is one ``wandb.log`` call at ``step=round`` (scalars, histograms and images together), so
W&B's own step is the round, and a resumed run continues on the same steps; every metric also has
``round`` as its step metric. By default the run is named and grouped by the experiment, with job type
``run`` and the protocol, data, attack and defense names as tags.
"""

from __future__ import annotations

import logging
import math
import os
import shlex
import shutil
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType, TracebackType
from typing import Any

import torch

from fdattack.errors import ConfigError

log = logging.getLogger("fdattack")

MODES = ("auto", "online", "offline", "disabled")
#: the run directory's files in its ``results-<run id>`` artifact (:meth:`WandbRun.log_run_directory`), with ``images/``
RESULT_FILES = ("config.yaml", "partition.json", "rounds.jsonl", "metrics.json", "machine.json")

#: The values W&B itself accepts in the ``WANDB_MODE`` environment variable (``wandb.Settings.mode``).
WANDB_ENV_MODES = ("online", "offline", "shared", "disabled", "dryrun", "run")


def _wandb() -> ModuleType:
    """``wandb``, imported with its console output off (W&B reads ``WANDB_SILENT`` once per process)."""
    os.environ.setdefault("WANDB_SILENT", "true")
    import wandb

    return wandb


def server_url() -> str:
    """The W&B server ``wandb.init`` will use: ``WANDB_BASE_URL``, else the ``base_url`` that ``wandb login --host`` saved."""
    _wandb()
    from wandb.sdk import wandb_setup

    return str(wandb_setup.singleton().settings.base_url)


def has_credentials() -> bool:
    """Whether W&B finds an API key for :func:`server_url` without prompting, by its own lookup.

    Raises:
        ConfigError: a key or server URL was found but is malformed (W&B would refuse it).
    """
    wandb = _wandb()
    from wandb.sdk.lib import wbauth

    try:
        url = server_url()
        auth = wbauth.authenticate_session(host=url, source="fdattack", prompt=False, update_session=False)
    except (wandb.errors.Error, ValueError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ConfigError(f"W&B credentials are unusable: {first}; run `wandb login --relogin` or use logger.wandb.mode=offline") from None
    return auth is not None


def resolve_mode(mode: str) -> str:
    """Turn a configured mode into the one W&B runs in.

    ``auto`` honours ``WANDB_MODE=offline|dryrun|disabled`` from the environment, otherwise it is
    ``online`` with usable credentials and ``offline`` without (unusable ones are named in one line).

    Raises:
        ConfigError: an unknown mode, a ``WANDB_MODE`` that W&B would refuse, or ``online`` without usable credentials
            (which would prompt).
    """
    if mode not in MODES:
        raise ConfigError(f"logger.wandb.mode={mode!r} is not allowed; choose one of: {' | '.join(MODES)}")
    env_mode = os.environ.get("WANDB_MODE", "")
    if mode != "disabled" and env_mode and env_mode not in WANDB_ENV_MODES:  # W&B would fail on it with a traceback
        raise ConfigError(
            f"environment variable WANDB_MODE={os.environ['WANDB_MODE']!r} is not a W&B mode; unset it or set one of: "
            f"{' | '.join(WANDB_ENV_MODES)} (or pass logger.wandb.mode=disabled)"
        )
    if mode == "auto":
        if env_mode in ("offline", "dryrun", "disabled"):
            return "disabled" if env_mode == "disabled" else "offline"
        try:
            return "online" if has_credentials() else "offline"
        except ConfigError as err:
            log.warning("%s; logging offline", err)
            return "offline"
    if mode == "online" and not has_credentials():
        raise ConfigError(
            f"logger.wandb.mode=online but no W&B credentials were found for {server_url()} (set WANDB_API_KEY "
            "or run `wandb login`); use logger.wandb.mode=auto or offline to log locally"
        )
    return mode


def run_identity(cfg: Any, config: dict) -> dict[str, Any]:
    """Name, group, job type and tags of the W&B run: the ``logger.wandb`` ones where set, else derived.

    Args:
        cfg: the ``logger.wandb`` node (``name``, ``group``, ``job_type``, ``tags``).
        config: the resolved experiment config (``name``, ``protocol.name``, ``data.name``, ``attacks``, ``defenses``).

    Returns:
        ``name`` and ``group``: the experiment name; ``job_type``: ``run``; ``tags``: the protocol, data,
        attack and defense names followed by ``logger.wandb.tags``.
    """
    experiment = config.get("name")
    derived = [
        (config.get("protocol") or {}).get("name"),
        (config.get("data") or {}).get("name"),
        *(config.get("attacks") or []),
        *(config.get("defenses") or []),
    ]
    tags = list(dict.fromkeys(str(tag) for tag in [*derived, *(cfg.tags or [])] if tag))
    return {"name": cfg.name or experiment, "group": cfg.group or experiment, "job_type": cfg.job_type or "run", "tags": tags}


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


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0]}" if text else type(err).__name__


def _remove_new_entries(folder: Path, before: set[Path] | None) -> None:
    """Delete what appeared in ``folder`` since ``before`` was listed (the whole folder when it did not exist)."""
    if before is None:
        shutil.rmtree(folder, ignore_errors=True)
        return
    for path in set(folder.iterdir()) - before:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


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
    def start(cls, cfg: Any, run_dir: Path, config: dict, resume_id: str | None = None, identity: dict[str, Any] | None = None) -> WandbRun:
        """Start (or resume) the W&B run of one experiment.

        Args:
            cfg: a ``WandbConfig`` (or its DictConfig node): mode, project, entity, name, group, job_type,
                tags, init_timeout_s.
            run_dir: the run directory; W&B writes ``run_dir/wandb/``.
            config: the resolved experiment config, stored as the run's config (and the source of
                :func:`run_identity`).
            resume_id: the id of the run to continue (from a checkpoint); None starts a new one.
            identity: ``name``, ``group``, ``job_type`` and ``tags`` of the run; None derives them
                (:func:`run_identity`).

        Raises:
            ConfigError: an unknown mode; ``online`` without credentials, or not started within
                ``init_timeout_s`` (the failed start's files are removed).
        """
        requested = str(cfg.mode)
        mode = resolve_mode(requested)
        if mode == "disabled":
            return cls(None, mode)
        wandb = _wandb()
        folder = Path(run_dir) / "wandb"
        before = set(folder.iterdir()) if folder.is_dir() else None
        folder.mkdir(parents=True, exist_ok=True)
        timeout = float(cfg.init_timeout_s)
        kwargs = dict(
            project=cfg.project,
            entity=cfg.entity,
            config=config,
            dir=str(run_dir),
            id=resume_id,
            resume="allow" if resume_id else None,
            reinit="create_new",
            **(identity or run_identity(cfg, config)),
        )

        def init(run_mode: str) -> Any:  # offline as online: the console log and system metrics, for `wandb sync`
            settings = wandb.Settings(
                silent=True,
                disable_git=True,
                save_code=False,
                x_save_requirements=False,
                console="auto",
                init_timeout=timeout,
            )
            return wandb.init(mode=run_mode, settings=settings, **kwargs)

        try:
            run = init(mode)
        except Exception as err:  # W&B's errors and anything its start raises: the run has not begun
            if mode != "online":
                raise
            _remove_new_entries(folder, before)
            reason = f"W&B did not start online at {server_url()} within {timeout:g} s ({_first_line(err)})"
            if requested == "online":
                raise ConfigError(
                    f"logger.wandb.mode=online: {reason}; check the network or raise logger.wandb.init_timeout_s, "
                    "or use logger.wandb.mode=offline and `wandb sync` later"
                ) from None
            folder.mkdir(parents=True, exist_ok=True)
            mode, run = "offline", init("offline")
            log.warning("%s; logging offline to %s", reason, Path(run.dir).parent)
        run.define_metric("round")
        run.define_metric("*", step_metric="round")
        return cls(run, mode)

    @property
    def enabled(self) -> bool:
        """Whether anything is logged."""
        return self._run is not None

    def log_round(
        self,
        round: int,
        metrics: dict[str, Any],
        histograms: dict[str, torch.Tensor] | None = None,
        images: dict[str, torch.Tensor | Path | str] | None = None,
        num_bins: int = 64,
    ) -> None:
        """Log one round as one W&B step, ``step=round``.

        Args:
            round: the round index (0 = set-up), W&B's step.
            metrics: scalar metrics (tensors and numpy scalars are converted).
            histograms: tensors whose finite values become ``wandb.Histogram`` s (left out when none is finite), or
                ``(counts, edges)`` pairs logged as those bins.
            images: (C,H,W) or (H,W) tensors with values in [0, 1], or image files; captioned with the round.
        """
        if self._run is None:
            return
        wandb = _wandb()
        row: dict[str, Any] = {"round": round, **{key: _scalar(value) for key, value in metrics.items()}}
        for key, values in (histograms or {}).items():
            if isinstance(values, tuple):  # (counts, edges) binned by the diagnostic (evaluation.confidence_gap.bins)
                row[key] = wandb.Histogram(np_histogram=tuple(v.detach().cpu().numpy() for v in values))
                continue
            flat = values.detach().cpu().double().flatten()
            flat = flat[torch.isfinite(flat)]
            if flat.numel():
                row[key] = wandb.Histogram(flat.numpy(), num_bins=num_bins)
        for key, image in (images or {}).items():
            data = str(image) if isinstance(image, (str, Path)) else _image_array(image)
            row[key] = wandb.Image(data, caption=f"round {round}")
        self._run.log(row, step=round)

    def set_summary(self, metrics: dict[str, Any]) -> None:
        """Write ``metrics`` into the run summary (the final values shown in W&B tables)."""
        if self._run is None:
            return
        for key, value in metrics.items():
            value = _scalar(value)
            self._run.summary[key] = None if isinstance(value, float) and math.isnan(value) else value

    def log_tables(self, tables: dict[str, tuple[Sequence[str], list[list[Any]]]], images: dict[str, Path] | None = None) -> None:
        """Log tables and image files as one W&B step, for a run without rounds (the matrix summary).

        Args:
            tables: key -> (column names, rows), each a ``wandb.Table``.
            images: key -> an image file, each a ``wandb.Image`` captioned with the file's stem.
        """
        if self._run is None:
            return
        wandb = _wandb()
        row: dict[str, Any] = {key: wandb.Table(columns=list(columns), data=rows) for key, (columns, rows) in tables.items()}
        row.update({key: wandb.Image(str(path), caption=Path(path).stem) for key, path in (images or {}).items()})
        self._run.log(row)

    def log_run_directory(self, run_dir: Path, what: str, checkpoint: Path | None) -> None:
        """Upload the run directory as W&B artifacts (``logger.wandb.artifacts``; offline, with the run's ``wandb sync``).

        Args:
            run_dir: the run directory.
            what: ``all`` (``results-<run id>``, type ``fdattack-results``: :data:`RESULT_FILES`, ``images/`` and each
                round's tensors in ``artifacts/``, the reconstructions; and
                ``checkpoint-<run id>``, type ``model``: ``checkpoint``), ``results`` (the first only) or ``none``.
            checkpoint: the run's last checkpoint file (None: none was written).
        """
        if self._run is None or what == "none":
            return
        wandb = _wandb()
        results = wandb.Artifact(f"results-{self.run_id}", type="fdattack-results", metadata={"run_dir": str(run_dir)})
        for name in RESULT_FILES:
            if (run_dir / name).is_file():
                results.add_file(str(run_dir / name), name=name)
        if (run_dir / "images").is_dir() and any((run_dir / "images").iterdir()):
            results.add_dir(str(run_dir / "images"), name="images")
        for tensors in sorted((run_dir / "artifacts").glob("*_round_[0-9][0-9][0-9][0-9].pt")):  # not the cached networks
            results.add_file(str(tensors), name=f"artifacts/{tensors.name}")
        self._run.log_artifact(results)
        if what == "all" and checkpoint is not None and checkpoint.is_file():
            model = wandb.Artifact(f"checkpoint-{self.run_id}", type="model", metadata={"file": checkpoint.name})
            model.add_file(str(checkpoint), name=checkpoint.name)
            self._run.log_artifact(model, aliases=["latest", checkpoint.stem.replace("_", "-")])

    def finish(self, exit_code: int = 0) -> None:
        """Finish the run (idempotent); an offline run then says where it is and how to upload it."""
        run, self._run = self._run, None
        if run is None:
            return
        run.finish(exit_code=exit_code)
        if self.mode == "offline":
            log.info("W&B offline run in %s; upload it with: wandb sync %s", self.directory, shlex.quote(str(self.directory)))

    def __enter__(self) -> WandbRun:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if exc is None:
            self.finish(0)
            return
        code = exc.code if isinstance(exc, SystemExit) and isinstance(exc.code, int) else 130 if isinstance(exc, KeyboardInterrupt) else 1
        try:
            self.finish(code)
        except Exception as err:  # never hide the error that ended the run
            log.warning("W&B finish failed: %s", err)
