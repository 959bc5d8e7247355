"""The cascading mesh of conf/mesh end to end: real broker, Spark, Delta (issues 3 and 14).

Issue 3, last "Must be shown"; issue 14: written as in the blog, the inter-tier destinations with a <Group> and
no <Name>.

Eight instances of the shipped configs (4 tiers x 2, sync within a tier, async
between tiers, each tier failing over to either instance of the next) run in
the test session's Spark application. Messages published to both Incoming
instances reach all 8 txlogs once each; with Live-A stopped, Live-B and the
Dev and Archive tiers still receive everything once.
"""

from __future__ import annotations

import json

from support.cli import run_cli
from support.factories import assert_exactly_once, txlog_rows, wait_until
from support.repo import MESH

from replication import config
from replication.client import Publisher
from replication.instance import Instance

TIERS = [("Incoming-A", "Incoming-B"), ("Live-A", "Live-B"), ("Dev-A", "Dev-B"), ("Archive-A", "Archive-B")]
ALL = [name for tier in TIERS for name in tier]
TRIGGER = "250 milliseconds"  # 8 ingest queries + 14 replicators share 2 cores
PER_ROUND = 300
WAIT = 240.0


def links(inst: Instance) -> dict[str, dict]:
    """What ``replication status`` shows per destination of ``inst``."""
    return inst.status().links


def initialized(query) -> bool:
    return query is not None and query.isActive and query.status["message"] != "Initializing sources"


def settled(running: dict[str, Instance], addresses: dict[str, str]) -> bool:
    """Every running instance's queries are past source initialization, and each link toward a running
    instance is connected (or failed over). A link refused by replication validation fails at once."""
    ok = True
    for name, inst in running.items():
        status = inst.status()
        refused = {d: s["detail"] for d, s in status.links.items() if s["state"] == "validation failed"}
        assert not refused, f"{name}: replication validation refused mesh links: {refused}"
        ok = ok and initialized(inst.query)  # the instance restarts a failed ingest query by itself
        for manager in inst.managers:
            if any(addresses[a] in running for a in manager.dest.inet_addrs):
                ok = (ok and status.links[manager.dest.name]["state"] in ("connected", "failed over")
                      and manager.replicator is not None and manager.replicator.is_active)
    return ok


def publish(pub: Publisher, n: int, start: int) -> None:
    for i in range(start, start + n):
        pub.publish("/orders", json.dumps({"id": i, "qty": i % 300}).encode())


def test_cascading_mesh_delivers_everywhere_once_and_survives_losing_live_a(spark, broker, tmp_path, monkeypatch):
    # The configs take their storage from ${REPLICATION_HOME}/mesh/<name> and Kafka from ${KAFKA_BOOTSTRAP}.
    monkeypatch.setenv("REPLICATION_HOME", str(tmp_path))
    monkeypatch.setenv("KAFKA_BOOTSTRAP", broker.bootstrap)
    root = tmp_path / "mesh"
    cfgs = {name: config.load(str(MESH / f"{name}.xml")) for name in ALL}
    assert [c.name for c in cfgs.values()] == ALL
    assert sum(len(c.destinations) for c in cfgs.values()) == 14
    # written as in the blog: each inter-tier destination has a <Group> and no <Name> (named by its group)
    inter_tier = [d for c in cfgs.values() for d in c.destinations if d.group != c.group]
    assert len(inter_tier) == 6 and all(d.name == d.group for d in inter_tier)
    assert all("<Name>LiveProdSubscriptions</Name>" not in (MESH / f"{n}.xml").read_text() for n in ALL)

    running: dict[str, Instance] = {}
    pubs: list[Publisher] = []
    try:
        # Bottom tier first, so that each instance finds its preferred next-tier address alive; one at
        # a time, because each streaming source starts a Python process that must connect back to the
        # JVM within 10 s (Spark's fixed limit), which 24 processes starting together on 2 cores miss.
        addresses = {c.storage: n for n, c in cfgs.items()}
        for tier in reversed(TIERS):
            for name in tier:
                running[name] = Instance(cfgs[name], spark, trigger_interval=TRIGGER).start()
                wait_until(lambda: settled(running, addresses), timeout=WAIT, interval=0.5,
                           what=f"{name} started and the mesh links toward it connected")
        first_hop = links(running["Incoming-A"])["LiveProdSubscriptions"]
        assert (first_hop["state"], first_hop["address"].endswith("/mesh/Live-A")) == ("connected", True), first_hop

        pub_a = Publisher("mesh-pub-a", bootstrap=broker.bootstrap, topic="Incoming-A.publish",
                          instance="Incoming-A", store_path=tmp_path / "mesh-pub-a.store")
        pubs.append(pub_a)
        pub_b = Publisher("mesh-pub-b", bootstrap=broker.bootstrap, topic="Incoming-B.publish",
                          instance="Incoming-B", store_path=tmp_path / "mesh-pub-b.store")
        pubs.append(pub_b)

        # Round 1: everything reaches all 8 txlogs, once each.
        publish(pub_a, PER_ROUND, 0)
        publish(pub_b, PER_ROUND, 0)
        pub_a.flush(timeout=WAIT)  # persisted acks: Incoming-A and its sync peer Incoming-B have them
        pub_b.flush(timeout=WAIT)
        assert (pub_a.persisted_seq, pub_b.persisted_seq) == (PER_ROUND, PER_ROUND)
        expected = {"mesh-pub-a": PER_ROUND, "mesh-pub-b": PER_ROUND}
        for name in ALL:
            wait_until(lambda n=name: running[n].status().max_seq >= 2 * PER_ROUND, timeout=WAIT, interval=0.5,
                       what=f"{name} to hold round 1")
        for name in ALL:
            assert_exactly_once(txlog_rows(root, name), expected)

        # Live-A goes down. Publishing goes on at once; the Incoming tier's next-tier
        # destinations fail over to Live-B, which feeds Dev and Archive.
        live_a = running.pop("Live-A")
        live_a.stop()
        publish(pub_a, PER_ROUND, PER_ROUND)
        publish(pub_b, PER_ROUND, PER_ROUND)
        pub_a.flush(timeout=WAIT)
        pub_b.flush(timeout=WAIT)
        assert (pub_a.persisted_seq, pub_b.persisted_seq) == (2 * PER_ROUND, 2 * PER_ROUND)
        expected = {"mesh-pub-a": 2 * PER_ROUND, "mesh-pub-b": 2 * PER_ROUND}
        for name in running:
            wait_until(lambda n=name: running[n].status().max_seq >= 4 * PER_ROUND, timeout=WAIT, interval=0.5,
                       what=f"{name} to hold round 2 with Live-A down")
        for name in running:
            assert_exactly_once(txlog_rows(root, name), expected)
        assert_exactly_once(txlog_rows(root, "Live-A"), {"mesh-pub-a": PER_ROUND, "mesh-pub-b": PER_ROUND})

        # What `replication status` shows for Incoming-A's next-tier destination: failed over to Live-B.
        def to_live() -> dict:
            return links(running["Incoming-A"])["LiveProdSubscriptions"]

        wait_until(lambda: to_live()["state"] == "failed over", timeout=WAIT, what="Incoming-A to show the failover")
        assert to_live()["address"].endswith("/mesh/Live-B")

        # `replication verify` on the running mesh: each link holds what it acknowledged, groups agree
        code, out, _ = run_cli("verify", *[MESH / f"{n}.xml" for n in ALL])
        assert code == 0 and "consistent" in out, out
    finally:
        for pub in pubs:
            pub.close()
        for inst in reversed(running.values()):  # top tier first: no failover noise while stopping
            inst.stop()
