"""Where a run ran: the machine facts that move a figure (CPU model, the instruction set torch's CPU kernels use, cores,
torch's threads and version, the devices), written to ``machine.json`` in the run directory and into the W&B config
under ``machine``, so that a figure can be traced to its machine (float results differ in their last digits across CPU
instruction sets and thread counts)."""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any

import torch


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``'s ``model name`` on Linux, else ``platform.processor()``)."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Hardware", "cpu model") and value.strip():
                return value.strip()
    return platform.processor() or platform.machine() or "unknown"


def machine_info(accelerator: str | None = None) -> dict[str, Any]:
    """The machine a run runs on.

    Args:
        accelerator: the run's ``trainer.accelerator`` (recorded as asked), or None.
    """
    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "cpu_model": cpu_model(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),  # e.g. AVX512, AVX2: which kernels torch dispatches to
        "cpu_cores": os.cpu_count(),
        "cpu_cores_usable": affinity,
        "torch_threads": torch.get_num_threads(),
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda,
        "gpus": gpus,
        "accelerator": accelerator,
        "python_version": platform.python_version(),
        "platform": platform.platform(),
        "hostname": platform.node(),
    }
