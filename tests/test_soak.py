"""Soak, short variant (issue 14): the cascading mesh publishing while lower tiers are killed with kill -9.

Lower-tier instances are killed with kill -9 and restarted every ~20 s; at the end every publisher has its
acks, every message is in all eight txlogs once and ``verify`` is clean. ``bench/soak.py --minutes N`` runs it
longer."""

from __future__ import annotations

import importlib.util
import sys

import pytest
from support.repo import REPO

pytestmark = pytest.mark.e2e  # a broker of its own, instance processes

BENCH = REPO / "bench" / "soak.py"


def load_soak():
    spec = importlib.util.spec_from_file_location("soak", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules["soak"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_the_mesh_survives_kill_9_of_lower_tier_instances_under_continuous_publishing(tmp_path):
    from replication.connectors.kafka.broker import EmbeddedBroker

    soak = load_soak()
    # A broker of its own: the session's broker holds what test_mesh published to the same mesh topics,
    # which the soak's Incoming instances would ingest too.
    with EmbeddedBroker() as broker:
        result = soak.soak(tmp_path, broker.bootstrap, minutes=1.0, kill_every=20.0, rate=20.0, seed=14)
    print(result.summary())
    assert len(result.kills) >= 2, result.summary()
    assert result.ok, result.summary()
    assert result.acknowledged == result.published
