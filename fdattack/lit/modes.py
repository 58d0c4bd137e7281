"""The one eval-mode switch: inference passes run in eval mode and leave the module as they found it."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from torch import nn


@contextmanager
def eval_mode(module: nn.Module) -> Iterator[nn.Module]:
    """``with eval_mode(net):`` BatchNorm running statistics, no dropout; the previous mode is restored after."""
    was_training = module.training
    module.eval()
    try:
        yield module
    finally:
        module.train(was_training)
