"""Two publishers using one client name at once (AMPS: an error), found from their sessions.

A publisher that sets the ``amps-session`` header (``replication.client.Publisher``
does: one session per publisher object) names its session on its logon and on
every publish. All records of one client name are in one Kafka partition (the
client name is the record key), in the order they were sent. When a client
logs on with a new session, an earlier session of that name that was alive
stopped before the logon was sent, unless it is a clash: so a record of the
earlier session *after* the new session's logon means two publishers hold the
name at the same time. Then the second logon (the newer session) is answered
with a failure ack naming the clash, the instance logs it and its heartbeat
lists it; messages of both go on being deduplicated by their sequence numbers,
which is why AMPS refuses the second connection.

A publisher that sends no session (any Kafka client) is not checked.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

from replication.messages import LOGON


@dataclass(frozen=True)
class Clash:
    """Two sessions publishing as ``client`` at once: ``earlier`` kept publishing after ``later`` logged on."""

    client: str
    earlier: str
    later: str
    at: float = field(default_factory=time.time, compare=False)

    @property
    def reason(self) -> str:
        return (f"client name {self.client!r} is in use by another publisher (session {self.earlier}) that is "
                f"still publishing: two publishers must not share a client name (their sequence numbers "
                f"collide and messages are dropped as duplicates). Give this publisher a name of its own")


#: Sessions remembered per client name as replaced: a name reused by many short runs stays bounded.
MAX_REPLACED = 16


@dataclass
class _Client:
    session: str
    """The latest session to log on (or, before any logon, to publish)."""
    replaced: list[str] = field(default_factory=list)
    """Sessions a later logon took the name from (the last :data:`MAX_REPLACED`)."""


class ClientSessions:
    """Follows the sessions of each client name across batches (the ingest writer's thread)."""

    def __init__(self) -> None:
        self._clients: dict[str, _Client] = {}
        self.clashes: dict[str, Clash] = {}
        """The last clash of each client name."""
        self._before: tuple[int | None, dict[str, _Client]] | None = None
        """(batch id, the state before it): a batch seen again (replayed after a failure) starts from there."""

    def observe(self, batch: pa.Table, batch_id: int | None = None) -> list[Clash]:
        """The clashes the batch's records show, in order (each pair of sessions reported once). A batch
        observed again (the same ``batch_id``, replayed after a failure) is observed from the state before it."""
        if batch_id is not None and self._before is not None and self._before[0] == batch_id:
            self._clients = copy.deepcopy(self._before[1])
        if "session" not in batch.column_names or batch["session"].null_count == batch.num_rows:
            return []
        self._before = (batch_id, copy.deepcopy(self._clients))
        rows = batch.select(["publisher", "session", "command"]).filter(pc.is_valid(batch["session"]))
        found = []
        for client, session, command in zip(rows["publisher"].to_pylist(), rows["session"].to_pylist(),
                                            rows["command"].to_pylist(), strict=True):
            if not client:
                continue
            state = self._clients.get(client)
            if state is None:
                self._clients[client] = _Client(session)
                continue
            if command == LOGON and session != state.session:
                if state.session in state.replaced:
                    state.replaced.remove(state.session)
                state.replaced = [*state.replaced, state.session][-MAX_REPLACED:]
                state.session = session
            elif session in state.replaced:
                clash = Clash(client, session, state.session)
                state.replaced.remove(session)  # said once per pair
                self.clashes[client] = clash
                found.append(clash)
        return found
