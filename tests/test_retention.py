"""Txlog retention tied to replication (issue 38 part 2): ``amps-action-do-remove-journal``.

The end-to-end test runs a pair whose async destination goes down under steady publishing, with a
retention shortened to seconds: nothing the destination lacks goes; once it is back and caught up, old
rows go; replay, verify, bootstrap and the status agree; the txlog's data stays bounded.
"""

from __future__ import annotations

import time
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from support.fabric import ONE_WAY, PacedPublisher, link_of
from support.factories import destination_xml, replication_xml, wait_until

from replication import config
from replication.commands import status as status_command
from replication.config.fabric import Fabric
from replication.config.parser import parse_string
from replication.connectors.delta.tables import IdempotentAppender
from replication.destination.resync import ResyncGapError, resync_start
from replication.errors import ConfigError, InputError
from replication.inbox import cleanup as inbox_cleanup
from replication.inbox.schema import INBOX_SCHEMA, create_inbox
from replication.inbox.versions import read_versions
from replication.storage.layout import StorageLayout
from replication.txlog.reader import TxlogReader
from replication.txlog.retention import RetentionPolicy, _removable_prefix, retention_policy
from replication.verify import verify

AGE_S, EVERY_S = 6, 1


def retention_xml(age: str = f"{AGE_S}s", every: str = f"{EVERY_S}s") -> str:
    return ("<Actions><Action><On><Module>amps-action-on-schedule</Module><Options><Every>" + every
            + "</Every></Options></On><Do><Module>amps-action-do-remove-journal</Module><Options><Age>" + age
            + "</Age></Options></Do></Action></Actions>")


def test_the_remove_journal_action_loads_as_amps_users_write_it():
    cfg = parse_string("<AMPSConfig><Name>a</Name><Storage>/s</Storage>" + retention_xml("7d", "1h")
                       + "</AMPSConfig>")
    assert retention_policy(cfg) == RetentionPolicy(every=3600.0, age=7 * 86400.0)
    with pytest.raises(ConfigError, match="needs the option <Age>") as exc:
        parse_string("<AMPSConfig><Name>a</Name><Storage>/s</Storage><Actions><Action><On><Module>"
                     "amps-action-on-schedule</Module><Options><Every>1h</Every></Options></On><Do><Module>"
                     "amps-action-do-remove-journal</Module></Do></Action></Actions></AMPSConfig>",
                     filename="a.xml")
    assert "a.xml:1" in str(exc.value) and "Fix:" in str(exc.value)


def test_only_a_prefix_of_old_acknowledged_files_is_removable():
    files = pa.table({"path": ["f1", "f2", "f3", "f4"], "lo": [1, 11, 21, 31], "hi": [10, 20, 30, 40],
                      "newest": [1_000_000, 2_000_000, 9_000_000, 3_000_000], "rows": [10, 10, 10, 10]})
    assert _removable_prefix(files, limit=40, older_than=5.0) == (20, ["f1", "f2"], 20)  # f3 is young
    assert _removable_prefix(files, limit=15, older_than=5.0) == (10, ["f1"], 10)  # f2 not acknowledged
    assert _removable_prefix(files, limit=0, older_than=5.0) == (0, [], 0)


def inbox_rows(link: str, first: int, last: int) -> pa.Table:
    """Rows ``link`` replicated with upstream seqs ``first..last``, as an upstream appends them to an inbox."""
    n = last - first + 1
    values = {"upstream_seq": pa.array(range(first, last + 1), pa.int64()), "link": pa.array([link] * n),
              "link_group": pa.array(["g"] * n), "bookmark": pa.array([f"{link}|{s}" for s in range(first, last + 1)]),
              "publisher": pa.array([link] * n), "publisher_seq": pa.array(range(first, last + 1), pa.int64()),
              "topic": pa.array(["orders"] * n), "message_type": pa.array(["json"] * n),
              "command": pa.array(["publish"] * n), "origin": pa.array([link] * n)}
    return pa.table({f.name: values.get(f.name, pa.nulls(n, f.type)) for f in INBOX_SCHEMA}, schema=INBOX_SCHEMA)


def test_inbox_cleanup_takes_whole_files_stored_and_acknowledged_and_upstreams_keep_appending(tmp_path):
    create_inbox(tmp_path)
    a = IdempotentAppender(tmp_path, INBOX_SCHEMA, app_id="a", name="inbox")
    b = IdempotentAppender(tmp_path, INBOX_SCHEMA, app_id="b", name="inbox")
    for batch in range(4):  # versions 1..8: A's 10 rows, then B's, four times
        a.append(inbox_rows("A", batch * 10 + 1, batch * 10 + 10), batch)
        b.append(inbox_rows("B", batch * 10 + 1, batch * 10 + 10), batch)
    # stored through version 6 (A and B through 30); A acknowledged through 25, B through 40
    removal = inbox_cleanup.clean(str(tmp_path), 6, {"A": 25, "B": 40})
    assert removal is not None and removal.version == 9 and removal.rows == 50 and len(removal.files) == 5
    left = DeltaTable(str(tmp_path)).to_pyarrow_table(columns=["link", "upstream_seq"])
    assert sorted(zip(left["link"].to_pylist(), left["upstream_seq"].to_pylist(), strict=True)) == (
        [("A", s) for s in range(21, 41)] + [("B", s) for s in range(31, 41)])  # A's 21-30 not acknowledged whole
    # A's appender still holds the snapshot from before the DELETE: its append goes in on a retry
    assert a.append(inbox_rows("A", 41, 50), 4)
    # the ingest reads the removal as adding nothing, and the append after it
    assert read_versions(str(tmp_path), 7, 10)["upstream_seq"].to_pylist() == [*range(31, 41), *range(31, 41),
                                                                              *range(41, 51)]
    assert inbox_cleanup.clean(str(tmp_path), 10, {"A": 0}) is None


def test_inbox_cleanup_cuts_only_where_no_file_straddles():
    live = pa.table({"path": ["f1", "f2", "f3", "g1"], "first": ["A", "A", "A", "B"], "last": ["A", "A", "A", "B"],
                     "lo": [1, 5, 21, 1], "hi": [10, 20, 30, 9], "rows": [10, 16, 20, 9]})
    # f2 overlaps f1 (a resend): A's ack at 15 would split f2, and a cut below it f1, so A keeps everything
    assert inbox_cleanup.cuts(live, {"f1", "f2", "g1"}, {"A": 15, "B": 9}) == {"B": (9, ["g1"], 9)}
    assert inbox_cleanup.cuts(live, {"f1", "f2", "g1"}, {"A": 25}) == {"A": (20, ["f1", "f2"], 26)}
    assert inbox_cleanup.cuts(live, {"f1"}, {"A": 25}) == {}  # f2 not stored yet: it holds f1 too
    mixed = pa.concat_tables([live, pa.table({"path": ["m"], "first": ["A"], "last": ["B"], "lo": [3], "hi": [3],
                                              "rows": [2]})])
    assert inbox_cleanup.cuts(mixed, {"f1", "f2", "g1", "m"}, {"A": 25, "B": 9}) == {}
    assert inbox_cleanup.predicate({"it's": (4, ["x"], 1), "B": (9, ["g1"], 9)}) == (
        "(link = 'B' AND upstream_seq <= 9) OR (link = 'it''s' AND upstream_seq <= 4)")


def live_rows(table: Path) -> int:
    """Rows in the Delta table's current snapshot, from its files' statistics."""
    return sum(DeltaTable(str(table)).get_add_actions(flatten=True).column("num_records").to_pylist())


def data_bytes(storage: Path) -> int:
    """Bytes of the txlog's data files (the Delta log aside); retention may delete one while we count."""
    total = 0
    for path in (storage / "txlog").glob("*.parquet"):
        try:
            total += path.stat().st_size
        except FileNotFoundError:
            pass
    return total


def test_retention_keeps_what_a_down_destination_lacks_then_bounds_the_txlog(fabric, tmp_path):
    a_name, b_name = fabric.name("a"), fabric.name("b")
    # B's retention keeps its txlog an hour, and cleans its inbox of what it stored on every run
    fabric.configure("b", replication=retention_xml(age="1h"))
    fabric.configure("a", replication=replication_xml(
        destination_xml(b_name, [fabric.storage("b")], sync="async", topics=ONE_WAY), actions=retention_xml()))
    fabric.start("b")
    fabric.start("a")
    a_layout = StorageLayout.of(str(fabric.storage("a")))
    log = TxlogReader(a_layout, a_name)
    paced = PacedPublisher(fabric.publisher("steady", "a"), rate=150)
    try:
        wait_until(lambda: fabric.count("b") >= 300, what="B to receive the first rows")
        first_bookmark = fabric.rows("a")["bookmark"][0].as_py()
        fabric.stop("b")
        time.sleep(2)  # (acknowledgements in flight arrive)
        acked_when_down = link_of(fabric, "a", b_name)["acked_seq"]
        # B is down for two retention periods: rows it lacks all stay, whatever their age
        time.sleep(2 * AGE_S)
        held = fabric.rows("a")["seq"].to_numpy()
        assert held.min() <= acked_when_down + 1, (held.min(), acked_when_down)
        assert len(held) == held.max() - held.min() + 1, "what stays has no hole"
        assert fabric.count("a") > acked_when_down, "A kept publishing"

        # B back: it catches up, and then old rows go
        fabric.start("b")
        caught_up = log.committed_seq()
        wait_until(lambda: link_of(fabric, "a", b_name)["acked_seq"] >= caught_up, timeout=180,
                   what="B to catch up")
        epoch = link_of(fabric, "a", b_name)["epoch"]
        wait_until(lambda: log.first_retained()[0] > acked_when_down + 1, timeout=60,
                   what="retention to remove rows B has now")
        # a 3x retention run: the data kept stops growing
        samples, inbox_samples = [], []
        for _ in range(3 * AGE_S):
            time.sleep(1)
            samples.append(data_bytes(fabric.storage("a")))
            inbox_samples.append((live_rows(fabric.storage("b") / "inbox"), live_rows(fabric.storage("b") / "txlog")))
    finally:
        published = paced.stop()
    second, third = max(samples[AGE_S:2 * AGE_S]), max(samples[2 * AGE_S:])
    assert third <= 1.25 * second, samples
    assert fabric.count("a") < 0.6 * published, (fabric.count("a"), published)
    # B's inbox keeps only what is not stored and acknowledged yet, while A keeps appending to it: A's appends
    # that met a cleanup commit went in on a retry, with no failed replicator (which would have resynced: a
    # new epoch). (From the second retention period on: the first samples may see B's catch-up before a run.)
    assert all(inbox < 0.3 * stored for inbox, stored in inbox_samples[AGE_S:]), inbox_samples
    assert link_of(fabric, "a", b_name)["epoch"] == epoch

    assert fabric.running["a"].restarts == 0, "retention's commits never made the ingest query fail"

    # what Delta readers, replay, status and verify see, once A holds every message and retention has
    # stopped moving (its runs, every second, would change the answers between two reads)
    wait_until(lambda: log.committed_seq() == published, timeout=120, what="A to store every message")
    fabric.running["a"].retention.stop()
    first_seq, first_kept = log.first_retained()
    rows = fabric.rows("a")
    assert rows["seq"][0].as_py() == first_seq and rows["bookmark"][0].as_py() == first_kept
    assert DeltaTable(str(a_layout.txlog)).to_pyarrow_table(columns=["seq"]).num_rows == rows.num_rows
    start, end = log.range("0")
    assert start == first_seq - 1
    replayed = pa.concat_tables(list(log.read(start, log.committed_seq())))
    assert replayed["seq"].to_pylist() == list(range(first_seq, log.committed_seq() + 1))
    with pytest.raises(InputError, match=f"retention removed the rows before seq {first_seq:,}.*first retained "
                                         f"bookmark is {first_kept}"):
        log.range(first_bookmark)
    status = status_command.collect(config.load(str(fabric.paths["a"])))
    assert status["retention"]["first_seq"] == first_seq and status["retention"]["removed_rows"] >= first_seq - 1
    wait_until(lambda: fabric.count("b") == published, timeout=120, what="B to hold every message")
    b_status = status_command.collect(config.load(str(fabric.paths["b"])))["retention"]
    b_inbox = DeltaTable(str(fabric.storage("b") / "inbox")).to_pyarrow_table(columns=["upstream_seq"])
    assert b_status["inbox_removed_rows"] > published // 2 and b_status["removed_rows"] == 0, b_status
    assert b_inbox.num_rows < published // 2, (b_inbox.num_rows, published)
    report = verify(Fabric.load([str(fabric.paths["a"]), str(fabric.paths["b"])]))
    assert report.ok, [f.message for f in report.findings]

    # a new instance bootstrapped from A gets what A kept
    fabric.configure("c", replication=(
        f"<Bootstrap><Topic><Name>.*</Name><MessageType>json</MessageType></Topic><Transport>"
        f"<Type>amps-replication</Type><InetAddr>{fabric.storage('a')}</InetAddr></Transport></Bootstrap>"))
    fabric.start("c")
    wait_until(lambda: fabric.count("c") >= fabric.count("a") - 200, timeout=120, what="C to bootstrap")
    assert fabric.rows("c")["bookmark"][0].as_py() in set(rows["bookmark"].to_pylist())

    # a resync that would need removed rows is refused, naming the first retained bookmark
    with pytest.raises(ResyncGapError, match=f"first retained bookmark {first_kept}"):
        resync_start(a_layout.txlog, {}, after=0, first_seq=first_seq, first_bookmark=first_kept)


@pytest.mark.usefixtures("s3_process")
def test_retention_on_s3_removes_old_acknowledged_rows_then_deletes_their_objects(s3):
    """``<Actions>`` on an instance whose storage is on S3: retention commits the removal to the txlog in the
    bucket, deletes the removed files' objects a period later, and readers start at the first kept row."""
    import uuid

    from support.tables import TxlogWriter

    from replication.txlog.files import TxlogFiles
    from replication.txlog.retention import Retention

    cfg = parse_string(f"<AMPSConfig><Name>amps-1</Name><Storage>s3://keep/amps-1</Storage>{retention_xml()}"
                       "</AMPSConfig>")
    assert cfg.on_object_storage and retention_policy(cfg) == RetentionPolicy(every=EVERY_S, age=AGE_S)
    bucket = f"keep-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(bucket)
    layout = StorageLayout.of(f"s3://{bucket}/amps-1")
    writer = TxlogWriter(layout.txlog)
    for _ in range(3):  # three files: seqs 1-100, 101-200, 201-300
        writer.append(100)

    def parquet_objects() -> list[str]:
        listed = s3.access.client().list_objects_v2(Bucket=bucket, Prefix="amps-1/txlog/")
        return [o["Key"] for o in listed.get("Contents", []) if o["Key"].endswith(".parquet")]

    assert len(parquet_objects()) == 3
    retention = Retention(layout, RetentionPolicy(every=EVERY_S, age=AGE_S),
                          kept_through=lambda: (250, "amps-2"), txlog=writer.appender)
    now = time.time() + AGE_S + 1
    assert retention.tick(now) == 200, "the two files acknowledged whole (the third holds seq 251)"
    assert len(parquet_objects()) == 3, "removed from the snapshot; deleted a period later"
    files = TxlogFiles(str(layout.txlog))
    files.refresh()
    assert files.first_seq == 201 and files.read(200, 300)["seq"].to_pylist() == list(range(201, 301))
    assert retention.tick(now + EVERY_S) == 0
    assert len(parquet_objects()) == 1, "the removed files' objects are deleted"
    files.refresh()
    assert files.read(200, 300).num_rows == 100
