"""Rewrites of adjacent layers in a network's ``nn.Sequential`` blocks, for the vectorised path's template network
(:func:`fdattack.engine.vectorised._pool_first`, :func:`fdattack.engine.vectorised.kernels.conv_pool.fuse_conv_pool`)."""

from __future__ import annotations

import copy
from typing import Callable

from torch import nn


def rewrite_pairs(
    net: nn.Module, matches: Callable[[nn.Module, nn.Module], bool], rewrite: Callable[[nn.Module, nn.Module], tuple[nn.Module, nn.Module]]
) -> nn.Module:
    """``net`` itself where no two adjacent layers of an ``nn.Sequential`` ``matches``, else a deep copy in which every
    matching pair (first, second) is replaced by ``rewrite(first, second)``."""

    def pairs(module: nn.Module) -> list[tuple[nn.Sequential, int]]:
        return [(m, i) for m in module.modules() if isinstance(m, nn.Sequential) for i in range(len(m) - 1) if matches(m[i], m[i + 1])]

    if not pairs(net):
        return net
    net = copy.deepcopy(net)
    for sequential, i in pairs(net):
        sequential[i], sequential[i + 1] = rewrite(sequential[i], sequential[i + 1])
    return net
