"""Rounding uploads to d decimals: a coarse, deterministic quantisation of what a client releases."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from fdattack.defenses.base import DEFENSES, Release, UploadDefense
from fdattack.knobs import knob


@dataclass
class RoundingSettings:
    decimals: int = knob(2, "d: every uploaded value is rounded to d decimals", ge=0)


@DEFENSES.register("rounding")
class RoundingDefense(UploadDefense):
    """Rounds every logit or probability to ``decimals`` decimals (half to even, as ``torch.round``).

    Probabilities are rounded as sent and not renormalised (rows may sum to 1 ± J·10^-d/2): the
    receiver sees exactly the rounded numbers. The payload stays float32 on the wire (size unchanged).
    """

    name = "rounding"
    Settings = RoundingSettings

    def transform(self, payload: Tensor, release: Release) -> Tensor:
        return torch.round(payload, decimals=int(self.settings.decimals))
