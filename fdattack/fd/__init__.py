"""The protocol side and the wire: the federated protocols (``protocols/``), their aggregation rules, and the types
that cross to the attacker (``record``, ``threat``, ``adversary``, ``observer``, ``boundary``, ``answering``).

Contract: never imports ``attacks`` or ``evaluation``; trains through :mod:`fdattack.engine`; what an attack receives
is a plain copy of what the threat model grants, and nothing that leads back to a network or a private sample.
"""
