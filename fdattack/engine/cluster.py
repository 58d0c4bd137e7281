"""Multi-node runs need a launcher: refuse ``trainer.num_nodes > 1`` at once where nothing could start the other nodes.

Lightning joins the nodes of a run through a cluster environment: torchrun / TorchElastic, SLURM, LSF or MPI, which it
detects from their variables, or, without one, the variables ``NODE_RANK`` and ``MASTER_ADDR`` set by hand on every
node. With none of them a run with ``num_nodes=2`` waits for a second node that nobody starts (issue 30).
"""

from __future__ import annotations

import os

from lightning.fabric.plugins.environments import LSFEnvironment, MPIEnvironment, SLURMEnvironment, TorchElasticEnvironment

from fdattack.errors import ConfigError

#: The variables that a hand-launched node must have (Lightning's ``LightningEnvironment``).
BY_HAND = ("NODE_RANK", "MASTER_ADDR")


def launcher_found() -> bool:
    """Whether a cluster environment that Lightning joins nodes through is present."""
    detected = any(env.detect() for env in (TorchElasticEnvironment, SLURMEnvironment, LSFEnvironment, MPIEnvironment))
    return detected or all(name in os.environ for name in BY_HAND)


def check_launcher(num_nodes: int) -> None:
    """Refuse a multi-node run that no launcher started.

    Raises:
        ConfigError: ``num_nodes > 1`` without torchrun, SLURM, LSF, MPI or ``NODE_RANK`` and ``MASTER_ADDR``.
    """
    if num_nodes > 1 and not launcher_found():
        raise ConfigError(
            f"trainer.num_nodes={num_nodes} needs a launcher that starts every node (torchrun, srun, jsrun, mpirun, or "
            f"{' and '.join(BY_HAND)} set on each node); none was found, so the run would wait for nodes that never come"
        )
