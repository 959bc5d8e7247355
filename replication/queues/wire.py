"""How queue consumers and an instance talk over Kafka: commands in, deliveries out.

In, on the instance's publish topic (key: the client name):

=====================  =====================================================================================
record                 headers and body
=====================  =====================================================================================
subscribe              ``amps-command: subscribe``, ``amps-client``, ``amps-topic`` (the queue); body: JSON
                       ``{"filter": "<content filter>", "max_backlog": N}`` (both optional). Sent again every
                       :data:`HEARTBEAT_S` by a live consumer: one silent for :data:`SILENT_AFTER_S` is gone.
unsubscribe            ``amps-command: unsubscribe``, ``amps-client``, ``amps-topic``.
acknowledgement        ``amps-command: sow_delete``, ``amps-client``, ``amps-seq``, ``amps-topic`` (the queue),
                       ``amps-sow-keys``: the bookmarks acknowledged, comma-separated (a queue's records are
                       keyed by bookmark, as in AMPS); no body. Stored in the txlog like any sow_delete by
                       keys, and answered with a persisted or failure ack like any publish.
=====================  =====================================================================================

Between instances, through their txlogs (replicated like acknowledgements), an instance's own rows as client
``<instance>.queues``: ``transfer_request`` (a non-owner asks the owner for messages) and ``transfer`` (the
owner grants them), and the ``sow_delete`` that removes an at-most-once message it delivered.

Out, on ``<instance>.deliveries`` (:func:`deliveries_topic`, created with :data:`DELIVERY_PARTITIONS`
partitions), one record per delivery, in the partition :func:`delivery_partition` of the client, so each
consumer reads its own deliveries and few others': key the client name,
value the message body, headers ``amps-topic`` (the queue), ``amps-bookmark``, ``amps-underlying-topic``,
``amps-lease-expires`` (epoch milliseconds; 0 for an at-most-once queue: nothing to acknowledge) and
``amps-instance``. A refused subscription is answered on ``<instance>.acks``:
``{"client", "instance", "status": "failure", "subscribe": <queue>, "reason"}``.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass

SUBSCRIBE = "subscribe"
UNSUBSCRIBE = "unsubscribe"
#: Commands of queue consumers that are answered, never stored.
QUEUE_COMMANDS = (SUBSCRIBE, UNSUBSCRIBE)
#: Queue management rows, stored and replicated like acknowledgements: a non-owner asking for messages, and
#: the owner's grant. Body: JSON ``{"bookmarks": [...], "to": <instance>}`` (``to``: who asks, or who now
#: owns). Only an instance records them, as its client :func:`manager_client`.
TRANSFER_REQUEST = "transfer_request"
TRANSFER = "transfer"
QUEUE_MANAGEMENT = (TRANSFER_REQUEST, TRANSFER)

HEADER_BOOKMARK = "amps-bookmark"
HEADER_UNDERLYING_TOPIC = "amps-underlying-topic"
HEADER_LEASE_EXPIRES = "amps-lease-expires"
HEADER_INSTANCE = "amps-instance"

#: How often a live consumer subscribes again.
HEARTBEAT_S = 2.0
#: A subscriber not heard from for this long is gone: its leased messages return to the queue.
SILENT_AFTER_S = 5 * HEARTBEAT_S
#: Messages a subscriber may hold unacknowledged when it names no ``max_backlog``.
DEFAULT_MAX_BACKLOG = 10


#: Partitions of a deliveries topic the instance creates. A consumer reads one: with several consumers, each
#: decodes its own deliveries (and those of the few clients that share its partition), not every consumer's.
DELIVERY_PARTITIONS = 16


def deliveries_topic(instance: str) -> str:
    return f"{instance}.deliveries"


def delivery_partition(client: str, partitions: int) -> int:
    """The partition of a deliveries topic with ``partitions`` partitions that carries ``client``'s deliveries
    (CRC-32 of its name, so any client library computes the same)."""
    return zlib.crc32(client.encode()) % partitions


def manager_client(instance: str) -> str:
    """The client name under which an instance records its own queue management rows (at-most-once removals)."""
    return f"{instance}.queues"


@dataclass(frozen=True)
class QueueRequest:
    """A ``subscribe`` or ``unsubscribe`` a consumer sent this instance."""

    client: str
    command: str
    topic: str
    body: bytes = b""
    session: str | None = None
    """The consumer's session (``amps-session``): a new one is a restarted consumer, whose old leases end."""

    def options(self) -> tuple[str | None, int]:
        """``(filter text, max_backlog)`` of a subscribe; raises ValueError naming what is wrong."""
        if not self.body.strip():
            return None, DEFAULT_MAX_BACKLOG
        try:
            given = json.loads(self.body)
        except ValueError:
            raise ValueError("the subscribe body is not JSON: send {\"filter\": ..., \"max_backlog\": N}") from None
        if not isinstance(given, dict):
            raise ValueError("the subscribe body must be a JSON object: {\"filter\": ..., \"max_backlog\": N}")
        flt, backlog = given.get("filter"), given.get("max_backlog", DEFAULT_MAX_BACKLOG)
        if flt is not None and not isinstance(flt, str):
            raise ValueError("filter must be a content filter string, e.g. \"/priority > 3\"")
        if not isinstance(backlog, int) or isinstance(backlog, bool) or backlog < 1:
            raise ValueError(f"max_backlog must be a whole number of at least 1, not {backlog!r}")
        return flt, backlog


@dataclass(frozen=True)
class Refusal:
    """A subscribe that cannot be taken: the client is told why."""

    client: str
    topic: str
    reason: str


def refusal_ack(refusal: Refusal, instance: str) -> bytes:
    """The failure ack a refused subscription gets on ``<instance>.acks``."""
    return json.dumps({"client": refusal.client, "instance": instance, "status": "failure",
                       "subscribe": refusal.topic, "reason": refusal.reason}, separators=(",", ":")).encode()


def transfer_body(bookmarks: list[str], to: str) -> bytes:
    return json.dumps({"bookmarks": bookmarks, "to": to}, separators=(",", ":")).encode()


def transfer_of(body: bytes | None) -> tuple[list[str], str]:
    """``(bookmarks, to)`` of a transfer request or grant."""
    given = json.loads(body or b"{}")
    return [str(b) for b in given.get("bookmarks", ())], str(given.get("to", ""))


def bookmarks_in(sow_keys: str | None) -> list[str]:
    """The bookmarks an acknowledgement names (its ``sow_keys``, comma-separated; blanks ignored)."""
    return [b for b in map(str.strip, sow_keys.split(",")) if b] if sow_keys else []
