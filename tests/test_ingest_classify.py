"""The ingest batch logic, without services: what is stored, rejected, dropped as duplicate."""

from __future__ import annotations

from datetime import datetime, timezone

import pyarrow as pa

from replication.config.model import InstanceConfig, TopicSpec
from replication.durability import failures_in
from replication.ingest.classify import CANDIDATE_SCHEMA, TopicRecorder, classify
from replication.ingest.sessions import ClientSessions
from replication.messages import bookmark
from replication.txlog.publishers import PublisherState

CFG = InstanceConfig(
    name="amps-1",
    group="amps-1",
    storage="/tmp/unused",
    txlog_topics=(TopicSpec("/orders.*", "json"), TopicSpec("fixfeed", "fix")),
)
NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)


def publishes(*rows: dict) -> pa.Table:
    defaults = {name: None for name in CANDIDATE_SCHEMA.names}
    full = []
    for offset, row in enumerate(rows):
        r = dict(defaults, source="kafka", kafka_topic="amps-1.publish", kafka_partition=0, kafka_offset=offset,
                 topic="/orders", message_type="json", command="publish", data=b'{"id": 1}')
        r.update(row)
        full.append(r)
    return pa.Table.from_pylist(full, schema=CANDIDATE_SCHEMA)


def run(batch: pa.Table, state: PublisherState | None = None):
    return classify(batch, state or PublisherState(), instance="amps-1", recorded=TopicRecorder(CFG), now=NOW)


def test_accepts_in_order_and_assigns_increasing_seq():
    result = run(publishes(
        {"publisher": "a", "publisher_seq": "1"},
        {"publisher": "b", "publisher_seq": "1"},
        {"publisher": "a", "publisher_seq": "2"},
    ), PublisherState(max_seq=10))
    rows = result.txlog_rows.to_pylist()
    assert [(r["publisher"], r["publisher_seq"], r["seq"]) for r in rows] == [("a", 1, 11), ("b", 1, 12), ("a", 2, 13)]
    assert rows[0]["bookmark"] == bookmark("a", 1)
    assert rows[0]["origin"] == "amps-1" and rows[0]["path"] == ["amps-1"] and rows[0]["received_from"] is None
    assert result.publishers == {"a": 2, "b": 1}
    assert result.rejected_rows.num_rows == 0


def test_duplicates_in_batch_and_below_high_water_mark_are_dropped():
    state = PublisherState(max_seq=5, publishers={"a": 3})
    result = run(publishes(
        {"publisher": "a", "publisher_seq": "2"},  # already stored
        {"publisher": "a", "publisher_seq": "4"},
        {"publisher": "a", "publisher_seq": "4"},  # resent in the same batch
        {"publisher": "a", "publisher_seq": "3"},  # older than one already seen
        {"publisher": "a", "publisher_seq": "5"},
    ), state)
    assert [r["publisher_seq"] for r in result.txlog_rows.to_pylist()] == [4, 5]
    assert result.duplicates == 3
    assert state.publishers == {"a": 3}, "classify must not change the state"


def test_bad_input_is_rejected_with_reason():
    result = run(publishes(
        {"publisher": None, "publisher_seq": "1"},
        {"publisher": "a", "publisher_seq": None},
        {"publisher": "a", "publisher_seq": "12x"},
        {"publisher": "a", "publisher_seq": "1", "data": b"{not json"},
        {"publisher": "a", "publisher_seq": "2", "topic": "/trades"},
        {"publisher": "a", "publisher_seq": "3", "message_type": "fix", "topic": "fixfeed", "data": b"garbage"},
        {"publisher": "a", "publisher_seq": "4", "command": "explode"},
        {"publisher": "a", "publisher_seq": "5"},
    ))
    reasons = result.rejected_rows["reason"].to_pylist()
    assert len(reasons) == 7
    assert "missing amps-client" in reasons[0]
    assert "missing amps-seq" in reasons[1]
    assert "'12x' is not a decimal" in reasons[2]
    assert "not valid JSON" in reasons[3]
    assert "topic '/trades' (json) is not recorded" in reasons[4] and "<TransactionLog><Topic>" in reasons[4]
    assert "not fix" in reasons[5]
    assert "amps-command 'explode'" in reasons[6]
    assert [r["publisher_seq"] for r in result.txlog_rows.to_pylist()] == [5]


def test_logon_is_answered_not_stored():
    result = run(publishes({"publisher": "a", "command": "logon", "data": b"corr-1"}))
    assert result.txlog_rows.num_rows == 0 and result.rejected_rows.num_rows == 0
    assert [(logon.client, logon.correlation_id) for logon in result.logons] == [("a", "corr-1")]


def test_delta_publish_is_stored_as_publish():
    result = run(publishes({"publisher": "a", "publisher_seq": "1", "command": "delta_publish"}))
    assert result.txlog_rows["command"].to_pylist() == ["publish"]


def test_bodies_are_checked_where_published_not_again_when_replicated():
    result = run(publishes(
        {"publisher": "a", "publisher_seq": "1", "data": b"{not json"},
        {"source": "inbox:up", "publisher": "b", "publisher_seq": "1", "data": b"{not json",
         "path": ["up"], "received_from": "up", "origin": "up", "upstream_seq": 1},
    ))
    assert [r["publisher"] for r in result.rejected_rows.to_pylist()] == ["a"]
    assert "body is not valid JSON" in result.rejected_rows["reason"][0].as_py()
    assert [r["publisher"] for r in result.txlog_rows.to_pylist()] == ["b"]


def test_received_rows_keep_their_path_and_report_the_upstream_position():
    result = run(publishes(
        {"publisher": "a", "publisher_seq": "1"},
        {"source": "inbox:up", "publisher": "b", "publisher_seq": "4", "path": ["up", "amps-1"],
         "received_from": "up", "origin": "up", "upstream_seq": 17},
        {"source": "inbox:up", "publisher": "b", "publisher_seq": "3", "path": ["up", "amps-1"],
         "received_from": "up", "origin": "up", "upstream_seq": 16},  # an older copy: dropped, still acknowledged
    ))
    rows = result.txlog_rows.to_pylist()
    assert [r["path"] for r in rows] == [["amps-1"], ["up", "amps-1"]]
    assert [r["origin"] for r in rows] == ["amps-1", "up"]
    assert result.links == {"up": 17} and result.duplicates == 1


def test_each_publisher_and_upstream_knows_the_local_rows_its_ack_waits_on():
    result = run(publishes(
        {"publisher": "a", "publisher_seq": "1"},
        {"source": "inbox:up", "publisher": "b", "publisher_seq": "1", "path": ["up"], "received_from": "up",
         "origin": "up", "upstream_seq": 7},
        {"publisher": "a", "publisher_seq": "1"},  # a duplicate takes no seq
        {"publisher": "a", "publisher_seq": "2"},
        {"source": "inbox:up", "publisher": "a", "publisher_seq": "3", "path": ["up"], "received_from": "up",
         "origin": "up", "upstream_seq": 8},
        {"source": "inbox:up", "publisher": "b", "publisher_seq": "1", "path": ["up"], "received_from": "up",
         "origin": "up", "upstream_seq": 9},  # a duplicate: acknowledged to "up", no row to wait on
    ), PublisherState(max_seq=100))
    assert result.txlog_rows["seq"].to_pylist() == [101, 102, 103, 104]
    def runs(by_key):
        return {key: list(zip(firsts.tolist(), lasts.tolist())) for key, (firsts, lasts) in by_key.items()}

    assert runs(result.publisher_rows) == {"a": [(101, 101), (103, 104)], "b": [(102, 102)]}
    assert runs(result.link_rows) == {"up": [(102, 102), (104, 104)]}
    assert result.links == {"up": 9}
    # per row: which of the upstream's seqs became which local row, and which copies were duplicates
    ups, local = result.link_seqs["up"]
    assert list(zip(ups.tolist(), local.tolist())) == [(7, 102), (8, 104)]
    assert result.link_duplicates["up"].tolist() == [9]


def test_failure_acks_go_to_the_publishers_of_refused_publishes_only():
    result = run(publishes(
        {"publisher": "a", "publisher_seq": "1"},
        {"publisher": "a", "publisher_seq": "2", "data": b"{oops"},             # refused: a's failure ack
        {"publisher": "b", "publisher_seq": "7", "topic": "/unrecorded"},       # refused: b's failure ack
        {"publisher": None, "publisher_seq": "3"},                              # refused, no one to tell
        {"publisher": "c", "publisher_seq": "x"},                               # refused, no sequence to name
        {"publisher": "d", "publisher_seq": "4", "source": "inbox:up", "topic": "/nope"},  # told where published
    ))
    assert result.rejected_rows.num_rows == 5
    failures = failures_in(result.rejected_rows)
    assert [(f.client, f.seq) for f in failures] == [("a", 2), ("b", 7)]
    reasons = dict(zip(result.rejected_rows["publisher_seq"].to_pylist(), result.rejected_rows["reason"].to_pylist()))
    assert [f.reason for f in failures] == [reasons["2"], reasons["7"]]
    assert "not recorded" in failures[1].reason


def test_transaction_log_topics_match_as_amps_topics_do():
    cfg = InstanceConfig(name="a", group="a", storage="/tmp/unused", txlog_topics=(
        TopicSpec("^/orders/", "json"), TopicSpec("/quotes", "json"), TopicSpec("^/fix/", "fix")))
    recorded = TopicRecorder(cfg)
    assert recorded("/orders/1", "json") and recorded("/fix/orders", "fix"), "a regex is searched, as routing does"
    assert recorded("/quotes", "json") and not recorded("/quotes/eu", "json"), "a literal name matches only itself"
    assert not recorded("/orders/1", "xml") and not recorded("/eu/orders/1", "json")


def sessions_batch(*rows: tuple[str | None, str | None, str]) -> pa.Table:
    return pa.table({"publisher": [r[0] for r in rows], "session": [r[1] for r in rows],
                     "command": [r[2] for r in rows]})


def test_an_earlier_session_publishing_after_a_later_logon_is_a_clash_said_once():
    sessions = ClientSessions()
    first = sessions_batch(("c", "S1", "publish"), ("d", None, "publish"), ("c", "S1", "publish"))
    assert sessions.observe(first) == []
    # S2 logs on after S1 stopped (a restarted publisher): no clash
    assert sessions.observe(sessions_batch(("c", "S2", "logon"), ("c", "S2", "publish"))) == []
    # S1 is still alive: it publishes after S2's logon
    clashes = sessions.observe(sessions_batch(("c", "S1", "publish"), ("c", "S2", "publish"), ("c", "S1", "publish")))
    assert [(c.client, c.earlier, c.later) for c in clashes] == [("c", "S1", "S2")]
    assert "client name 'c' is in use by another publisher (session S1)" in clashes[0].reason
    assert sessions.clashes["c"].later == "S2"
    # a client without sessions (any Kafka client) is never checked
    assert sessions.observe(sessions_batch(("e", None, "logon"), ("e", None, "publish"))) == []


def test_a_batch_replayed_after_a_failure_is_no_clash():
    sessions = ClientSessions()
    sessions.observe(sessions_batch(("c", "S1", "publish")), 1)
    restart = sessions_batch(("c", "S1", "publish"), ("c", "S2", "logon"), ("c", "S2", "publish"))
    assert sessions.observe(restart, 2) == []
    assert sessions.observe(restart, 2) == [], "batch 2 again (it failed before its commit): the same answer"
    assert [c.earlier for c in sessions.observe(sessions_batch(("c", "S1", "publish")), 3)] == ["S1"]
