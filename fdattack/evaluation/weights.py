"""Network weights that a user names in the config (``evaluation.inversion.checkpoint``, ``.inception_weights``):
read and loaded with errors that name the key and what it accepts (exit status 2, no traceback)."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor, nn

from fdattack.errors import ConfigError


def read_state_dict(path: str, key: str, accepted: str) -> dict[str, Tensor]:
    """The state_dict in the file at ``path``: a plain one, or one under ``net`` (fdattack's own checkpoints).

    Args:
        path: the file (``~`` expanded).
        key: the config key that named it (for the error).
        accepted: what the key accepts, said in the error.

    Raises:
        ConfigError: the file is missing, is no torch file, or holds no dict of tensors.
    """
    file = Path(path).expanduser()
    if not file.is_file():
        raise ConfigError(f"{key}={path!r}: file not found (give {accepted})")
    try:
        payload = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as err:  # zipfile, pickle, EOF and torch errors alike
        reason = (str(err).strip().splitlines() or [type(err).__name__])[0][:160]
        raise ConfigError(f"{key}={path!r}: not a readable torch file ({reason})") from None
    state = payload.get("net", payload) if isinstance(payload, dict) else None
    if not isinstance(state, dict) or not state or not all(isinstance(v, Tensor) for v in state.values()):
        raise ConfigError(f"{key}={path!r}: holds no state_dict of a network (a dict of tensors, or one under 'net'; give {accepted})")
    return state


def load_weights(net: nn.Module, state: dict[str, Tensor], key: str, path: str, network: str, optional: str = "") -> None:
    """Load ``state`` into ``net``, allowing only missing entries whose names start with ``optional`` (if given).

    Raises:
        ConfigError: entries are missing, unexpected or misshapen for ``network`` (described in the error).
    """
    try:
        missing, unexpected = net.load_state_dict(state, strict=False)
    except RuntimeError as err:  # misshapen entries
        raise ConfigError(f"{key}={path!r} does not fit {network} ({str(err).splitlines()[-1].strip()})") from None
    missing = [k for k in missing if not (optional and k.startswith(optional))]
    if missing or unexpected:
        listed = "; ".join(
            f"{what}: {', '.join(keys[:3])}{', ...' if len(keys) > 3 else ''}"
            for what, keys in (("missing", missing), ("unexpected", unexpected))
            if keys
        )
        raise ConfigError(f"{key}={path!r} does not fit {network} ({listed})")


def require_finite(net: nn.Module, what: str, lr_key: str, lr: float) -> None:
    """Refuse a network that training left with NaN or inf weights: every score it gives would be NaN, recorded
    silently as null (a learning rate far too high does it).

    Raises:
        ConfigError: naming the network and its learning-rate key.
    """
    if not all(bool(torch.isfinite(p).all()) for p in net.parameters()):
        raise ConfigError(f"{what} diverged in training (its weights became NaN/inf) at {lr_key}={lr:g}; lower {lr_key}")
