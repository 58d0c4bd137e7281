"""The words every side shares: what a protocol (or the data split) can offer an attack or a defense
(:class:`Capability`, checked against what each declares it needs) and what an upload carries (:data:`PayloadKind`).

They sit on the ground floor so that the defenses, the attacks and the configuration read them without reaching into
the protocol side; :mod:`fdattack.fd.threat` and :mod:`fdattack.fd.record` use them as their own.
"""

from __future__ import annotations

from enum import Enum
from typing import Literal

#: what a client's upload holds: outputs on public data (before or after softmax) or a model's weights (FedAvg)
PayloadKind = Literal["logits", "probs", "weights"]


class Capability(str, Enum):
    """What an attack or defense may need and a protocol may offer; compatibility is checked from these.

    Four are the active server's documented powers (DESIGN.md's ``Adversary``), reached only through
    :class:`~fdattack.fd.adversary.Adversary`; the last two are offered by the data split, not the protocol.
    """

    public_data = "public_data"  #: the public set (labels only with public_labels)
    public_outputs = "public_outputs"  #: clients' outputs on public rows, through a record's phase-bound query
    public_labels = "public_labels"  #: the public set's labels
    server_model = "server_model"  #: a server model f_0 whose outputs the attacker reads
    white_box = "white_box"  #: the global model's weights every round
    output_uploads = "output_uploads"  #: clients upload outputs on public data (what upload defenses transform)
    choose_public_batch = "choose_public_batch"  #: pick the public rows of the next round
    add_public_samples = "add_public_samples"  #: add attacker-made images to the next round's public batch
    send_aggregate = "send_aggregate"  #: send one client a chosen aggregate this round
    query_chosen_batch = "query_chosen_batch"  #: ask a client for its outputs on attacker-chosen images
    aggregation_rule = "aggregation_rule"  #: the server's own aggregation rule, to apply to uploads of its choosing
    private_targets = "private_targets"  #: the data's target labels have no image in the public set (the split's, not the protocol's)
    prior_data = "prior_data"  #: the attacker holds labeled data of its own (the split's, not the protocol's)
    fixed_targets = "fixed_targets"  #: every private class is a target, fixed by the config, so a class can be named in advance

    def __str__(self) -> str:
        return self.value


#: one line per capability, for error messages
CAPABILITY_TEXT = {
    Capability.public_data: "a public set",
    Capability.public_outputs: "the clients' outputs on public data",
    Capability.public_labels: "the public set's labels",
    Capability.server_model: "a server model f_0",
    Capability.white_box: "the global model's weights",
    Capability.output_uploads: "uploads of outputs on public data",
    Capability.choose_public_batch: "the power to choose the round's public rows",
    Capability.add_public_samples: "the power to add images to the round's public batch",
    Capability.send_aggregate: "the power to send one client a chosen aggregate",
    Capability.query_chosen_batch: "the power to query a client on chosen images",
    Capability.aggregation_rule: "the server's declared aggregation rule",
    Capability.private_targets: "target labels without images in the public set",
    Capability.prior_data: "labeled prior data of the attacker's own",
    Capability.fixed_targets: "every private class a target, fixed by the config (so a class can be named in advance)",
}

#: what the data split offers (:func:`fdattack.config.validation.data_offers`), not the protocol
DATA_CAPABILITIES = frozenset({Capability.private_targets, Capability.prior_data, Capability.fixed_targets})

#: the active powers of an honest-but-not-passive server that schedules the public batch
SERVER_POWERS = frozenset(
    {Capability.choose_public_batch, Capability.add_public_samples, Capability.send_aggregate, Capability.query_chosen_batch}
)
