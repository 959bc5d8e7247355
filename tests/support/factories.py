"""Builders for test configs and readers of what a user would look at (txlog rows, rejects)."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable

from replication.connectors.delta.tables import IdempotentAppender
from replication.messages import bookmark
from replication.txlog.schema import TXLOG_SCHEMA

#: When :func:`write_batches`'s first batch was published and persisted.
T0 = datetime(2026, 11, 23, 9, 30, 0, 250_000, tzinfo=timezone.utc)


def instance_xml(
    name: str,
    root: Path,
    bootstrap: str,
    *,
    group: str | None = None,
    txlog_topics: str = '<Topic><Name>.*</Name><MessageType>json</MessageType></Topic>',
    max_offsets: int | None = None,
    sow: str = "",
    replication: str = "",
    security: str = "",
    inbox_auth: str = "",
) -> str:
    """An instance config; ``inbox_auth``: ``<Authentication>``/``<Entitlement>`` of its incoming transport."""
    limit = f"<MaxOffsetsPerTrigger>{max_offsets}</MaxOffsetsPerTrigger>" if max_offsets else ""
    return f"""<?xml version="1.0"?>
<AMPSConfig>
  <Name>{name}</Name>
  <Group>{group or name}</Group>
  <Storage>{root / name}</Storage>
  <Transports>
    <Transport>
      <Name>json-kafka</Name>
      <Type>kafka</Type>
      <InetAddr>{bootstrap}</InetAddr>
      <Topic>{name}.publish</Topic>
      <MessageType>json</MessageType>
      {limit}
      {security}
    </Transport>
    <Transport>
      <Name>amps-replication</Name>
      <Type>amps-replication</Type>
      <InetAddr>{root / name}</InetAddr>
      {inbox_auth}
    </Transport>
  </Transports>
  <TransactionLog>
    {txlog_topics}
  </TransactionLog>
  {f"<SOW>{sow}</SOW>" if sow else ""}
  {replication}
</AMPSConfig>
"""


def write_config(directory: Path, name: str, bootstrap: str, **kwargs) -> Path:
    path = directory / f"{name}.xml"
    path.write_text(instance_xml(name, directory, bootstrap, **kwargs))
    return path


def txlog_rows(root: Path, name: str, columns: list[str] | None = None) -> pa.Table:
    return DeltaTable(str(root / name / "txlog")).to_pyarrow_table(columns=columns).sort_by("seq")


def rejected_rows(root: Path, name: str) -> list[dict]:
    return DeltaTable(str(root / name / "rejected")).to_pyarrow_table().to_pylist()


def assert_exactly_once(rows: pa.Table, expected: dict[str, int]) -> None:
    """Each publisher's 1..N present once, in publish order; ``seq`` strictly increasing, no gaps."""
    seqs = rows["seq"].to_pylist()
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs))) if seqs else True, "seq must be contiguous and increasing"
    by_publisher: dict[str, list[int]] = {}
    for pub, pseq in zip(rows["publisher"].to_pylist(), rows["publisher_seq"].to_pylist(), strict=True):
        by_publisher.setdefault(pub, []).append(pseq)
    assert {p: len(s) for p, s in by_publisher.items()} == expected
    for pub, got in by_publisher.items():
        assert got == list(range(1, expected[pub] + 1)), f"{pub}: not exactly 1..{expected[pub]} in order"


def wait_until(predicate, *, timeout: float = 120.0, interval: float = 0.2, what: str = "condition"):
    """Poll ``predicate`` until it returns a truthy value; fail the test with ``what`` on timeout."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def raw_publish(producer, topic: str, body: bytes, **headers: str | None) -> None:
    """Publish one record the way any Kafka client would (DESIGN §7); ``amps_client`` -> ``amps-client``."""
    pairs = [(k.replace("_", "-"), v.encode()) for k, v in headers.items() if v is not None]
    client = headers.get("amps_client")
    producer.send(topic, key=client.encode() if client else None, value=body, headers=pairs)


def destination_xml(
    name: str | None,
    addresses: list[Path],
    *,
    sync: str = "sync",
    group: str | None = None,
    passthrough: str | None = ".*",
    topics: str = '<Topic><Name>.*</Name><MessageType>json</MessageType></Topic>',
    compression: str | None = None,
    authenticator: str = "",
) -> str:
    """One ``<Destination>`` (``name`` None: written with no ``<Name>``, named by its group); wrap several in
    ``replication_xml``. ``authenticator``: an ``<Authenticator>`` for its transport."""
    inet = "".join(f"<InetAddr>{a}</InetAddr>" for a in addresses)
    grp = f"<Group>{group}</Group>" if group else ""
    if compression:
        grp += f"<Compression>{compression}</Compression>"
    pt = f"<PassThrough>{passthrough}</PassThrough>" if passthrough is not None else ""
    named = f"<Name>{name}</Name>" if name is not None else ""
    return (f"<Destination>{named}{grp}<SyncType>{sync}</SyncType>{pt}{topics}"
            f"<Transport><Type>amps-replication</Type>{inet}{authenticator}</Transport></Destination>")


def replication_xml(*destinations: str, actions: str = "") -> str:
    return f"<Replication>{''.join(destinations)}</Replication>{actions}"


def downgrade_xml(*, every: str, downgrade_age: str, upgrade_age: str, minimum_sync: int | None = None,
                  upgrade_every: str | None = None) -> str:
    """``<Actions>`` with the downgrade and upgrade modules (and ``<Tuning>`` when ``minimum_sync`` is given):
    one ``<Action>``, or with ``upgrade_every`` the upgrade in an action of its own, on its own schedule."""
    tuning = (f"<Tuning><MinimumSyncDestinations>{minimum_sync}</MinimumSyncDestinations></Tuning>"
              if minimum_sync is not None else "")

    def on(interval: str) -> str:
        return f"<On><Module>amps-action-on-schedule</Module><Options><Every>{interval}</Every></Options></On>"

    def do(module: str, age: str) -> str:
        return f"<Do><Module>amps-action-do-{module}-replication</Module><Options><Age>{age}</Age></Options></Do>"

    down, up = do("downgrade", downgrade_age), do("upgrade", upgrade_age)
    if upgrade_every is None:
        return f"<Actions><Action>{on(every)}{down}{up}</Action></Actions>{tuning}"
    return f"<Actions><Action>{on(every)}{down}</Action><Action>{on(upgrade_every)}{up}</Action></Actions>{tuning}"


def inbox_codecs(storage: Path) -> set[str]:
    """Parquet compression codecs used by the data files of an instance's inbox."""
    import pyarrow.parquet as pq

    files = DeltaTable(str(storage / "inbox")).file_uris()
    return {pq.ParquetFile(f.removeprefix("file://")).metadata.row_group(0).column(0).compression for f in files}


def bulk_publish(bootstrap: str, kafka_topic: str, client: str, messages, *, first_seq: int = 1) -> int:
    """Publish ``(amps topic, body)`` pairs as client ``client`` with one raw zstd producer (DESIGN §7): fast, for
    large test inputs. Returns the last sequence number used."""
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, compression_type="zstd", linger_ms=20,
                             batch_size=512 * 1024)
    seq = first_seq - 1
    for seq, (topic, body) in enumerate(messages, start=first_seq):
        raw_publish(producer, kafka_topic, body, amps_client=client, amps_seq=str(seq), amps_topic=topic)
    producer.flush()
    producer.close()
    return seq


def write_batches(path: Path, batches: int, per_publisher: int, publishers=("p0", "p1", "p2")) -> pa.Table:
    """A txlog as an instance writes it: one commit (one file) per batch, ``per_publisher`` rows of each
    publisher interleaved, batch ``b`` persisted at ``T0 + b`` seconds. Returns every row."""
    appender = IdempotentAppender(path, TXLOG_SCHEMA, app_id="ingest", name="txlog")
    seq, written = 0, []
    for b in range(batches):
        rows = []
        for i in range(per_publisher):
            for pub in publishers:
                seq += 1
                pseq = b * per_publisher + i + 1
                rows.append({
                    "seq": seq, "bookmark": bookmark(pub, pseq), "publisher": pub, "publisher_seq": pseq,
                    "topic": "/orders", "message_type": "json", "command": "publish", "sow_key": None,
                    "sow_keys": None, "filter": None,
                    "data": json.dumps({"seq": seq}).encode(), "origin": "a", "received_from": None,
                    "received_from_group": None, "path": ["a"], "publish_time": T0 + timedelta(seconds=b),
                    "persist_time": T0 + timedelta(seconds=b, microseconds=700),
                })
        table = pa.Table.from_pylist(rows, schema=TXLOG_SCHEMA)
        appender.append(table, b, {"batch": b, "first_seq": seq - len(rows) + 1, "last_seq": seq,
                                   "publishers": {}, "links": {}})
        written.append(table)
    return pa.concat_tables(written)


def stamp(moment: datetime) -> str:
    """``moment`` as a timestamp bookmark (``YYYYMMDDTHHMMSS.ffffffZ``)."""
    return moment.strftime("%Y%m%dT%H%M%S.%fZ")
