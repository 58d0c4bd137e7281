"""Laplace noise on uploaded logits (Xiao et al., DSN 2024, §VI-A, Fig. 8; the noise defense the FD papers compare against)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from fdattack.defenses.base import DEFENSES, Release, UploadDefense
from fdattack.knobs import knob


def laplace_noise(shape: torch.Size, scale: float, generator: torch.Generator) -> Tensor:
    """Laplace(0, scale) samples by the inverse CDF of a seeded uniform (torch.distributions takes no generator)."""
    u = torch.rand(shape, generator=generator, dtype=torch.float64) - 0.5
    return -scale * torch.sign(u) * torch.log((1 - 2 * u.abs()).clamp_min(1e-300))


@dataclass
class LaplaceSettings:
    scale: float = knob(1.0, "b, the Laplace scale of the noise added to every logit (0 = no noise)", ge=0)


@DEFENSES.register("laplace")
class LaplaceDefense(UploadDefense):
    """Adds i.i.d. Laplace(0, b) noise to every logit a client releases.

    Logit payloads get the noise directly. Probability payloads (DS-FL, Cronus) get it on their
    logarithm, the logits up to a per-row constant, and are renormalised: softmax(log q + n), which is
    the same noise on the logits at temperature 1 and keeps the payload a distribution. The noise is
    drawn from (run seed, round, phase, client, inputs), so a release is reproducible and the same
    question in the same phase gets the same answer.
    """

    name = "laplace"
    Settings = LaplaceSettings

    def transform(self, payload: Tensor, release: Release) -> Tensor:
        b = float(self.settings.scale)
        if b == 0:
            return payload
        sample = laplace_noise(payload.shape, b, release.generator(self.seed, self.name)).to(payload.dtype)
        if release.kind == "logits":
            return payload + sample
        log_q = torch.log(payload.clamp_min(torch.finfo(payload.dtype).tiny))
        return torch.softmax(log_q + sample, dim=-1)
