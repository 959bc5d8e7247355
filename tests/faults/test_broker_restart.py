"""The Kafka broker stopped and restarted under a replicating pair: nothing lost, nothing duplicated, all acked."""

from __future__ import annotations

import time

import pytest
from support.fabric import ONE_WAY, PacedPublisher
from support.factories import assert_exactly_once, destination_xml, replication_xml, wait_until


@pytest.mark.slow
@pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")  # no thread may die of it
def test_a_broker_stopped_and_restarted_under_a_replicating_pair_loses_and_duplicates_nothing(fabric):
    """The session's broker goes down (a clean shutdown) and comes back on its log directories while A ingests
    and replicates to B (sync): every message in both txlogs once, every publisher acknowledged."""
    fabric.configure("b")
    fabric.configure("a", replication=replication_xml(destination_xml(fabric.name("b"), [fabric.storage("b")],
                                                                      topics=ONE_WAY)))
    fabric.start("b")
    fabric.start("a")
    pub = fabric.publisher("through-restart", "a", resend_after=3.0)
    paced = PacedPublisher(pub, rate=150)
    try:
        wait_until(lambda: fabric.count("b") >= 300, what="replication under way before the restart")
        fabric.broker.stop()
        try:
            time.sleep(3)  # publishes meanwhile wait in the producer; the publisher's logons fail
        finally:
            fabric.broker.start()
        resumed = paced.published + 300
        wait_until(lambda: fabric.count("b") >= resumed, timeout=180, what="replication going on after the restart")
    finally:
        published = paced.stop()
    pub.flush(timeout=180)
    assert pub.persisted_seq == published
    for short in ("a", "b"):
        wait_until(lambda s=short: fabric.count(s) >= published, timeout=120, what=f"{short} to hold every message")
        assert_exactly_once(fabric.rows(short), {"through-restart": published})
