"""Protocol registry: importing this package registers every protocol."""

from fdattack.fd.protocols import cronus, dsfl, fedavg, fedgems, fedmd, labelavg  # noqa: F401  (registration)
from fdattack.fd.protocols.base import PROTOCOLS, Phase, Protocol, RoundContext

__all__ = ["PROTOCOLS", "Phase", "Protocol", "RoundContext"]
