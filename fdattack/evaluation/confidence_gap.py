"""The confidence gap of PLI (Takahashi et al., CVPR 2023, §3.2, Fig. 3): entropy of client and server outputs.

A client trained on private sensitive-domain images is confident (low entropy) on them; the server
model, which never saw that domain, is not. This diagnostic measures H(softmax(f(x))) (natural log,
tau = 1) for the server and every client, on the public set and on the clients' private sets, after
every round. It reads private data, so it is an evaluation-side diagnostic, not an attack.

Each histogram is binned here, into ``evaluation.confidence_gap.bins`` equal bins over [0, log J] (J the models'
outputs: the whole range an entropy can take), so that rounds and runs share their bins; W&B gets the counts as
they are (``wandb.Histogram(np_histogram=...)``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from fdattack.evaluation.oracle import Oracle
from fdattack.evaluation.report import Report
from fdattack.functional import softmax_entropy
from fdattack.knobs import knob


@dataclass
class ConfidenceGapSettings:
    enabled: bool = knob(True, "log entropy histograms of client and server outputs on public and private data (PLI spec section 6)")
    bins: int = knob(20, "histogram bins over [0, log J]", ge=2)
    max_samples: int = knob(512, "samples per data set used for the histograms", ge=1)


class ConfidenceGapDiagnostic:
    """Logs entropy histograms ``diag/confidence_gap/{client,server}_{public,private}_entropy`` and their means.

    Args:
        oracle: ground-truth access (private sets, models).
        max_samples: rows per data set used (the first ones, so rounds are comparable).
        bins: equal-width histogram bins over [0, log J].
    """

    name = "confidence_gap"

    def __init__(self, oracle: Oracle, max_samples: int = 512, bins: int = 20) -> None:
        self.oracle = oracle
        self.max_samples = max_samples
        self.bins = bins

    def histogram(self, entropies: Tensor) -> tuple[Tensor, Tensor]:
        """``(counts (bins,), edges (bins + 1,))`` of ``entropies`` over [0, log J] (values clamped into it)."""
        top = math.log(self.oracle.split.num_classes)
        return torch.histogram(entropies.detach().double().cpu().clamp(0, top), bins=self.bins, range=(0.0, top))

    def report(self) -> Report:
        """The entropies of the models as they are now (called at the end of every round)."""
        split, cap = self.oracle.split, self.max_samples
        public = split.public.images[:cap]
        privates = [p.images[:cap] for p in split.private]
        client_public = torch.cat([softmax_entropy(self.oracle.predict(h, public)) for h in self.oracle.clients])
        client_private = torch.cat([softmax_entropy(self.oracle.predict(h, x)) for h, x in zip(self.oracle.clients, privates)])
        values = {"client_public_entropy": client_public, "client_private_entropy": client_private}
        if self.oracle.server is not None:
            values["server_public_entropy"] = softmax_entropy(self.oracle.predict(self.oracle.server, public))
            values["server_private_entropy"] = softmax_entropy(self.oracle.predict(self.oracle.server, torch.cat(privates)))
        prefix = f"diag/{self.name}/"
        out = Report(histograms={prefix + k: self.histogram(v) for k, v in values.items()})
        out.metrics = {prefix + k.replace("_entropy", "_mean"): float(v.mean()) for k, v in values.items()}
        if "server_private_entropy" in values:
            out.metrics[prefix + "private_gap"] = float(values["server_private_entropy"].mean() - client_private.mean())
        return out
