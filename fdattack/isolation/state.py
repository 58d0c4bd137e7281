"""An attack's checkpointed state, whichever mode saved it, as an attack in the run's own process reads it."""

from __future__ import annotations

import io
import pickle

import torch

from fdattack.errors import CheckpointError


def in_process_state(saved: dict, attack: str) -> dict:
    """``saved`` as the attack's ``load_state_dict`` takes it: an in-process state as it is; a worker's
    (``{"isolation": ...}``, from ``isolation.mode=process``) read as plain tensors and containers only
    (``torch.load(weights_only=True)``: a worker's bytes may come from code that must not run here).

    Raises:
        CheckpointError: the worker's state holds more than plain data, or the worker had been stopped.
    """
    isolated = saved.get("isolation") if type(saved) is dict else None
    if isolated is None:
        return saved
    if "stopped" in isolated:
        raise CheckpointError(
            f"attack {attack} was stopped in that run ({isolated['stopped'][1]}); "
            "resume it with isolation.mode=process, which keeps it stopped"
        )
    try:
        return torch.load(io.BytesIO(isolated["state"]), weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError) as err:
        reason = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
        raise CheckpointError(
            f"attack {attack}'s state was saved by its worker and holds more than plain tensors ({reason}); "
            "resume with isolation.mode=process"
        ) from None
