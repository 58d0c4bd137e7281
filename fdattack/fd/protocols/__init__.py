"""The federated protocols, registered here by importing their modules (one line per protocol).

Contract: a protocol owns its clients and server, trains them through the engine, applies the defenses and declares
its threat model; what crosses the wire is made in :mod:`fdattack.fd.uploads` and published as round records.
"""

from fdattack.fd.protocols import cronus, dsfl, fedavg, fedgems, fedmd, labelavg  # noqa: F401  (registration)
from fdattack.fd.protocols.base import PROTOCOLS, Phase, Protocol, RoundContext

__all__ = ["PROTOCOLS", "Phase", "Protocol", "RoundContext"]
