"""Soak, short variant (issue 14): the cascading mesh publishing while lower tiers are killed with kill -9.

Lower-tier instances are killed with kill -9 and restarted every ~9 s; at the end every publisher has its
acks, every message is in all eight txlogs once and ``verify`` is clean. ``bench/soak.py --minutes N`` runs it
longer."""

from __future__ import annotations

import importlib.util
import os
import sys

import pytest
from support.processes import with_test_java_options
from support.repo import REPO

pytestmark = pytest.mark.e2e  # the session's broker, instance processes

BENCH = REPO / "bench" / "soak.py"


def load_soak():
    spec = importlib.util.spec_from_file_location("soak", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules["soak"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def delete_topics(bootstrap: str, names: list[str]) -> None:
    """Delete the topics that exist of ``names``, and wait until the broker no longer lists them."""
    from kafka.admin import KafkaAdminClient
    from support.factories import wait_until

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        present = [name for name in names if name in set(admin.list_topics())]
        if present:
            admin.delete_topics(present)
            wait_until(lambda: not set(present) & set(admin.list_topics()), timeout=60, what="topics deleted")
    finally:
        admin.close()


@pytest.mark.slow
def test_the_mesh_survives_kill_9_of_lower_tier_instances_under_continuous_publishing(broker, tmp_path, monkeypatch):
    soak = load_soak()
    # the bench's instance processes inherit this process's environment: the JVM options of tests' instances
    monkeypatch.setenv("SPARK_SUBMIT_OPTS", with_test_java_options(dict(os.environ))["SPARK_SUBMIT_OPTS"])
    # test_mesh published to the same mesh's topics on this broker: the soak's Incoming instances, starting
    # afresh, would ingest that too
    delete_topics(broker.bootstrap, [f"{name}.{kind}" for name in soak.ALL for kind in ("publish", "acks")])
    # 24 s of publishing, a kill every 6-12 s with none in the last 4.5 s: with this seed, side-A at ~7 s and
    # side-B at ~15 s (while side-A may still be coming back)
    result = soak.soak(tmp_path, broker.bootstrap, minutes=0.4, kill_every=9.0, rate=20.0, seed=14)
    print(result.summary())
    assert len(result.kills) >= 2, result.summary()
    assert result.ok, result.summary()
    assert result.acknowledged == result.published
