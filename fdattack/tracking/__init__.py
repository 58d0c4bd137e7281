"""Run records: the run directory, atomic checkpoints, the W&B run, the progress display and the final summary.

Contract: writes what the run hands it (flat metrics, images, configs); knows no protocol, attack or ground truth, and
imports only pure math and errors.
"""

from fdattack.tracking.checkpoint import CheckpointDir, atomic_write, load_checkpoint, rng_state, save_checkpoint, set_rng_state
from fdattack.tracking.progress import Progress, progress_iter, progress_shown
from fdattack.tracking.run_dir import RunDirectory, to_jsonable
from fdattack.tracking.summary import attack_summary
from fdattack.tracking.wandb_run import WandbRun, has_credentials, resolve_mode

__all__ = [
    "CheckpointDir",
    "Progress",
    "RunDirectory",
    "WandbRun",
    "atomic_write",
    "attack_summary",
    "has_credentials",
    "load_checkpoint",
    "progress_iter",
    "progress_shown",
    "resolve_mode",
    "rng_state",
    "save_checkpoint",
    "set_rng_state",
    "to_jsonable",
]
