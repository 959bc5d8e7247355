"""kill -9 of an instance at each step of a batch, then restart: nothing lost, nothing duplicated, acks resume."""

from __future__ import annotations

import signal
import uuid

import pytest

from factories import assert_exactly_once, txlog_rows, write_config
from processes import InstanceProcess
from replication.client import Publisher

PER_STAGE = 1500

CRASH_POINTS = [
    "ingest.before_txlog_commit@3",  # mid-batch: read, classified, rejects written, txlog not
    "ingest.after_txlog_commit@3",  # Delta commit done, Spark's checkpoint not
    "ingest.before_ack@3",  # txlog and state committed, acks not sent
]


@pytest.mark.slow
def test_kill_9_at_each_step_then_restart_loses_and_duplicates_nothing(broker, tmp_path):
    """One instance crashes three times (once per crash point) while a publisher keeps publishing."""
    name = f"crash{uuid.uuid4().hex[:6]}"
    cfg = write_config(tmp_path, name, broker.bootstrap, max_offsets=250)
    proc = InstanceProcess(cfg, tmp_path / "run0.log", failpoints=CRASH_POINTS[0])
    pub = Publisher("crash-pub", bootstrap=broker.bootstrap, topic=f"{name}.publish", instance=name,
                    store_path=tmp_path / "pub.store", resend_after=3, logon_timeout=180)
    published = 0
    try:
        for stage, failpoint in enumerate(CRASH_POINTS):
            for _ in range(PER_STAGE):
                published += 1
                pub.publish("/orders", b'{"i": %d}' % published)
            code = proc.wait_killed(timeout=300)
            assert code == -signal.SIGKILL, proc.log_text()[-3000:]
            assert f"failpoint {failpoint.split('@')[0]} reached" in proc.log_text()
            assert pub.persisted_seq < published, "the crash came after everything was acknowledged"
            following = CRASH_POINTS[stage + 1] if stage + 1 < len(CRASH_POINTS) else None
            proc = InstanceProcess(cfg, tmp_path / f"run{stage + 1}.log", failpoints=following)
        pub.flush(timeout=300)  # acks resume after the last restart
    finally:
        pub.close()
        proc.stop()
    assert_exactly_once(txlog_rows(tmp_path, name), {"crash-pub": published})
