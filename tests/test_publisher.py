"""The HA publisher: killed with unacknowledged messages, it logs on again and resends only what is missing."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import uuid

from factories import assert_exactly_once, txlog_rows, write_config
from replication import config
from replication.instance import Instance


def publish_cli(cfg_path, store, count, *, failpoints: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop("REPLICATION_FAILPOINTS", None)
    if failpoints:
        env["REPLICATION_FAILPOINTS"] = failpoints
    return subprocess.run(
        [sys.executable, "-m", "replication.cli", "publish", "--config", str(cfg_path), "--client", "feed",
         "--store", str(store), "--topic", "/orders", "--count", str(count)],
        capture_output=True, text=True, env=env, timeout=300, start_new_session=True,
    )


def test_killed_publisher_logs_on_and_resends_only_what_is_missing(spark, broker, tmp_path):
    name = f"pub{uuid.uuid4().hex[:6]}"
    cfg_path = write_config(tmp_path, name, broker.bootstrap)
    inst = Instance(config.load(str(cfg_path)), spark).start()
    store = tmp_path / "feed.store"
    try:
        done = publish_cli(cfg_path, store, 500)
        assert done.returncode == 0, done.stderr[-2000:]
        assert "persisted through 500" in done.stdout

        # The second run dies after storing its 301st message (seq 801) and before sending it:
        # 801 is in its publish store only, and some before it may not have left its producer.
        killed = publish_cli(cfg_path, store, 500, failpoints="publisher.before_send@301")
        assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]

        # Messages still in the killed producer's buffer never reached Kafka; the
        # instance says how far it got, and exactly the rest is re-sent.
        again = publish_cli(cfg_path, store, 0)
        assert again.returncode == 0, again.stderr[-2000:]
        logon = re.search(r"persisted through (\d+); re-sent (\d+) message\(s\) \((\d+)\.\.(\d+)\)", again.stdout)
        assert logon, again.stdout
        persisted, resent, first, last = map(int, logon.groups())
        assert 500 <= persisted <= 800, "the first 500 were acknowledged before the kill"
        assert (first, last, resent) == (persisted + 1, 801, 801 - persisted)
        assert "persisted through 801" in again.stdout
    finally:
        inst.stop()
    assert_exactly_once(txlog_rows(tmp_path, name), {"feed": 801})
