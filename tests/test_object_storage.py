"""Delta tables on S3: the local S3 server's conditional writes, writers racing for one inbox, and the one-line
errors for an address that cannot be used."""

from __future__ import annotations

import multiprocessing
import os
import threading
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from botocore.exceptions import ClientError
from deltalake import DeltaTable
from support.inbox import inbox_rows

from replication.connectors.delta.append_commit import ENGINE_INFO
from replication.connectors.delta.tables import IdempotentAppender
from replication.connectors.s3.access import S3Access, S3Address, StorageAccessError, check_reachable
from replication.connectors.s3.objects import ObjectPath
from replication.inbox.schema import INBOX_SCHEMA, INBOX_TABLE_CONFIGURATION, create_inbox

#: Commits each racing writer makes, of ``ROWS`` rows each.
COMMITS = 12
ROWS = 10


def test_s3_addresses_parse_and_name_no_secret():
    assert S3Address.parse("s3://bkt/a/b/") == S3Address("bkt", "a/b")
    assert S3Address.parse("s3a://bkt") == S3Address("bkt", "")
    assert S3Address.parse("/tmp/x") is None and S3Address.parse("file:///tmp/x") is None
    assert S3Address("bkt", "a").child("txlog", "/_delta_log/").uri == "s3://bkt/a/txlog/_delta_log"
    with pytest.raises(StorageAccessError, match="names no bucket"):
        S3Address.parse("s3:///prefix")
    access = S3Access.from_environment({"AWS_ACCESS_KEY_ID": "AKIDTEST", "AWS_SECRET_ACCESS_KEY": "very-secret",
                                        "AWS_REGION": "eu-west-3", "AWS_ENDPOINT_URL": "http://127.0.0.1:9"})
    assert "very-secret" not in repr(access) and "AKIDTEST" not in repr(access)
    assert access.region == "eu-west-3" and access.where == "http://127.0.0.1:9"
    assert access.delta_options()["AWS_ALLOW_HTTP"] == "true"
    static = S3Access("eu-west-3", None, "AKIDTEST", "very-secret")
    assert static.delta_options()["AWS_ACCESS_KEY_ID"] == "AKIDTEST", "keys that do not expire are handed over"
    # temporary keys a provider renews (a role, SSO): a snapshot is given to no client, each renews its own
    renewed = S3Access("eu-west-3", None, "ASIATEMP", "temp-secret", "token", expiring=True)
    assert "AWS_ACCESS_KEY_ID" not in renewed.delta_options() and "AWS_SESSION_TOKEN" not in renewed.delta_options()
    assert "temp-secret" not in repr(renewed)
    provider = access.hadoop_conf()["spark.hadoop.fs.s3a.aws.credentials.provider"]
    assert provider.endswith("software.amazon.awssdk.auth.credentials.DefaultCredentialsProvider")


def test_spark_names_objects_on_s3_with_s3a_and_leaves_other_addresses_alone():
    from replication.storage.layout import spark_uri

    assert spark_uri("s3://bkt/amps-1/txlog/part-0.parquet") == "s3a://bkt/amps-1/txlog/part-0.parquet"
    assert spark_uri("/data/amps-1/txlog") == "/data/amps-1/txlog"
    assert spark_uri("file:///data/amps-1") == "file:///data/amps-1"


def test_the_local_s3_server_lets_one_of_racing_creates_of_an_object_win(s3):
    """Delta's commit is a put-if-absent of ``_delta_log/N.json``: of writers racing for one version, exactly one
    may create it. The server's lock makes moto's check-then-store one step."""
    bucket = f"race-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(bucket)
    won, refused = [], []
    start = threading.Barrier(8)

    def create(i: int) -> None:
        client = s3.access.client()
        start.wait()
        try:
            client.put_object(Bucket=bucket, Key="_delta_log/00000000000000000001.json", Body=str(i).encode(),
                              IfNoneMatch="*")
            won.append(i)
        except ClientError as exc:
            refused.append(exc.response["ResponseMetadata"]["HTTPStatusCode"])

    threads = [threading.Thread(target=create, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1 and sorted(refused) == [412] * 7
    body = s3.access.client().get_object(Bucket=bucket, Key="_delta_log/00000000000000000001.json")["Body"].read()
    assert body == str(won[0]).encode()


def _race(uri: str, options: dict, app_id: str, link: str, start, deleted) -> None:
    """One writer of the race, in its own process: ``COMMITS`` idempotent appends as ``app_id``, committed as
    the engine commits them (its own commit objects, put if absent; delta-rs for one that lost its version)."""
    appender = IdempotentAppender(ObjectPath.of(uri), INBOX_SCHEMA, app_id=app_id, name="inbox",
                                  configuration=INBOX_TABLE_CONFIGURATION)
    start.wait()
    for version in range(1, COMMITS + 1):
        appender.append(inbox_rows(ROWS, link=link, publisher=f"pub-{link}", first=(version - 1) * ROWS + 1), version)
        if link == "amps-a" and version == COMMITS // 2:
            deleted.wait(60)  # the cleanup's DELETE lands while the others keep appending


def _clean(uri: str, options: dict, start, deleted) -> None:
    """Inbox cleanup's removal of amps-a's first rows, racing the appends."""
    appender = IdempotentAppender(uri, INBOX_SCHEMA, app_id="cleanup", name="inbox",
                                  configuration=INBOX_TABLE_CONFIGURATION, storage_options=options)
    start.wait()
    while (appender.table.update_incremental() or True) and \
            (appender.table.transaction_version("amps-a->amps-x#1") or 0) < COMMITS // 2:
        pass
    appender.delete(f"link = 'amps-a' AND upstream_seq <= {3 * ROWS}")
    deleted.set()


@pytest.mark.usefixtures("s3_process")
def test_two_upstreams_and_a_backfill_racing_for_one_inbox_on_s3_lose_no_commit(s3):
    """Part 3 of the object-storage issue: two upstreams' replicators and a backfill append to one inbox on S3
    at once, each from its own process, while inbox cleanup deletes rows: every commit lands once, and the
    delete removes exactly what it names."""
    bucket = f"inbox-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(bucket)
    uri = f"s3://{bucket}/amps-x/inbox"
    options = s3.access.delta_options()
    create_inbox(uri, options)
    spawn = multiprocessing.get_context("spawn")
    start, deleted = spawn.Barrier(4), spawn.Event()
    writers = [("amps-a->amps-x#1", "amps-a"), ("amps-b->amps-x#1", "amps-b"), ("backfill-seq:loader", "loader")]
    procs = [spawn.Process(target=_race, args=(uri, options, app, link, start, deleted)) for app, link in writers]
    procs.append(spawn.Process(target=_clean, args=(uri, options, start, deleted)))
    for p in procs:
        p.start()
    for p in procs:
        p.join(240)
    assert [p.exitcode for p in procs] == [0, 0, 0, 0]

    table = DeltaTable(uri, storage_options=options)
    assert table.version() == 3 * COMMITS + 1  # the creation (0), every append, the delete: none lost
    for app, _link in writers:
        assert table.transaction_version(app) == COMMITS
    rows = table.to_pyarrow_table(columns=["link", "upstream_seq"])
    for _app, link in writers:
        seqs = sorted(rows.filter(pc.equal(rows["link"], link))["upstream_seq"].to_pylist())
        first = 3 * ROWS + 1 if link == "amps-a" else 1
        assert seqs == list(range(first, COMMITS * ROWS + 1)), link  # each row once; the deleted ones gone
    history = table.history()
    operations = [h["operation"] for h in history]
    assert operations.count("DELETE") == 1 and operations.count("WRITE") == 3 * COMMITS
    assert any(h.get("engineInfo") == ENGINE_INFO for h in history), "the engine's own commit objects"
    _read_both_ways(uri, table)


def _read_both_ways(uri: str, table: DeltaTable) -> None:
    """Part 5 on S3: the inbox's plain appends are read from the files their commit objects name (the
    cleanup's removal of whole files as appending nothing); a range holding a commit that rewrote a file falls
    back to the change data feed; both give the same rows."""
    import pyarrow as pa

    from replication.inbox.versions import InboxLog, read_appended_version, read_versions

    inbox = InboxLog(uri)
    assert inbox.latest_version() == table.version()
    cleanup = next(h["version"] for h in table.history() if h["operation"] == "DELETE")
    removed = read_appended_version(uri, cleanup)
    assert removed is not None and removed.num_rows == 0, "whole files removed: read as appending nothing"
    table.delete("link = 'amps-b' AND upstream_seq = 5")  # splits a file: rewritten, not a plain append
    assert read_appended_version(uri, table.version()) is None, "a rewrite is read from the change feed"
    assert inbox.latest_version() == table.version(), "the new commit object found by probing"
    appended = [read_appended_version(uri, v) for v in range(1, table.version())]
    assert all(part is not None for part in appended), "every append read from its commit object's files"
    fast = pa.concat_tables(appended)
    fed = read_versions(uri, 1, table.version())  # (the DELETE in range: the change data feed)
    key = ["inbox_version", "link", "upstream_seq"]
    assert fed.num_rows == fast.num_rows == 3 * COMMITS * ROWS
    assert fed.select(key).to_pylist() == fast.sort_by([(k, "ascending") for k in key]).select(key).to_pylist()
    assert fed.select(["data"]).equals(fast.sort_by([(k, "ascending") for k in key]).select(["data"]))


@pytest.mark.parametrize("problem", ["unreachable endpoint", "wrong credentials", "missing bucket"])
def test_an_s3_address_that_cannot_be_used_is_one_line_naming_it_and_the_fix(s3, problem):
    bucket = f"errs-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(bucket)
    access, address = s3.access, S3Address(bucket, "amps-1")
    if problem == "unreachable endpoint":
        from replication.connectors.ports import free_loopback_port

        access = S3Access(access.region, f"http://127.0.0.1:{free_loopback_port()}", "k", "s3cr3t-value")
        expected = "cannot reach http://127.0.0.1:"
    elif problem == "wrong credentials":
        access = S3Access(access.region, access.endpoint, "someone-else", "s3cr3t-value")
        expected = "refused the credentials (InvalidAccessKeyId)"
    else:
        address = S3Address(f"{bucket}-missing", "amps-1")
        expected = f"bucket '{bucket}-missing' does not exist"
    with pytest.raises(StorageAccessError) as caught:
        check_reachable(address, access)
    message = str(caught.value)
    assert expected in message and str(address) in message and "Fix:" in message
    assert "\n" not in message and "s3cr3t-value" not in message and access.secret_key not in message
    assert s3.access.client().list_objects_v2(Bucket=bucket).get("KeyCount") == 0  # nothing written


def upload(s3, bucket: str, key: str, body: bytes) -> None:
    s3.access.client().put_object(Bucket=bucket, Key=key, Body=body)


def parquet_bytes(table) -> bytes:
    import io

    import pyarrow.parquet as pq

    sink = io.BytesIO()
    pq.write_table(table, sink)
    return sink.getvalue()


def test_a_backfill_reads_parquet_under_an_s3_prefix_in_key_order(s3, tmp_path):
    """``--input s3://...``: a prefix's Parquet objects sorted by key (``_``/``.`` names and other formats left
    out), read by the backfill's Spark tasks with the process's AWS settings."""
    import pyarrow as pa
    from support.cli import run_cli
    from support.factories import write_config

    from replication.inbox.staged_parts import StagedPart
    from replication.inbox.versions import staged_parts

    bucket = f"in-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(bucket)
    for part, ids in (("b", [3, 4, 5]), ("a", [1, 2])):  # uploaded out of order: read in key order
        upload(s3, bucket, f"orders/day=1/{part}.parquet", parquet_bytes(pa.table({"id": ids})))
    upload(s3, bucket, "orders/_SUCCESS", b"")
    upload(s3, bucket, "orders/.hidden.parquet", b"not parquet")
    upload(s3, bucket, "orders/notes.txt", b"not parquet either")
    cfg = write_config(tmp_path, "solo", "localhost:9")

    done = run_cli("backfill", cfg, "--input", f"s3://{bucket}/orders/", "--format", "parquet", "--client", "pq",
                   "--topic", "/orders", env=s3.environment())
    assert done.code == 0, done.err[-3000:]
    assert "backfilled 5 rows as client pq" in done.out, done.out
    assert s3.secret_key not in done.out + done.err

    inbox = tmp_path / "solo" / "inbox"
    parts = [StagedPart.from_json(text) for _, text in staged_parts(str(inbox), 0, DeltaTable(str(inbox)).version())]
    import pyarrow.parquet as pq

    rows = pa.concat_tables([pq.read_table(inbox / p.file, columns=["publisher", "publisher_seq", "data"])
                             for p in parts]).to_pylist()
    assert [(r["publisher"], r["publisher_seq"], r["data"]) for r in rows] == [
        ("pq", 1, b'{"id":1}'), ("pq", 2, b'{"id":2}'), ("pq", 3, b'{"id":3}'), ("pq", 4, b'{"id":4}'),
        ("pq", 5, b'{"id":5}')], "the prefix's objects in key order, each row once"


@pytest.mark.usefixtures("s3_process")
def test_json_lines_csv_and_delta_objects_on_s3_read_as_local_files_do(s3, tmp_path):
    import pyarrow as pa

    from replication.connectors import files

    bucket = f"txt-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(bucket)
    lines, cells = b'{"a": 1}\n\n{"a": [2]}\n', b'\xef\xbb\xbfzip,name\n02134,"x, y"\n,""\n'
    upload(s3, bucket, "in/t.jsonl", lines)
    upload(s3, bucket, "in/c.csv", cells)
    (tmp_path / "t.jsonl").write_bytes(lines)
    (tmp_path / "c.csv").write_bytes(cells)
    for name, fmt in (("t.jsonl", "jsonl"), ("c.csv", "csv")):
        remote = [b.to_pylist() for b in files.batches(f"s3://{bucket}/in/{name}", fmt)]
        assert remote == [b.to_pylist() for b in files.batches(str(tmp_path / name), fmt)]
        assert files.describe(f"s3://{bucket}/in/{name}", fmt).rows == 2
    assert files.expand([f"s3://{bucket}/in"], "csv") == [f"s3://{bucket}/in/c.csv"]
    # a Delta table on S3: its files from one snapshot, each read with the table's columns
    from deltalake import write_deltalake

    table, options = f"s3://{bucket}/trades", s3.access.delta_options()
    write_deltalake(table, pa.table({"trade": [7, 8]}), storage_options=options)
    write_deltalake(table, pa.table({"trade": [9], "desk": ["fx"]}), mode="append", schema_mode="merge",
                    storage_options=options)
    found = files.delta_files([table])
    assert len(found) == 2 and all(uri.startswith(f"{table}/") for uri in found)
    rows = [r for uri, delta in found.items() for b in files.batches(uri, "delta", delta) for r in b.to_pylist()]
    assert sorted(rows, key=lambda r: r["trade"]) == [
        {"trade": 7, "desk": None}, {"trade": 8, "desk": None}, {"trade": 9, "desk": "fx"}]


@pytest.mark.parametrize("problem", ["missing bucket", "missing prefix", "wrong credentials"])
def test_a_backfill_input_on_s3_that_cannot_be_read_is_one_line_and_exit_2_before_spark(s3, tmp_path, problem):
    from support.cli import run_cli
    from support.factories import write_config

    bucket = f"bad-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(bucket)
    env = s3.environment()
    source = f"s3://{bucket}/absent/"
    expected = f"{source}: no such object or prefix in bucket '{bucket}'"
    if problem == "missing bucket":
        source = f"s3://{bucket}-gone/orders"
        expected = f"input s3://{bucket}-gone/orders: bucket '{bucket}-gone' does not exist"
    elif problem == "wrong credentials":
        env.update(AWS_ACCESS_KEY_ID="someone-else", AWS_SECRET_ACCESS_KEY="s3cr3t-value")
        expected = "refused the credentials"
    cfg = write_config(tmp_path, "solo", "localhost:9")
    done = run_cli("backfill", cfg, "--input", source, "--format", "parquet", "--client", "c", "--topic", "/t",
                   env=env)
    assert done.code == 2, done.err[-2000:]
    assert len(done.err.strip().splitlines()) == 1 and expected in done.err, done.err
    assert "Traceback" not in done.err and "s3cr3t-value" not in done.err
    assert not (tmp_path / "solo").exists(), "nothing written"


def test_control_files_on_s3_read_back_what_was_written_and_a_missing_one_reads_as_none(s3):
    from replication.connectors.s3.objects import ObjectPath
    from replication.errors import StorageError
    from replication.storage.control import Ack, Heartbeat, read_json

    bucket = f"ctl-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(bucket)
    control = ObjectPath.of(f"s3://{bucket}/amps-1/_control", s3.access)
    assert Heartbeat.read(control / "heartbeat.json") is None and not control.exists()
    Heartbeat("amps-1", time=12.5, running=True, max_seq=7).write(control / "heartbeat.json")
    Ack(41, 3.0, ((43, 45),)).write(control / "acks" / "amps-2.json")
    assert Heartbeat.read(control / "heartbeat.json") == Heartbeat("amps-1", time=12.5, running=True, max_seq=7)
    assert Ack.read(control / "acks" / "amps-2.json") == Ack(41, 3.0, ((43, 45),))
    assert sorted(p.name for p in control.iterdir()) == ["acks", "heartbeat.json"]
    assert [p.name for p in (control / "acks").glob("*.json")] == ["amps-2.json"]
    assert control.is_dir() and (control / "acks").is_dir() and not (control / "heartbeat.json").is_dir()
    (control / "acks" / "amps-2.json").unlink()
    assert not (control / "acks").exists() and Ack.read(control / "acks" / "amps-2.json") is None
    (control / "bad.json").write_bytes(b"{not json")
    with pytest.raises(StorageError, match=rf"control file s3://{bucket}/amps-1/_control/bad.json is not valid JSON"):
        read_json(control / "bad.json")
    assert s3.secret_key not in repr(control) and s3.secret_key not in str(control)


@pytest.mark.parametrize("where", ["s3", "local"])
def test_writers_updating_one_control_file_at_once_lose_no_update(s3, tmp_path, where):
    """``update_json``: on S3 a put conditional on what was read (done again when overtaken); locally a flock."""
    from replication.connectors.s3.objects import ObjectPath
    from replication.storage.control import update_json

    if where == "s3":
        bucket = f"upd-{uuid.uuid4().hex[:8]}"
        s3.create_bucket(bucket)
        path = ObjectPath.of(f"s3://{bucket}/amps-1/_control/proxied_transfer.json", s3.access)
    else:
        path = tmp_path / "_control" / "proxied_transfer.json"
    writers, rounds = 6, 4
    start = threading.Barrier(writers)
    failures: list[BaseException] = []

    def add(name: str) -> None:
        start.wait()
        try:
            for n in range(rounds):
                update_json(path, lambda saved, item=f"{name}-{n}": {"instances": sorted(
                    {*(saved or {}).get("instances", []), item})})
        except BaseException as exc:  # noqa: BLE001 (reported below)
            failures.append(exc)

    threads = [threading.Thread(target=add, args=(f"w{i}",)) for i in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures
    from replication.storage.control import read_json

    assert read_json(path)["instances"] == sorted(f"w{i}-{n}" for i in range(writers) for n in range(rounds))


def test_spark_submit_adds_s3a_for_an_instance_on_s3_only_with_no_secret(s3, tmp_path):
    """``python -m replication.launch CONFIG...`` (what spark-submit.sh runs): Hadoop's S3A filesystem
    and the endpoint for an instance whose storage is on S3; nothing of it for a local one."""
    import subprocess
    import sys

    from support.factories import write_config

    local = write_config(tmp_path, "here", "localhost:9")
    on_s3 = tmp_path / "there.xml"
    on_s3.write_text(
        "<AMPSConfig><Name>there</Name><Storage>s3://bkt/there</Storage><Transports><Transport><Name>k</Name>"
        "<Type>kafka</Type><InetAddr>localhost:9</InetAddr><Topic>there.publish</Topic><MessageType>json"
        "</MessageType></Transport></Transports><TransactionLog><Topic><Name>.*</Name><MessageType>json"
        "</MessageType></Topic></TransactionLog></AMPSConfig>")

    def args(*configs: Path) -> str:
        done = subprocess.run([sys.executable, "-m", "replication.launch", *map(str, configs)],
                              capture_output=True, text=True, env={**os.environ, **s3.environment()}, check=True)
        return done.stdout

    assert "hadoop-aws" not in args(local) and "fs.s3a" not in args(local)
    both = args(local, on_s3)
    assert "hadoop-aws-" in both and f"spark.hadoop.fs.s3a.endpoint={s3.endpoint}" in both
    assert "spark.hadoop.fs.s3a.path.style.access=true" in both and s3.secret_key not in both
    assert "spark.hadoop.fs.s3a.performance.flags=create,mkdir" in both, "checkpoint files created without checks"


@pytest.mark.parametrize("problem", ["unreachable endpoint", "wrong credentials", "missing bucket"])
def test_an_instance_or_query_on_s3_storage_that_cannot_be_reached_stops_in_one_line_writing_nothing(
        s3, tmp_path, problem):
    """``replication run`` stops before Spark starts, and a query command (``status``, ``replay``, ``verify``: one
    per problem) exits 2: one line naming the address and the fix, no traceback, no secret, nothing written."""
    from support.cli import run_cli

    from replication.connectors.ports import free_loopback_port

    bucket = f"reach-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(bucket)
    env, storage = s3.environment(), f"s3://{bucket}/amps-1"
    if problem == "unreachable endpoint":
        env["AWS_ENDPOINT_URL"] = f"http://127.0.0.1:{free_loopback_port()}"
        expected = f"<Storage> {storage}: cannot reach http://127.0.0.1:"
    elif problem == "wrong credentials":
        env.update(AWS_ACCESS_KEY_ID="someone-else", AWS_SECRET_ACCESS_KEY="s3cr3t-value")
        expected = f"<Storage> {storage}: {s3.endpoint} refused the credentials (InvalidAccessKeyId)"
    else:
        storage = f"s3://{bucket}-gone/amps-1"
        expected = f"<Storage> {storage}: bucket '{bucket}-gone' does not exist"
    cfg = tmp_path / "amps-1.xml"
    cfg.write_text(
        f"<AMPSConfig><Name>amps-1</Name><Storage>{storage}</Storage><Transports><Transport><Name>k</Name>"
        "<Type>kafka</Type><InetAddr>localhost:9</InetAddr><Topic>amps-1.publish</Topic><MessageType>json"
        "</MessageType></Transport></Transports><TransactionLog><Topic><Name>.*</Name><MessageType>json"
        "</MessageType></Topic></TransactionLog></AMPSConfig>")
    query = {"unreachable endpoint": "status", "wrong credentials": "replay", "missing bucket": "verify"}[problem]
    for command, code in (("run", 2), (query, 2)):
        extra = ["--topic", ".*"] if command == "replay" else []
        done = run_cli(command, cfg, *extra, env=env)
        assert done.code == code, (command, done.err[-2000:])
        lines = [line for line in done.err.splitlines() if line.strip()]
        assert len(lines) == 1 and expected in lines[0] and lines[0].startswith(f"replication {command}: "), \
            (command, done.err)
        assert "Traceback" not in done.err and "s3cr3t-value" not in done.out + done.err
    if problem == "missing bucket":
        assert f"{bucket}-gone" not in [b["Name"] for b in s3.access.client().list_buckets()["Buckets"]], \
            "no bucket created"
    else:
        assert keys(s3, bucket) == [], "nothing written in the addressed bucket"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["amps-1.xml"]


def keys(s3, bucket: str) -> list[str]:
    return [o["Key"] for o in s3.access.client().list_objects_v2(Bucket=bucket).get("Contents", [])]


def _instance_on(storage: str, name: str, extra: str = "") -> str:
    """A config of instance ``name`` with its storage and inbox at ``storage`` (a path or ``s3://``)."""
    return (f"<AMPSConfig><Name>{name}</Name><Storage>{storage}</Storage><Transports><Transport><Name>k</Name>"
            f"<Type>kafka</Type><InetAddr>localhost:9</InetAddr><Topic>{name}.publish</Topic><MessageType>json"
            "</MessageType></Transport><Transport><Name>r</Name><Type>amps-replication</Type>"
            f"<InetAddr>{storage}</InetAddr></Transport></Transports><TransactionLog><Topic><Name>.*</Name>"
            f"<MessageType>json</MessageType></Topic></TransactionLog>{extra}</AMPSConfig>")


@pytest.mark.usefixtures("s3_process")
def test_a_bootstrap_copies_an_instance_on_s3_into_one_on_s3_and_one_on_disk(s3, tmp_path):
    """Bootstrap sources at ``s3://`` (a ``<Bootstrap>`` ``<InetAddr>`` and ``--from``), and a bootstrap into an
    instance on S3: every source row once, in the source's order, received from the source; a second run
    has nothing to do; the instance on S3 writes nothing on the machine."""
    from support.cli import run_cli
    from support.tables import TxlogWriter

    from replication import config
    from replication.connectors.delta.tables import open_table
    from replication.storage.control import write_instance_config
    from replication.storage.layout import StorageLayout

    bucket = f"boot-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(bucket)
    env = s3.environment()
    source = tmp_path / "amps-1.xml"
    source.write_text(_instance_on(f"s3://{bucket}/amps-1", "amps-1"))
    layout = StorageLayout.of(f"s3://{bucket}/amps-1")
    write_instance_config(config.load(str(source)), layout.instance_json)  # what a started instance has
    writer = TxlogWriter(layout.txlog)
    writer.append(300)
    writer.append(200)
    copy = tmp_path / "amps-2.xml"
    copy.write_text(_instance_on(
        f"s3://{bucket}/amps-2", "amps-2",
        "<Bootstrap><Topic><Name>.*</Name><MessageType>json</MessageType></Topic><Transport><Type>"
        f"amps-replication</Type><InetAddr>s3a://{bucket}/amps-1/</InetAddr></Transport></Bootstrap>"))
    on_disk = tmp_path / "amps-3.xml"
    on_disk.write_text(_instance_on(str(tmp_path / "amps-3"), "amps-3"))
    expected = open_table(f"s3://{bucket}/amps-1/txlog").to_pyarrow_table(
        columns=["bookmark", "publisher_seq", "data"]).sort_by("publisher_seq").to_pylist()
    assert len(expected) == 500

    for cfg, args, target in ((copy, (), f"s3://{bucket}/amps-2"),
                              (on_disk, ("--from", f"s3://{bucket}/amps-1"), str(tmp_path / "amps-3"))):
        done = run_cli("bootstrap", cfg, *args, env=env)
        assert done.code == 0, done.err[-2000:]
        assert f"bootstrapped from s3://{bucket}/amps-1: 500 txlog rows" in done.out, done.out
        rows = open_table(f"{target}/txlog").to_pyarrow_table().sort_by("seq")
        assert rows["seq"].to_pylist() == list(range(1, 501))
        assert rows.select(["bookmark", "publisher_seq", "data"]).to_pylist() == expected, "source order"
        assert set(rows["received_from"].to_pylist()) == {"amps-1"}
        again = run_cli("bootstrap", cfg, *args, env=env)
        assert again.code == 0 and "nothing to do" in again.err, again.err
        assert open_table(f"{target}/txlog").count() == 500
        assert s3.access.secret_key not in done.out + done.err + again.err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["amps-1.xml", "amps-2.xml", "amps-3", "amps-3.xml"]
    assert any(k.startswith("amps-2/_control/bootstrap.json") for k in keys(s3, bucket))


@pytest.mark.usefixtures("s3_process")
def test_the_sow_data_type_bootstraps_sow_records_from_an_instance_on_s3_into_one_on_s3(s3, tmp_path):
    """A source on S3 whose SOW table holds records its txlog no longer has: ``sow,txlog`` stages them in the
    target's bucket and installs them in its SOW table there; nothing is left staged."""
    from support.cli import run_cli
    from support.tables import TxlogWriter

    from replication import config
    from replication.connectors.delta.tables import open_table
    from replication.sow.table import TAIL_COLUMNS, SowTable, as_records, read_current
    from replication.storage.control import write_instance_config
    from replication.storage.layout import StorageLayout

    bucket = f"boot-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(bucket)
    sow = "<SOW><Topic><Name>/orders</Name><MessageType>json</MessageType><Key>/seq</Key></Topic></SOW>"
    source = tmp_path / "amps-1.xml"
    source.write_text(_instance_on(f"s3://{bucket}/amps-1", "amps-1", sow))
    source_cfg = config.load(str(source))
    layout = StorageLayout.of(f"s3://{bucket}/amps-1")
    write_instance_config(source_cfg, layout.instance_json)
    TxlogWriter(layout.txlog).append(30)
    # its SOW base: ten records, as of its txlog's end, written by rows retention has since removed
    written = open_table(f"s3://{bucket}/amps-1/txlog").to_pyarrow_table(columns=list(TAIL_COLUMNS)).sort_by("seq")
    keyed = written.slice(0, 10)
    keyed = keyed.set_column(keyed.schema.get_field_index("topic"), "topic", pa.array(["/orders"] * 10))
    keyed = keyed.set_column(keyed.schema.get_field_index("sow_key"), "sow_key",
                             pa.array([str(n) for n in keyed["seq"].to_pylist()], pa.string()))
    table = SowTable(layout, source_cfg.sow_topics[0], start_seq=0)
    table.replace(as_records(keyed, table.buckets), 30)
    open_table(f"s3://{bucket}/amps-1/txlog").delete("seq <= 10")
    expected = read_current(source_cfg, "/orders").select(["sow_key", "bookmark", "data"]).sort_by("sow_key")
    assert expected.num_rows == 10

    copy = tmp_path / "amps-2.xml"
    copy.write_text(_instance_on(
        f"s3://{bucket}/amps-2", "amps-2",
        f"{sow}<Bootstrap><Topic><Name>.*</Name><MessageType>json</MessageType></Topic><DataType>sow,txlog"
        f"</DataType><Transport><Type>amps-replication</Type><InetAddr>s3://{bucket}/amps-1</InetAddr></Transport>"
        "</Bootstrap>"))
    done = run_cli("bootstrap", copy, env=s3.environment())
    assert done.code == 0, done.err[-2000:]
    assert "20 txlog rows" in done.out and "10 SOW records" in done.out, done.out
    got = read_current(config.load(str(copy)), "/orders")
    assert got.select(["sow_key", "bookmark", "data"]).sort_by("sow_key") == expected
    assert set(got["seq"].to_pylist()) == {0}, "records whose rows this txlog never had"
    assert not [k for k in keys(s3, bucket) if k.startswith("amps-2/_bootstrap/")], "nothing left staged"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["amps-1.xml", "amps-2.xml"]


@pytest.mark.usefixtures("s3_process")
def test_commands_that_scan_tables_on_s3_exit_cleanly(s3, tmp_path):
    """A dataset scan through deltalake's default S3 filesystem (written in Python) left Arrow's IO threads
    taking the GIL as the process exited: ``verify`` of an instance with a queue aborted (SIGABRT) after
    printing its report in about half the runs. Tables on S3 are scanned through Arrow's own S3 filesystem."""
    from pyarrow.fs import S3FileSystem, SubTreeFileSystem
    from support.cli import run_cli
    from support.tables import TxlogWriter

    from replication import config
    from replication.connectors.delta.tables import arrow_dataset, open_table
    from replication.storage.control import write_instance_config
    from replication.storage.layout import StorageLayout

    bucket = f"scan-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(bucket)
    queue = ("<SOW><Queue><Name>/work</Name><MessageType>json</MessageType><UnderlyingTopic>/orders/.*"
             "</UnderlyingTopic><Semantics>at-least-once</Semantics></Queue></SOW>")
    path = tmp_path / "amps-1.xml"
    path.write_text(_instance_on(f"s3://{bucket}/amps-1", "amps-1", queue))
    layout = StorageLayout.of(f"s3://{bucket}/amps-1")
    write_instance_config(config.load(str(path)), layout.instance_json)
    writer = TxlogWriter(layout.txlog)
    for _ in range(5):
        writer.append(100)
    table = open_table(f"s3://{bucket}/amps-1/txlog")
    dataset = arrow_dataset(table)
    assert isinstance(dataset.filesystem, SubTreeFileSystem) and isinstance(dataset.filesystem.base_fs, S3FileSystem)
    assert dataset.to_table(columns=["seq"]).sort_by("seq") == \
        table.to_pyarrow_dataset().to_table(columns=["seq"]).sort_by("seq")
    # (uncontended, the Python filesystem made half of these runs abort; under load fewer)
    runs = [run_cli("verify", path, "--engine", "arrow", env=s3.environment()) for _ in range(5)]
    assert [(r.code, r.err) for r in runs] == [(0, "")] * 5, runs[0].out
