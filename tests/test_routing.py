"""The four routing rules: hand-written expectations, and the Python and Spark forms agreeing on every case."""

from __future__ import annotations

import json

import pytest

from replication import routing
from replication.config.model import Destination, DestinationTopic, InstanceConfig, TopicSpec
from replication.expressions import Filter
from replication.routing import Message, decide, forwarded, published


def instance(name, *, group=None, txlog=((".*", "json"),), destinations=()):
    return InstanceConfig(
        name=name,
        group=group or name,
        storage=f"/data/{name}",
        txlog_topics=tuple(TopicSpec(n, t) for n, t in txlog),
        destinations=tuple(destinations),
    )


def destination(name, *topics, group=None, pass_through=None, sync="sync", addrs=None):
    return Destination(
        name=name,
        group=group or name,
        sync_type=sync,
        topics=tuple(topics) or (DestinationTopic(".*", "json"),),
        inet_addrs=tuple(addrs or (f"/data/{name}",)),
        pass_through=pass_through,
    )


HKG = destination(
    "AMPS2-HKG",
    DestinationTopic("/rep_topic", "json"),
    DestinationTopic("/rep_topic2", "json"),
    pass_through="^((?!HKG).)*$",
)
ORDERS = destination(
    "amps-2",
    DestinationTopic("^/orders/", "json", filter=Filter("/qty > 100")),
    DestinationTopic("topic", "json"),
    pass_through=".*",
)
NO_PT = destination("amps-3")  # no PassThrough: replicated messages are not forwarded
GROUPS = destination("Live", group="LiveProdSubscriptions", pass_through="IncomingMessages|LiveProdSubscriptions")

AMPS1 = instance(
    "amps-1",
    group="DataCenter-NYC-1",
    txlog=((".*", "json"), ("fixtopic", "fix")),
    destinations=(HKG, ORDERS, NO_PT, GROUPS),
)
AMPS1_NARROW = instance("amps-1", txlog=(("^/orders/", "json"),), destinations=(ORDERS,))


def msg(topic, *, data=None, frm=None, group=None, path=("amps-1",), mtype="json"):
    return Message(topic, mtype, data, frm, group, tuple(path), path[0])


# (config, destination, message, rule that stops it or None when sent)
CASES = [
    # rule 1: txlog
    (AMPS1_NARROW, ORDERS, msg("/orders/1", data={"qty": 500}), None),
    (AMPS1_NARROW, ORDERS, msg("/trades/1", data={"qty": 500}), "txlog"),
    (AMPS1, HKG, msg("/rep_topic", mtype="fix"), "txlog"),  # fix only for 'fixtopic'
    # rule 2: topic regex vs literal, message type, filter
    (AMPS1, ORDERS, msg("/orders/7", data={"qty": 101}), None),
    (AMPS1, ORDERS, msg("/orders/7", data={"qty": 100}), "filter"),
    (AMPS1, ORDERS, msg("/orders/7", data={"sym": "IBM"}), "filter"),  # missing field: NULL is false
    (AMPS1, ORDERS, msg("/orders/7", data=b"not json"), "filter"),
    (AMPS1, ORDERS, msg("/x/orders/7", data={"qty": 500}), "topic"),  # ^ anchors the regex
    (AMPS1, ORDERS, msg("/orders", data={"qty": 500}), "topic"),
    (AMPS1, ORDERS, msg("topic"), None),  # literal name matches itself...
    (AMPS1, ORDERS, msg("topic2"), "topic"),  # ...and nothing else
    (AMPS1, ORDERS, msg("mytopic"), "topic"),
    (AMPS1, ORDERS, msg("fixtopic", mtype="fix"), "topic"),  # type must match too
    (AMPS1, HKG, msg("/rep_topic"), None),
    (AMPS1, HKG, msg("/rep_topic2"), None),
    (AMPS1, HKG, msg("/rep_topic3"), "topic"),
    # rule 3: PassThrough on the group received from
    (AMPS1, HKG, msg("/rep_topic", frm="amps-9", group="DataCenter-LDN", path=("amps-9", "amps-1")), None),
    (AMPS1, HKG, msg("/rep_topic", frm="amps-9", group="DC-HKG-2", path=("amps-9", "amps-1")), "passthrough"),
    (AMPS1, HKG, msg("/rep_topic", frm="amps-9", group="HKG", path=("amps-9", "amps-1")), "passthrough"),
    (AMPS1, NO_PT, msg("/a"), None),  # published here: no PassThrough needed
    (AMPS1, NO_PT, msg("/a", frm="amps-9", group="G", path=("amps-9", "amps-1")), "passthrough"),
    (AMPS1, GROUPS, msg("/a", frm="Incoming-B", group="IncomingMessages", path=("Incoming-B", "amps-1")), None),
    (AMPS1, GROUPS, msg("/a", frm="Dev-A", group="DevUAT", path=("Dev-A", "amps-1")), "passthrough"),
    # a destination/upstream with no Group: the group is its name
    (AMPS1, HKG, msg("/rep_topic", frm="amps-9", group=None, path=("amps-9", "amps-1")), None),
    (AMPS1, GROUPS, msg("/a", frm="IncomingMessages", group=None, path=("x", "amps-1")), None),
    # rule 4: no loops
    (AMPS1, ORDERS, msg("topic", frm="amps-9", group="G", path=("amps-2", "amps-9", "amps-1")), "loop"),
    (AMPS1, NO_PT, msg("/a", path=("amps-3", "amps-1")), "loop"),
]
IDS = [f"{i}-{c[1].name}-{c[2].topic}-{c[3]}" for i, c in enumerate(CASES)]


@pytest.mark.parametrize("cfg,dest,message,rule", CASES, ids=IDS)
def test_decide(cfg, dest, message, rule):
    d = decide(cfg, dest, message)
    assert (d.sent, d.rule) == (rule is None, rule), d.reason


def test_spark_condition_agrees_with_decide(spark):
    from pyspark.sql import functions as F

    def body(m):
        if m.data is None or isinstance(m.data, bytes):
            return m.data
        return json.dumps(m.data).encode()

    rows = [
        (i, m.topic, m.message_type, body(m), m.received_from, m.received_from_group, list(m.path))
        for i, (_c, _d, m, _r) in enumerate(CASES)
    ]
    schema = (
        "i int, topic string, message_type string, data binary, received_from string, "
        "received_from_group string, path array<string>"
    )
    df = spark.createDataFrame(rows, schema).cache()
    got = {i: False for i in range(len(CASES))}
    links = {(id(cfg), dest.name): (cfg, dest) for cfg, dest, _m, _r in CASES}
    for key, (cfg, dest) in links.items():  # one query per link
        ids = [i for i, c in enumerate(CASES) if (id(c[0]), c[1].name) == key]
        # Only the columns the condition declares: the replicator's txlog source reads no others.
        needed = df.select("i", *routing.spark_condition_columns(cfg, dest))
        for r in needed.where(F.col("i").isin(ids)).where(routing.spark_condition(cfg, dest)).select("i").collect():
            got[r.i] = True
    expected = {i: decide(cfg, dest, m).sent for i, (cfg, dest, m, _r) in enumerate(CASES)}
    assert got == expected
    assert [i for i, sent in expected.items() if sent] == [i for i, c in enumerate(CASES) if c[3] is None]


def test_message_bodies_are_read_only_by_content_filters():
    assert "data" in routing.spark_condition_columns(AMPS1, ORDERS)  # /qty > 100
    for dest in (HKG, NO_PT, GROUPS):
        columns = routing.spark_condition_columns(AMPS1, dest)
        assert "data" not in columns and {"topic", "message_type", "path"} <= set(columns), columns


def test_spark_condition_for_a_whole_txlog_in_one_query(spark):
    rows = [
        ("/orders/1", "json", b'{"qty": 500}', None, None, ["amps-1"]),
        ("/orders/2", "json", b'{"qty": 5}', None, None, ["amps-1"]),
        ("/orders/3", "json", b'{"qty": 500}', "amps-2", "DataCenter-NYC-1", ["amps-2", "amps-1"]),  # loop
        ("/orders/4", "json", b'{"qty": 500}', "amps-9", "X", ["amps-9", "amps-1"]),
        ("/other", "json", b"{}", None, None, None),
        ("topic", "json", b"", None, None, ["amps-1"]),
    ]
    df = spark.createDataFrame(
        rows,
        "topic string, message_type string, data binary, received_from string, received_from_group string, "
        "path array<string>",
    )
    picked = [r.topic for r in df.where(routing.spark_condition(AMPS1, ORDERS)).collect()]
    assert picked == ["/orders/1", "/orders/4", "topic"]


def test_target_is_the_instance_reached_through_a_failover_list():
    live = destination("LiveProdSubscriptions", pass_through=".*", addrs=("/data/Live-A", "/data/Live-B"))
    cfg = instance("Incoming-A", destinations=(live,))
    m = msg("/a", frm="Live-B", group="LiveProdSubscriptions", path=("Incoming-B", "Live-B", "Incoming-A"))
    assert decide(cfg, live, m, target="Live-A").sent
    d = decide(cfg, live, m, target="Live-B")
    assert d.rule == "loop" and "Live-B is already on the message's path" in d.reason


def test_reasons_name_the_rule_and_the_fix_direction():
    d = decide(AMPS1, NO_PT, msg("/a", frm="amps-9", group="G", path=("amps-9", "amps-1")))
    assert "destination amps-3 has no PassThrough" in d.reason and "group G" in d.reason
    d = decide(AMPS1, HKG, msg("/rep_topic", frm="x", group="DC-HKG-2", path=("x", "amps-1")))
    assert "does not match PassThrough '^((?!HKG).)*$'" in d.reason
    d = decide(AMPS1, ORDERS, msg("/orders/7", data={"qty": 1}))
    assert d.reason == "filter false: the message does not match '/qty > 100'"
    d = decide(AMPS1, ORDERS, msg("/zzz"))
    assert d.reason.startswith("no <Topic> of destination amps-2 matches topic '/zzz' (json)")
    assert decide(AMPS1, ORDERS, msg("topic")).reason == "sent to amps-2 (destination amps-2, sync)"


def test_what_the_receiving_side_records():
    sender = instance("Incoming-A", group="IncomingMessages")
    m = published("/orders/1", "Incoming-A", data={"qty": 1})
    assert (m.received_from, m.path, m.origin) == (None, ("Incoming-A",), "Incoming-A")
    r = forwarded(m, sender, "Live-A")
    assert r.received_from == "Incoming-A" and r.received_from_group == "IncomingMessages"
    assert r.path == ("Incoming-A", "Live-A") and r.origin == "Incoming-A"


def test_received_paths():
    import pyarrow as pa

    paths = pa.chunked_array([pa.array([["a", "b"], None], pa.list_(pa.string())), pa.array([[], ["d"]],
                                                                                            pa.list_(pa.string()))])
    assert routing.received_paths(paths, "c").to_pylist() == [["a", "b", "c"], ["c"], ["c"], ["d", "c"]]
    assert routing.received_paths(pa.array([], pa.list_(pa.string())), "c").to_pylist() == []


@pytest.mark.parametrize(
    "pattern,value,expected",
    [
        ("topic", "topic", True),
        ("topic", "topic2", False),
        ("topic", "my-topic", False),
        ("/orders/1", "/orders/1", True),  # '/' is not a regex character
        ("^/orders/", "/orders/1", True),
        ("^/orders/", "/x/orders/1", False),
        ("orders.*", "all-orders-2", True),  # a regex is searched, not anchored
        (".*", "", True),
        ("^((?!HKG).)*$", "DataCenter-NYC-1", True),
        ("^((?!HKG).)*$", "AMPS-HKG-2", False),
        ("IncomingMessages|LiveProdSubscriptions", "LiveProdSubscriptions", True),
    ],
)
def test_regex_matches_as_amps(pattern, value, expected):
    assert routing.regex_matches(pattern, value) is expected


def test_route_mask_agrees_with_decide_on_the_columns_spark_reads():
    """The replicator's own evaluation of a small batch: row by row as decide, from Arrow columns."""
    import pyarrow as pa

    def body(m):
        if m.data is None or isinstance(m.data, bytes):
            return m.data
        return json.dumps(m.data).encode()

    links = {(id(cfg), dest.name): (cfg, dest) for cfg, dest, _m, _r in CASES}
    for key, (cfg, dest) in links.items():
        cases = [c for c in CASES if (id(c[0]), c[1].name) == key] * 3  # repeats: answers shared by equal rows
        full = pa.table({
            "topic": [m.topic for _c, _d, m, _r in cases],
            "message_type": [m.message_type for _c, _d, m, _r in cases],
            "data": pa.array([body(m) for _c, _d, m, _r in cases], pa.binary()),
            "received_from": pa.array([m.received_from for _c, _d, m, _r in cases], pa.string()),
            "received_from_group": pa.array([m.received_from_group for _c, _d, m, _r in cases], pa.string()),
            "path": pa.array([list(m.path) for _c, _d, m, _r in cases], pa.list_(pa.string())),
        })
        table = full.select(list(routing.spark_condition_columns(cfg, dest)))
        expected = [decide(cfg, dest, m).sent for _c, _d, m, _r in cases]
        assert routing.route_mask(cfg, dest, table).tolist() == expected, dest.name


def test_route_mask_tells_apart_rows_that_differ_only_in_their_path():
    """Routing computed once per distinct header combination: paths that a joined form could confuse (a NUL in
    a name, null and []) still get each their own answer, the one decide gives."""
    import pyarrow as pa

    cfg = instance("A", destinations=[destination("B", pass_through=".*")])
    dest = cfg.destinations[0]
    paths = [["C", "A"], ["B", "A"], None, [], ["C", "B", "A"], ["B\x00C", "A"], ["B", "C\x00A"], ["C", "A"],
             [None, "B"], [None, "C"]] * 50
    table = pa.table({
        "topic": ["/t"] * len(paths),
        "message_type": ["json"] * len(paths),
        "received_from": pa.array(["C"] * len(paths), pa.string()),
        "received_from_group": pa.array(["C"] * len(paths), pa.string()),
        "path": pa.array(paths, pa.list_(pa.string())),
    })
    def loop_free(path):  # (decide explains a loop with the path's names: it needs them all)
        return "B" not in (path or [])

    expected = [decide(cfg, dest, Message("/t", received_from="C", received_from_group="C",
                                          path=tuple(p or ()))).sent if None not in (p or []) else loop_free(p)
                for p in paths]
    assert expected[8:10] == [False, True], "a null item does not hide the loop"
    assert expected[:4] == [True, False, True, True], "the loop rule decides these"
    assert routing.route_mask(cfg, dest, table).tolist() == expected
    def no_nul(path):
        return all(x is None or "\x00" not in x for x in path or [])

    def no_null(path):
        return None not in (path or [])

    def plain(path):
        return no_nul(path) and no_null(path)

    for keep in (no_nul, no_null, plain):  # (null items; NULs; neither: the vectorised path)
        some = table.filter(pa.array([keep(p) for p in paths]))
        assert routing.route_mask(cfg, dest, some).tolist() == [e for e, p in zip(expected, paths, strict=True)
                                                                 if keep(p)], keep.__name__


def test_route_mask_by_header_combination_agrees_row_by_row_on_chunked_empty_and_many_distinct_values():
    """The vectorised path against the row-by-row loop: a table of several chunks, an empty string beside a
    null, and more distinct values than the combined codes could hold without renumbering."""
    import pyarrow as pa

    cfg = instance("A", destinations=[destination("B", DestinationTopic("^t", "json"), pass_through="^g1$")])
    dest = cfg.destinations[0]
    conds = [r.condition for r in routing.rules(cfg, dest) if r.name != "topic"]

    def table(n, offset=0):
        return pa.table({
            "topic": [f"t{i + offset}" if i % 3 else f"x{i}" for i in range(n)],
            "message_type": ["json"] * n,
            "received_from": pa.array([None if i % 4 == 0 else "" if i % 4 == 1 else f"u{i + offset}"
                                       for i in range(n)], pa.string()),
            "received_from_group": pa.array([None if i % 4 == 0 else "" if i % 4 == 1 else "g1" if i % 2 else
                                             f"g{i + offset}" for i in range(n)], pa.string()),
            "origin": [f"o{i + offset}" for i in range(n)],
            "path": pa.array([["A"] if i % 5 else None for i in range(n)], pa.list_(pa.string())),
        })

    many = pa.concat_tables([table(40_000), table(40_000, offset=40_000)])  # 2 chunks; ~80k distinct per column
    assert many["topic"].num_chunks == 2
    names = list(many.column_names)
    mask = routing.route_mask(cfg, dest, many)
    assert 0 < mask.sum() < many.num_rows
    assert mask.tolist() == routing._route_each(conds, names, many, bodies=None).tolist()
    blank = table(8)  # "" is a group that matches no PassThrough; null: published here
    assert routing.route_mask(cfg, dest, blank).tolist() == [decide(cfg, dest, Message(
        r["topic"], received_from=r["received_from"], received_from_group=r["received_from_group"],
        path=tuple(r["path"] or ()), origin=r["origin"])).sent for r in blank.to_pylist()]
