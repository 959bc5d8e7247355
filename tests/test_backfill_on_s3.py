"""A backfill into an instance whose ``<Storage>`` is ``s3://`` (issue 36): its parts, announcements, rejected files
and client lock are objects in the bucket, and the ingest takes the parts by classifying their rows (the
fallback of the local disk's move into ``txlog/``).

A Spark task's work and the driver's commits run here, against the session's local S3 server; the whole
command against a running instance, killed and run again, is in ``test_instance_on_s3``.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable
from support.factories import instance_xml, wait_until

from replication import backfill, config
from replication.backfill import commit
from replication.backfill.plan import NumberedFile
from replication.backfill.tasks import write_file_parts
from replication.connectors.delta.tables import open_or_create
from replication.errors import StorageError
from replication.inbox import staged_parts as sp
from replication.inbox.schema import create_inbox
from replication.inbox.versions import staged_parts
from replication.ingest.classify import TopicRecorder
from replication.storage import lease
from replication.storage.layout import StorageLayout
from replication.txlog.schema import REJECTED_SCHEMA


class _BucketRoot(str):
    def __truediv__(self, name: str) -> str:
        return f"{self}/{name}"


def instance_on_s3(s3, tmp_path: Path) -> tuple[config.InstanceConfig, StorageLayout, str]:
    bucket = f"backfill-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(bucket)
    path = tmp_path / "solo.xml"
    path.write_text(instance_xml("solo", _BucketRoot(f"s3://{bucket}/fabric"), "localhost:9", txlog_topics=(
        "<Topic><Name>/orders</Name><MessageType>json</MessageType></Topic>")))
    cfg = config.load(str(path))
    return cfg, StorageLayout.of(cfg.storage), bucket


def keys(s3, bucket: str, under: str) -> list[str]:
    listed = s3.access.client().list_objects_v2(Bucket=bucket, Prefix=under)
    return sorted(item["Key"][len(under):] for item in listed.get("Contents", []))


def test_a_part_is_staged_as_objects_committed_once_and_classified_by_the_ingest(s3_process, tmp_path):
    s3 = s3_process
    cfg, layout, bucket = instance_on_s3(s3, tmp_path)
    source = tmp_path / "in.parquet"
    pq.write_table(pa.table({"kind": ["/orders", None, "", "/other", "/orders", "/orders"],
                             "body": ['{"a":1}', '{"a":2}', '{"a":3}', '{"a":4}', "not json", '{"a":6}']}), source)
    options = backfill.Options("loader", "parquet", topic_column="kind", data_column="body")
    staging = layout.backfill_staging("loader")
    announce = layout.backfill_parts("loader") / "run"
    # one Spark task's work, run here: the part, its rejected rows and its announcement written to the bucket
    (part,) = write_file_parts(cfg, NumberedFile(str(source), 6, 101), options, (str(layout.inbox), str(staging)),
                               str(layout.rejected), 0, str(announce))
    assert (part.first_seq, part.rows, part.rejected_rows, part.last_good_seq) == (101, 6, 4, 106)
    staged = sp.StagedPart.from_json(part.staged)
    prefix = f"fabric/solo/inbox/{staged.file}"
    assert keys(s3, bucket, prefix) == [""], "the part is an object in the inbox's staging prefix"
    assert json.loads((announce / "101.json").read_bytes())["staged"] == part.staged, "announced as an object"

    # the driver's commits: the part's descriptor to the inbox, its rejected file to rejected/, each once
    inbox = create_inbox(layout.inbox)
    rejected = open_or_create(layout.rejected, REJECTED_SCHEMA, name="rejected")
    app = commit.APP_ID.format(client="loader")
    assert commit.commit_rejected_file(layout, rejected, part.rejected, app, part.last_seq)
    assert commit.commit_staged_part(layout, inbox, part.staged, app, part.last_seq)
    assert not commit.commit_staged_part(layout, inbox, None, app, part.last_seq), "a version commits once"
    options_s3 = s3.access.delta_options()
    reasons = DeltaTable(str(layout.rejected), storage_options=options_s3).to_pyarrow_table().to_pylist()
    assert sorted((r["publisher_seq"], r["reason"].split(": ", 1)[1][:18]) for r in reasons) == [
        ("102", "no topic (column '"), ("103", "no topic (column '"), ("104", "topic '/other' (js"),
        ("105", "body is not valid ")]
    assert commit.earlier_rejects(layout, "loader", 106) == (4, [r["reason"] for r in sorted(
        reasons, key=lambda r: int(r["publisher_seq"]))], 106), "a re-run reads the rejects from the bucket"

    # the ingest's side: the part's rows are classified (no rename into txlog/ in a bucket), its object removed
    handed = staged_parts(str(layout.inbox), 0, inbox.version())
    assert [sp.StagedPart.from_json(text).file for _, text in handed] == [staged.file]
    taker = sp.StagedParts(cfg, layout, TopicRecorder(cfg))
    taken = taker.take(sp.markers(handed), {}, 0, datetime.now(timezone.utc))
    assert (taken.stored, taken.rows, taker.stats) == ([], 0, {"stored_as_is": 0, "classified": 1})
    assert taken.candidates.select(["source", "publisher", "publisher_seq", "topic", "data"]).to_pylist() == [
        {"source": "backfill", "publisher": "loader", "publisher_seq": s, "topic": "/orders", "data": body}
        for s, body in (("101", b'{"a":1}'), ("106", b'{"a":6}'))]
    assert [str(p) for p in taken.consumed] == [str(layout.inbox / staged.file)]
    taken.clean_up()  # (once the batch is committed)
    assert keys(s3, bucket, prefix) == [], "the staged object is deleted"

    # a killed run's part never handed over is removed by the next run, from the bucket
    (late,) = write_file_parts(cfg, NumberedFile(str(source), 6, 201), options, (str(layout.inbox), str(staging)),
                               str(layout.rejected), 0)
    assert len(list(staging.glob("*.parquet"))) == 1
    commit.remove_unclaimed_staged_files(staging, 106, 106)
    assert list(staging.glob("*.parquet")) == [], f"{late.staged} removed"


def test_one_backfill_of_a_client_at_a_time_on_s3_and_a_killed_runs_lease_is_taken_over(s3_process, tmp_path,
                                                                                          monkeypatch, caplog):
    s3 = s3_process
    cfg, layout, bucket = instance_on_s3(s3, tmp_path)
    lock = layout.backfill_input("loader").with_suffix(".lock")
    with commit.client_lock(layout, cfg, "loader"):
        held = json.loads(lock.read_bytes())
        assert (held["host"], held["pid"]) == (socket.gethostname(), os.getpid()), "the lock names its holder"
        with pytest.raises(backfill.BackfillBusyError, match=(
                f"another backfill by client loader into solo is running \\(it holds {lock}\\). Fix: wait")):
            with commit.client_lock(layout, cfg, "loader"):
                pass
    assert not lock.is_file(), "let go at the end"

    # kill -9 leaves the lease: a run on the same host takes it over at once when its holder's process is gone
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(gone.stdout)
    lock.write_bytes(json.dumps({"owner": "killed", "host": socket.gethostname(), "pid": dead_pid,
                                 "renewed": time.time(), "lease_s": lease.LEASE_S}).encode())
    with commit.client_lock(layout, cfg, "loader"):
        assert json.loads(lock.read_bytes())["pid"] == os.getpid()
    assert f"took over the lease at {lock} from host {socket.gethostname()} pid {dead_pid}" in caplog.text

    # a holder on another host: alive while it renews, waited for once it stopped, taken when its lease ends
    other = {"owner": "x", "host": "elsewhere", "pid": 1, "renewed": 1000.0, "lease_s": 30.0}
    assert lease._wait_before_taking(other, now=1000.0 + 3 * lease.RENEW_S) is None
    assert lease._wait_before_taking(other, now=1020.0) == 10.0
    assert lease._wait_before_taking(other, now=1030.0) == 0.0
    lock.write_bytes(json.dumps({**other, "renewed": time.time()}).encode())
    with pytest.raises(backfill.BackfillBusyError):
        with commit.client_lock(layout, cfg, "loader"):
            pass
    lock.unlink()

    # a holder whose lease was taken over (its renewals stopped too long) learns so before its next commit
    monkeypatch.setattr(lease, "RENEW_S", 0.05)
    with commit.client_lock(layout, cfg, "loader") as still_held:
        still_held()
        lock.write_bytes(json.dumps({**other, "renewed": time.time()}).encode())  # taken over
        with pytest.raises(StorageError, match="lease was lost"):
            wait_until(lambda: still_held() and False, timeout=30, interval=0.05, what="the loss noticed")
    assert lock.is_file(), "the new holder's lease is left alone"
