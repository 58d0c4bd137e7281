"""The observer contract: what receives the round records the orchestrator publishes."""

from __future__ import annotations

from fdattack.fd.record import RoundRecord
from fdattack.randomness import GlobalStreams


class Observer:
    """Receives every :class:`~fdattack.fd.record.RoundRecord`, right after its phase, while its query is open.

    Attacks (:class:`fdattack.attacks.base.Attack`) are observers; so are test probes. Subclasses
    override what they need; ``state_dict``/``load_state_dict`` make them resumable.
    """

    name: str = "observer"

    def on_record(self, record: RoundRecord) -> None:
        """Called after every phase; ``record.query`` answers only during this call."""

    def receive(self, record: RoundRecord, streams: GlobalStreams) -> None:
        """How the orchestrator hands over a record: :meth:`on_record` with the global generators of this call
        (an isolated attack's stand-in sends both to its worker instead)."""
        with streams.active():
            self.on_record(record)

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`."""
