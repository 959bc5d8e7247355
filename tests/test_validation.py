"""The nine replication validation checks: a failing and a passing case each, the spec's examples, the mesh."""

from __future__ import annotations

from dataclasses import replace

import pytest
from support.repo import MESH, mesh_copy

from replication.config.fabric import Fabric
from replication.config.model import Destination, DestinationTopic, InstanceConfig, QueueTopic, SowTopic, TopicSpec
from replication.errors import ConfigError
from replication.expressions import Filter
from replication.storage.control import read_instance_config, write_instance_config
from replication.validation import topic_covers, validate_link


def instance(name, *, group=None, txlog=(".*",), sow=(), queues=(), destinations=()):
    return InstanceConfig(
        name=name,
        group=group or name,
        storage=f"/data/{name}",
        txlog_topics=tuple(TopicSpec(t, "json") for t in txlog),
        sow_topics=tuple(sow),
        queues=tuple(queues),
        destinations=tuple(destinations),
    )


def topic(name, *, exclude=(), filter=None):
    return DestinationTopic(name, "json", filter=Filter(filter) if filter else None,
                            exclude_validation=frozenset(exclude))


def dest(to, *topics, pass_through=".*", sync="sync", group=None):
    return Destination(to, group or to, sync, tuple(topics), (f"/data/{to}",), pass_through)


def checks(findings):
    return [(f.check, f.topic) for f in findings]


# --------------------------------------------------------------------------- the spec's examples


def test_disaster_recovery_site_that_does_not_replicate_customers_back():
    """HA pair replicates ORDERS, INVENTORY, CUSTOMERS to DR; DR sends back only ORDERS and INVENTORY."""
    three = [topic("ORDERS"), topic("INVENTORY"), topic("CUSTOMERS")]
    a = instance("ha-a", group="HA", destinations=[dest("ha-b", *three), dest("dr", *three, sync="async")])
    b = instance("ha-b", group="HA", destinations=[dest("ha-a", *three), dest("dr", *three, sync="async")])
    dr = instance("dr", destinations=[dest("ha-a", topic("ORDERS"), topic("INVENTORY"))])
    for up in (a, b):
        findings = validate_link(up, up.destination("dr"), dr)
        if up is a:
            assert checks(findings) == [("replicate", "CUSTOMERS")]
            f = findings[0]
            assert (f.upstream, f.downstream, f.destination) == ("ha-a", "dr", "dr")
            assert "dr replicates to ha-a (destination ha-a) but not topic 'CUSTOMERS'" in f.problem
            assert "<Topic><Name>CUSTOMERS</Name><MessageType>json</MessageType></Topic>" in f.fix
            assert "<ExcludeValidation>replicate</ExcludeValidation>" in f.fix
        else:  # dr has no destination to ha-b at all
            assert checks(findings) == [("replicate", "ORDERS"), ("replicate", "INVENTORY"), ("replicate", "CUSTOMERS")]
            assert "add <Replication><Destination><Name>ha-b</Name><Group>HA</Group>" in findings[0].fix
    # the HA pair itself is consistent
    assert validate_link(a, a.destination("ha-b"), b) == []
    # passing case: DR replicates all three back (to both members, by a failover list)
    dr_ok = instance(
        "dr",
        destinations=[
            Destination("HA", "HA", "async", tuple(three), ("/data/ha-a", "/data/ha-b"), ".*"),
        ],
    )
    assert validate_link(a, a.destination("dr"), dr_ok) == []
    assert validate_link(b, b.destination("dr"), dr_ok) == []


def test_only_one_member_of_the_pair_replicates_orders_to_the_other():
    a = instance("ha-a", destinations=[dest("ha-b", topic("ORDERS"), topic("INVENTORY"))])
    b = instance("ha-b", destinations=[dest("ha-a", topic("INVENTORY"))])
    assert checks(validate_link(a, a.destination("ha-b"), b)) == [("replicate", "ORDERS")]
    assert validate_link(b, b.destination("ha-a"), a) == []


def test_view_server_with_replicate_and_cascade_excluded():
    view_topic = topic("MyStuff-VIEW", exclude=("replicate", "cascade"))
    up = instance("amps-1", destinations=[dest("view", view_topic)])
    # the view server replicates to its own read-only replica, relaxing replicate there too
    view = instance("view", destinations=[dest("view-2", topic("MyStuff-VIEW", exclude=("replicate",)))])
    assert validate_link(up, up.destination("view"), view) == []
    # without the exclusions: replicate (no way back) and cascade (the view relaxes replicate)
    strict = instance("amps-1", destinations=[dest("view", topic("MyStuff-VIEW"))])
    findings = validate_link(strict, strict.destination("view"), view)
    assert checks(findings) == [("replicate", "MyStuff-VIEW"), ("cascade", "MyStuff-VIEW")]
    assert "view excludes replicate for topic 'MyStuff-VIEW' on its destination view-2" in findings[1].problem
    assert "<ExcludeValidation>cascade</ExcludeValidation>" in findings[1].fix


# --------------------------------------------------------------------------- each check: fail and pass


def pair(up_topics, *, up_kw=None, down_kw=None, back_topics=None, back_pt=".*"):
    up = instance("amps-1", destinations=[dest("amps-2", *up_topics)], **(up_kw or {}))
    back = back_topics if back_topics is not None else up_topics
    down_kw = dict(down_kw or {})
    down_dests = down_kw.pop("destinations", None)
    if down_dests is None:
        down_dests = [dest("amps-1", *back, pass_through=back_pt)] if back else []
    down = instance("amps-2", destinations=down_dests, **down_kw)
    return validate_link(up, up.destination("amps-2"), down)


def test_txlog():
    assert checks(pair([topic("/orders/1")], down_kw={"txlog": ("/trades",)})) == [("txlog", "/orders/1")]
    assert pair([topic("/orders/1")], down_kw={"txlog": ("^/orders/",)}) == []
    f = pair([topic(".*")], down_kw={"txlog": ("^/orders/",)})[0]
    assert f.check == "txlog" and "<TransactionLog><Topic><Name>.*</Name>" in f.fix
    assert pair([topic(".*", exclude=("txlog",))], down_kw={"txlog": ("^/orders/",)}) == []


def test_replicate():
    assert checks(pair([topic("/a")], back_topics=[])) == [("replicate", "/a")]
    assert checks(pair([topic("/a"), topic("/b")], back_topics=[topic("/a")])) == [("replicate", "/b")]
    assert pair([topic("/a")], back_topics=[topic(".*")]) == []
    assert pair([topic("/a", exclude=("replicate",))], back_topics=[]) == []


def test_sow():
    orders = SowTopic("/orders", "json", ("/id",))
    findings = pair([topic(".*")], up_kw={"sow": [orders]})
    assert checks(findings) == [("sow", ".*")]
    assert ("<SOW><Topic><Name>/orders</Name><MessageType>json</MessageType><Key>/id</Key></Topic></SOW>"
            in findings[0].fix)
    assert pair([topic(".*")], up_kw={"sow": [orders]}, down_kw={"sow": [orders]}) == []
    assert pair([topic(".*", exclude=("sow",))], up_kw={"sow": [orders]}) == []
    # a SOW topic that this destination does not replicate is not checked
    assert pair([topic("^/trades")], up_kw={"sow": [orders]}, down_kw={"txlog": (".*",)}) == []


def test_keys():
    mine = SowTopic("/orders", "json", ("/id",))
    theirs = SowTopic("/orders", "json", ("/order_id",))
    findings = pair([topic(".*")], up_kw={"sow": [mine]}, down_kw={"sow": [theirs]})
    assert checks(findings) == [("keys", ".*")]
    assert "Key /id in amps-1 but /order_id in amps-2" in findings[0].problem
    assert pair([topic(".*")], up_kw={"sow": [mine]}, down_kw={"sow": [SowTopic("/orders", "json", ("/id",))]}) == []
    assert pair([topic(".*", exclude=("keys",))], up_kw={"sow": [mine]}, down_kw={"sow": [theirs]}) == []


def test_cascade():
    # the downstream relaxes txlog on its own destination: this link enforces it
    relaxed = [dest("amps-1", topic(".*")), dest("amps-3", topic(".*", exclude=("txlog",)))]
    findings = pair([topic(".*")], down_kw={"destinations": relaxed})
    assert checks(findings) == [("cascade", ".*")]
    assert "amps-2 excludes txlog for topic '.*' on its destination amps-3" in findings[0].problem
    assert pair([topic(".*", exclude=("cascade",))], down_kw={"destinations": relaxed}) == []
    # cascade compares only what this link enforces
    assert pair([topic(".*", exclude=("txlog",))], down_kw={"destinations": relaxed}) == []
    # a downstream enforcing every check
    assert pair([topic(".*")],
                down_kw={"destinations": [dest("amps-1", topic(".*")), dest("amps-3", topic(".*"))]}) == []


QUEUE = QueueTopic("/work-queue", "json", "/work")


def test_queue_cannot_be_excluded():
    findings = pair([topic(".*")], up_kw={"queues": [QUEUE]})
    assert checks(findings) == [("queue", ".*")]
    assert "cannot be excluded" in findings[0].fix and "<UnderlyingTopic>/work</UnderlyingTopic>" in findings[0].fix
    assert pair([topic(".*")], up_kw={"queues": [QUEUE]}, down_kw={"queues": [QUEUE]}) == []
    for mandatory in ("queue", "queue_underlying"):
        with pytest.raises(ConfigError, match="cannot be excluded"):
            pair([topic(".*", exclude=(mandatory,))], up_kw={"queues": [QUEUE]})


def test_queue_underlying():
    other = QueueTopic("/work-queue", "json", "/work/.*")
    findings = pair([topic(".*")], up_kw={"queues": [QUEUE]}, down_kw={"queues": [other]})
    assert checks(findings) == [("queue_underlying", ".*")]
    assert "UnderlyingTopic '/work' vs '/work/.*'" in findings[0].problem
    filtered = replace(QUEUE, filter=Filter("/prio > 1"))
    assert checks(pair([topic(".*")], up_kw={"queues": [QUEUE]}, down_kw={"queues": [filtered]})) == [
        ("queue_underlying", ".*")
    ]
    same_filter = replace(QUEUE, filter=Filter("/prio>1"))
    assert pair([topic(".*")], up_kw={"queues": [filtered]}, down_kw={"queues": [same_filter]}) == []


def test_replicate_filter():
    eu = [topic("/orders", filter="/region = 'EU'")]
    findings = pair(eu, back_topics=[topic("/orders")])
    assert checks(findings) == [("replicate_filter", "/orders")]
    assert "amps-2 replicates it back to amps-1 with no filter" in findings[0].problem
    assert "<Filter>/region = 'EU'</Filter>" in findings[0].fix
    # the same filter, written differently, passes
    assert pair(eu, back_topics=[topic("/orders", filter='( /region="EU" )')]) == []
    assert checks(pair(eu, back_topics=[topic("/orders", filter="/region = 'US'")])) == [
        ("replicate_filter", "/orders")]
    # partitioning on purpose
    assert pair([topic("/orders", filter="/region = 'EU'", exclude=("replicate_filter",))],
                back_topics=[topic("/orders")]) == []


def test_queue_passthrough():
    queue_topic = [topic(".*")]
    down_dests = [dest("amps-1", topic(".*"), pass_through=None), dest("amps-3", topic(".*"), pass_through="GroupX")]
    findings = pair(queue_topic, up_kw={"queues": [QUEUE]}, down_kw={"queues": [QUEUE], "destinations": down_dests})
    assert checks(findings) == [("queue_passthrough", ".*"), ("queue_passthrough", ".*")]
    assert "destination amps-1 has no PassThrough" in findings[0].problem
    assert "destination amps-3 has PassThrough 'GroupX'" in findings[1].problem
    # a destination with no Group: this instance's group is its name
    ok = [dest("amps-1", topic(".*"), pass_through="amps-1"), dest("amps-3", topic(".*"), pass_through="^amps-")]
    assert pair(queue_topic, up_kw={"queues": [QUEUE]}, down_kw={"queues": [QUEUE], "destinations": ok}) == []
    assert (
        pair([topic(".*", exclude=("queue_passthrough",))], up_kw={"queues": [QUEUE]},
             down_kw={"queues": [QUEUE], "destinations": down_dests})
        == []
    )


def test_finding_reads_as_a_sentence_with_its_fix():
    f = pair([topic("/a")], back_topics=[])[0]
    text = str(f)
    assert text.startswith("amps-1 -> amps-2 (destination amps-2, topic '/a' json): replicate check failed: ")
    assert "\n    fix: in amps-2's config add <Replication><Destination><Name>amps-1</Name>" in text
    assert f.to_dict()["check"] == "replicate"


@pytest.mark.parametrize(
    "outer,inner,expected",
    [
        (".*", "anything", True),
        (".*", "^/orders/", True),
        ("^/orders/", "/orders/1", True),
        ("^/orders/", "^/orders/.*", True),
        ("^/orders/", "/trades/1", False),
        ("ORDERS", "ORDERS", True),
        ("ORDERS", "ORDERS2", False),
        ("ORDERS", ".*", False),
        ("^/orders/$", "^/orders/.*", False),
    ],
)
def test_topic_covers(outer, inner, expected):
    assert topic_covers(outer, inner) is expected


# --------------------------------------------------------------------------- the cascading mesh


def mesh_findings(paths):
    fabric = Fabric.load(paths)
    return fabric, [
        f
        for link in fabric.all_links()
        for f in validate_link(fabric[link.upstream], link.destination, fabric[link.downstream])
    ]


def test_the_mesh_validates_clean():
    fabric, findings = mesh_findings(sorted(str(p) for p in MESH.glob("*.xml")))
    assert len(fabric) == 8 and len(fabric.all_links()) == 20
    assert all(link.downstream for link in fabric.all_links())
    assert findings == []


def test_mesh_without_the_cascade_exclusion_inside_a_tier(tmp_path):
    """Blog: within a tier the configurations need to exclude cascade (the peer relaxes checks)."""
    paths = mesh_copy(tmp_path, {"Live-A": [("<ExcludeValidation>cascade</ExcludeValidation>", "")]})
    _fabric, findings = mesh_findings(paths)
    assert [(f.upstream, f.downstream, f.destination, f.check) for f in findings] == [
        ("Live-A", "Live-B", "Live-B", "cascade"),
        ("Live-A", "Live-B", "Live-B", "cascade"),
    ]
    assert "Live-B excludes cascade for topic '.*' on its destination Live-A" in findings[0].problem
    assert "Live-B excludes replicate,cascade for topic '.*' on its destination DevUAT" in findings[1].problem
    for f in findings:
        assert "in Live-A's config set <ExcludeValidation>cascade</ExcludeValidation>" in f.fix


def test_mesh_without_the_replicate_exclusion_between_tiers(tmp_path):
    """Blog: between tiers messages flow one way, so replicate must be excluded."""
    old = "<ExcludeValidation>replicate,cascade</ExcludeValidation>"
    paths = mesh_copy(tmp_path, {"Live-A": [(old, "<ExcludeValidation>cascade</ExcludeValidation>")]})
    _fabric, findings = mesh_findings(paths)
    assert [(f.upstream, f.downstream, f.destination, f.check) for f in findings] == [
        ("Live-A", "Dev-A", "DevUAT", "replicate"),
        ("Live-A", "Dev-B", "DevUAT", "replicate"),
    ]
    assert findings[0].problem == "Dev-A does not replicate topic '.*' (json) back to Live-A"
    assert "set <ExcludeValidation>replicate,cascade</ExcludeValidation>" in findings[0].fix


def test_mesh_without_the_cascade_exclusion_between_tiers(tmp_path):
    """Blog: because each tier excludes cascade inside, the tier above must exclude it too."""
    old = "<ExcludeValidation>replicate,cascade</ExcludeValidation>"
    paths = mesh_copy(tmp_path, {"Dev-B": [(old, "<ExcludeValidation>replicate</ExcludeValidation>")]})
    _fabric, findings = mesh_findings(paths)
    assert sorted({(f.downstream, f.check) for f in findings}) == [("Archive-A", "cascade"), ("Archive-B", "cascade")]
    assert all(f.upstream == "Dev-B" and "excludes cascade" in f.problem for f in findings)


def test_the_downstream_may_be_its_effective_config_json(tmp_path):
    """The replicator validates against the downstream's _control/instance.json."""
    fabric = Fabric.load(sorted(str(p) for p in MESH.glob("*.xml")))
    up = fabric["Live-A"]
    for name in ("Live-B", "Dev-A"):
        path = tmp_path / name / "_control" / "instance.json"
        path.parent.mkdir(parents=True)
        write_instance_config(fabric[name], path)
        down = read_instance_config(path)
        dest = up.destination("Live-B" if name == "Live-B" else "DevUAT")
        assert validate_link(up, dest, down) == []
        strict = replace(dest, topics=tuple(replace(t, exclude_validation=frozenset()) for t in dest.topics))
        assert checks(validate_link(up, strict, down)) == (
            [("cascade", ".*")] * 2 if name == "Live-B" else [("replicate", ".*")] + [("cascade", ".*")] * 2
        )
