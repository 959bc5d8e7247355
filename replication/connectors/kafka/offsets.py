"""Driver-side offsets of the Kafka source: Spark's offset JSON, micro-batch limits, task ranges, the offset probe."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from pyspark.sql.datasource import InputPartition

if TYPE_CHECKING:
    from kafka import KafkaConsumer, TopicPartition

    from replication.connectors.kafka.security import KafkaSecurity

#: How often the driver refreshes topic metadata to notice new topics/partitions.
METADATA_REFRESH_S = 1.0

#: In memory, offsets are ``{(topic, partition): next_offset}``.
Positions = dict[tuple[str, int], int]


class KafkaTopics(Protocol):
    """What the offsets and range reads need of the source's options
    (:class:`replication.connectors.kafka.source.KafkaSourceOptions`)."""

    @property
    def bootstrap_servers(self) -> str: ...

    @property
    def topics(self) -> tuple[str, ...]: ...

    @property
    def security(self) -> KafkaSecurity: ...


@dataclass(frozen=True)
class KafkaInputPartition(InputPartition):
    """Offsets ``[start, end)`` of one Kafka partition: one Spark task."""

    topic: str
    partition: int
    start: int
    end: int


def decode_offset(offset: Mapping[str, Mapping[str, int]] | None) -> Positions:
    """Spark's JSON offset ``{"topic": {"0": 5}}`` to ``{("topic", 0): 5}``."""
    return {(t, int(p)): int(o) for t, parts in (offset or {}).items() for p, o in parts.items()}


def encode_offset(positions: Positions) -> dict[str, dict[str, int]]:
    """``{("topic", 0): 5}`` to the JSON-friendly ``{"topic": {"0": 5}}`` (sorted, stable)."""
    out: dict[str, dict[str, int]] = {}
    for (topic, partition), offset in sorted(positions.items()):
        out.setdefault(topic, {})[str(partition)] = offset
    return out


def limit_positions(start: Positions, latest: Positions, max_offsets: int) -> Positions:
    """End positions that advance at most ``max_offsets`` in total beyond ``start``.

    The budget is shared in proportion to each partition's backlog (largest
    remainders get the leftover), so a busy partition cannot starve the others.
    """
    backlog = {tp: latest[tp] - start.get(tp, 0) for tp in latest}
    backlog = {tp: n for tp, n in backlog.items() if n > 0}
    total = sum(backlog.values())
    end = {tp: max(latest[tp], start.get(tp, 0)) for tp in latest}
    if total <= max_offsets:
        return end
    shares = {tp: max_offsets * n // total for tp, n in backlog.items()}
    leftover = max_offsets - sum(shares.values())
    by_remainder = sorted(backlog, key=lambda tp: (-(max_offsets * backlog[tp] % total), tp))
    for tp in by_remainder[:leftover]:
        shares[tp] += 1
    for tp, share in shares.items():
        end[tp] = start.get(tp, 0) + share
    return end


def split_ranges(ranges: list[KafkaInputPartition], min_count: int) -> list[KafkaInputPartition]:
    """Cut offset ranges into about ``min_count`` pieces, in proportion to their sizes.

    Pieces of one Kafka partition stay adjacent and in offset order, so rows
    collected in partition order keep Kafka's order.
    """
    if len(ranges) >= min_count:
        return ranges
    total = sum(r.end - r.start for r in ranges)
    out: list[KafkaInputPartition] = []
    for r in ranges:
        size = r.end - r.start
        pieces = max(1, min(size, round(min_count * size / total)))
        bounds = [r.start + size * i // pieces for i in range(pieces + 1)]
        out += [KafkaInputPartition(r.topic, r.partition, a, b) for a, b in zip(bounds, bounds[1:])]
    return out


# -- driver: where the partitions start and end --------------------------------


class _OffsetProbe:
    """The driver's view of the topics: their partitions, earliest and latest offsets.

    Keeps one consumer (no group) for the life of the stream reader.
    """

    def __init__(self, options: KafkaTopics) -> None:
        from kafka import KafkaConsumer

        self.options = options
        self._consumer: KafkaConsumer = KafkaConsumer(
            bootstrap_servers=options.bootstrap_servers.split(","),
            **options.security.kafka_python(),
            group_id=None,
            enable_auto_commit=False,
            allow_auto_create_topics=False,
            # Read uncommitted, as the range reads: the latest offset is the high watermark.
            isolation_level="read_uncommitted",
        )
        self._refreshed_at = float("-inf")
        self._existing: set[str] = set()

    def close(self) -> None:
        self._consumer.close()

    def topic_partitions(self, refresh: bool = False) -> list[TopicPartition]:
        """Partitions of the configured topics that exist now (missing topics: none)."""
        from kafka import TopicPartition

        now = time.monotonic()
        if refresh or now - self._refreshed_at >= METADATA_REFRESH_S:
            # A full metadata refresh sees new topics and partitions. Asking
            # partitions_for_topic() about a missing topic would refresh again,
            # and kafka-python spaces refreshes 100 ms apart: so ask only about
            # the topics this refresh found.
            self._existing = self._consumer.topics()
            self._refreshed_at = now
        return [
            TopicPartition(topic, p)
            for topic in self.options.topics
            if topic in self._existing
            for p in sorted(self._consumer.partitions_for_topic(topic) or ())
        ]

    def earliest(self) -> Positions:
        tps = self.topic_partitions(refresh=True)
        if not tps:
            return {}
        return {(tp.topic, tp.partition): o for tp, o in self._consumer.beginning_offsets(tps).items()}

    def latest(self, refresh: bool = False) -> Positions:
        """The high watermark (offset of the next record) of every partition: one ListOffsets request."""
        tps = self.topic_partitions(refresh)
        if not tps:
            return {}
        return {(tp.topic, tp.partition): o for tp, o in self._consumer.end_offsets(tps).items()}
