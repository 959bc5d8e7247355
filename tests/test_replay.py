"""Replay end to end: a running instance's txlog read back by bookmark, through Spark, a stream and the CLI.

Three publishers, real broker; ``replay.txlog`` (Spark), ``replay.subscribe`` (a stream) and
``replication replay`` (no Spark)."""

from __future__ import annotations

import base64
import json
import queue
import threading
from pathlib import Path

import pyarrow as pa
import pytest
from support.cli import run_cli, start_cli
from support.fabric import TestFabric
from support.factories import stamp, wait_until
from support.streams import collecting, spark_seqs

from replication import config as configs
from replication import expressions, replay, routing
from replication.errors import ConfigError, InputError
from replication.expressions import FilterSyntaxError
from replication.messages import BOOKMARK_FORMS

PUBLISHERS = ("alpha", "beta", "gamma")
WAVES = 3
PER_WAVE = 40
#: Plans that run Python row by row: a filter compiled to native columns has none of them.
PYTHON_PLAN_NODES = ("PythonUDF", "BatchEvalPython", "ArrowEvalPython")


def body(wave: int, k: int, i: int) -> dict:
    return {"qty": (i * 37 + k * 11 + wave) % 300, "side": "buy" if (i + k) % 2 else "sell", "wave": wave}


def topic_of(i: int) -> str:
    return "/trades/x" if i % 5 == 0 else f"/orders/{i % 4}"


@pytest.fixture(scope="module")
def stored(spark, broker, tmp_path_factory):
    """Instance ``a`` (kept running for the module) whose txlog holds 3 waves from 3 publishers, each wave
    persisted before the next is published (so waves have distinct persist times)."""
    fabric = TestFabric(spark, broker, tmp_path_factory.mktemp("replay"))
    config = fabric.configure("a")
    fabric.start("a")
    pubs = [fabric.publisher(name, "a") for name in PUBLISHERS]
    for wave in range(WAVES):
        for k, pub in enumerate(pubs):
            for i in range(PER_WAVE):
                pub.publish(topic_of(i), json.dumps(body(wave, k, i)).encode())
        for pub in pubs:
            pub.flush(timeout=120)
    yield fabric, config
    fabric.close()






def cases(rows: pa.Table) -> dict[str, tuple[str, str | None, list[int]]]:
    """Bookmark forms on this txlog: (bookmark, until, the seqs a replay must return)."""
    seqs, marks, times = (rows[c].to_pylist() for c in ("seq", "bookmark", "persist_time"))
    n = len(seqs)
    wave2 = next(i for i in range(1, n) if times[i] > times[i - 1] and i > n // 2)  # a commit's first row
    mid, late, early = n // 2, 3 * n // 4, n // 3
    return {
        "epoch": ("0", None, seqs),
        "now": ("0|1|", None, []),
        "mid-log bookmark": (marks[mid], None, seqs[mid + 1:]),
        "timestamp": (stamp(times[wave2]), None, [s for s, t in zip(seqs, times) if t >= times[wave2]]),
        "list": (f"{marks[late]},{stamp(times[wave2])},{marks[early]}", None, seqs[early + 1:]),
        "until bookmark": (marks[early], marks[late], seqs[early + 1:late + 1]),
        "until timestamp": ("0", stamp(times[wave2]), seqs[:wave2]),
    }


@pytest.mark.parametrize("form", ["epoch", "now", "mid-log bookmark", "timestamp", "list", "until bookmark",
                                  "until timestamp"])
def test_each_bookmark_form_replays_exactly_its_rows(stored, form):
    fabric, config = stored
    rows = fabric.rows("a")
    assert rows.num_rows == WAVES * PER_WAVE * len(PUBLISHERS)
    bookmark, until, expected = cases(rows)[form]

    df = replay.txlog(str(config), bookmark=bookmark, until=until)
    assert spark_seqs(df) == expected

    args = ["--bookmark", bookmark] + (["--until", until] if until else [])
    replayed = run_cli("replay", str(config), "--topic", ".*", *args)
    assert replayed.code == 0 and [m["seq"] for m in replayed.jsonl()] == expected


def test_jsonl_has_every_field_and_the_parsed_body(stored):
    fabric, config = stored
    first = fabric.rows("a").slice(0, 1).to_pylist()[0]
    replayed = run_cli("replay", str(config), "--topic", ".*", "--limit", "1")
    [message] = replayed.jsonl()
    assert replayed.code == 0
    assert message == {
        "bookmark": first["bookmark"], "seq": 1, "topic": first["topic"], "message_type": "json",
        "publisher": first["publisher"], "publisher_seq": first["publisher_seq"], "command": "publish",
        "sow_keys": None,
        "publish_time": first["publish_time"].strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        "persist_time": first["persist_time"].strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        "origin": fabric.name("a"), "path": [fabric.name("a")], "data": json.loads(first["data"]),
    }


def test_json_lines_are_the_objects_a_per_row_dump_makes():
    """``replay`` and ``sow`` print JSON lines built column-wise: each line parses to the object the per-row
    path makes (times as ISO text, json bodies parsed, text and base64 bodies, nulls, escapes, lists)."""
    from datetime import datetime, timezone

    from replication.commands.output import body_value, json_lines

    at = datetime(2026, 5, 6, 7, 8, 9, 12, tzinfo=timezone.utc)
    rows = pa.table({
        "bookmark": ["1|1|", 'a"b\\c', None, "tab\there", "\u00e9|5|"],
        "seq": pa.array([1, None, 3, 4, 5], pa.int64()),
        "persist_time": pa.array([at, at, None, at, at], pa.timestamp("us", tz="UTC")),
        "path": [["a"], None, [], ['x"y', "z"], ["\u00e9"]],
        "message_type": ["json", "json", "fix", "binary", "json"],
        "data": [b'{"a": [1, {"b": null}]}', b'{\n  "multi": "line"\n}', b"35=D\x0155=X\x01", b"\xff\x00", b""],
    })
    fields = ("bookmark", "seq", "persist_time", "path", "message_type", "data")
    printed = json_lines(rows, fields)
    assert printed.endswith(b"\n") and printed.count(b"\n") == rows.num_rows
    for line, row in zip(printed.splitlines(), rows.to_pylist(), strict=True):
        assert list(json.loads(line)) == list(fields)
        assert json.loads(line) == {
            **row, "data": body_value(row["message_type"], row["data"]),
            "persist_time": row["persist_time"] and row["persist_time"].strftime("%Y-%m-%dT%H:%M:%S.%fZ")}
    assert json_lines(rows.slice(0, 0), fields) == b""
    odd = rows.set_column(rows.schema.get_field_index("data"), "data", pa.array(
        [b'{"a": 1}', b"\xff not utf-8", None, b"x", b"[]"], pa.binary()))  # a "json" body never checked
    assert [json.loads(line)["data"] for line in json_lines(odd, fields).splitlines()] == [
        {"a": 1}, base64.b64encode(b"\xff not utf-8").decode(), None, "eA==", []]
    assert json_lines(rows.slice(3, 2), fields).splitlines() == printed.splitlines()[3:]


def test_resuming_from_the_last_printed_bookmark_yields_the_rest_exactly_once(stored):
    fabric, config = stored
    selection = ["--topic", "^/orders/", "--filter", "/qty > 120"]
    everything = run_cli("replay", str(config), *selection).jsonl()
    first = run_cli("replay", str(config), *selection, "--limit", "25").jsonl()
    rest = run_cli("replay", str(config), *selection, "--bookmark", first[-1]["bookmark"]).jsonl()
    assert len(first) == 25 and rest
    assert [m["seq"] for m in first + rest] == [m["seq"] for m in everything]


def test_topic_regex_and_filter_select_what_plain_python_selects_with_no_python_udf(stored):
    fabric, config = stored
    rows = fabric.rows("a").to_pylist()
    cases = [("^/orders/[12]$", "/qty > 100 AND /side = 'buy'"), ("/trades/x", "/qty BETWEEN 50 AND 150"),
             (".*", "/wave IN (0, 2) AND NOT /side LIKE '^s'"), ("^/orders", None)]
    for topic, text in cases:
        expected = [r["seq"] for r in rows if routing.regex_matches(topic, r["topic"])
                    and (text is None or expressions.evaluate(expressions.parse(text), r["data"]))]
        assert 0 < len(expected) < len(rows), (topic, text)
        df = replay.txlog(configs.load(config), topic=topic, filter=text)  # a parsed config is a source too
        plan = df._jdf.queryExecution().executedPlan().toString()
        assert not [node for node in PYTHON_PLAN_NODES if node in plan], plan
        assert spark_seqs(df) == expected, (topic, text)
        printed = run_cli("replay", str(fabric.paths["a"]), "--topic", topic,
                          *(["--filter", text] if text else [])).jsonl()
        assert [m["seq"] for m in printed] == expected, (topic, text)


def test_json_columns_types_the_bodies(stored):
    fabric, config = stored
    typed = replay.json_columns(replay.txlog(config, topic="^/orders/0$"))
    assert {"qty": "bigint", "side": "string", "wave": "bigint"}.items() <= dict(typed.dtypes).items()
    expected = sum(json.loads(r["data"])["qty"] for r in fabric.rows("a").to_pylist() if r["topic"] == "/orders/0")
    assert typed.agg({"qty": "sum"}).first()[0] == expected


def test_bad_input_is_one_line_without_traceback_and_exit_2(stored, tmp_path):
    fabric, config = stored
    known = fabric.rows("a")["bookmark"][0].as_py()
    pid = known.split("|")[0]
    for args, says in [
        (["--bookmark", "12:30"], f"'12:30' is not a bookmark; write one of: {BOOKMARK_FORMS}"),
        (["--bookmark", f"{pid}|999999|"], f"bookmark '{pid}|999999|' is not in the txlog of"),
        (["--filter", "/qty > 1 AND"], "--filter '/qty > 1 AND': invalid filter at position 13: expected"),
        (["--topic", "("], "topic '(' is not a regular expression"),
    ]:
        run = run_cli("replay", str(config), "--topic", ".*", *args, process=True)
        assert (run.code, run.out) == (2, ""), args
        assert run.err.count("\n") == 1 and "Traceback" not in run.err, run.err
        assert says in run.err, run.err
    run = run_cli("replay", str(tmp_path / "absent.xml"), "--topic", ".*", process=True)
    assert run.code == 2 and run.err.count("\n") == 1 and "config file not found" in run.err

    # The notebook API raises the same errors.
    with pytest.raises(InputError, match="is not a bookmark"):
        replay.txlog(config, bookmark="12:30")
    with pytest.raises(InputError, match="is not in the txlog"):
        replay.subscribe(config, bookmark=f"{pid}|999999|")
    with pytest.raises(FilterSyntaxError, match="position 13"):
        replay.txlog(config, filter="/qty > 1 AND")
    with pytest.raises(ConfigError, match="config file not found"):
        replay.txlog(tmp_path / "absent.xml")


def test_sow_of_a_topic_that_is_not_a_sow_topic_says_so(stored):
    fabric, config = stored
    from replication.errors import InputError

    with pytest.raises(InputError, match="'/orders' is not a SOW topic of .*its SOW topics: none"):
        replay.sow(config, topic="/orders")


# -- live: these publish more, so they come after the tests that read the stored waves ----------


def test_now_with_follow_prints_only_messages_committed_later(stored):
    fabric, config = stored
    before = fabric.count("a")
    proc = start_cli("replay", str(config), "--topic", ".*", "--bookmark", "0|1|", "--follow", "--poll", "0.1")
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()
    try:
        assert f"following {fabric.name('a')} after seq {before}" in proc.stderr.readline()
        pub = fabric.publisher("late", "a")
        for i in range(30):
            pub.publish("/orders/late", json.dumps({"i": i}).encode())
        pub.flush(timeout=120)
        printed = [json.loads(lines.get(timeout=60)) for _ in range(30)]
        assert not children_running(proc.pid, "java"), "replication replay reads without starting Spark"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert [(m["publisher"], m["publisher_seq"], m["data"]["i"]) for m in printed] == [
        ("late", i + 1, i) for i in range(30)]
    assert [m["seq"] for m in printed] == list(range(before + 1, before + 31))
    assert lines.empty()




def children_running(pid: int, program: str) -> list[int]:
    """Processes started by ``pid`` (at any depth) whose command line mentions ``program``."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # ended meanwhile
            continue
        parents[int(entry.name)] = int(stat[stat.rindex(")") + 2:].split()[1])
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        for child in [c for c, ppid in parents.items() if ppid == parent]:
            todo.append(child)
            try:
                if program in (Path("/proc") / str(child) / "cmdline").read_bytes().decode(errors="replace"):
                    found.append(child)
            except OSError:
                continue
    return found


def test_subscribe_from_now_delivers_only_later_messages(stored, tmp_path):
    fabric, config = stored
    stream = replay.subscribe(config, topic="^/orders/", bookmark="0|1|")
    before = fabric.count("a")
    seen: list[int] = []
    query = collecting(stream, tmp_path / "cp", seen)
    try:
        pub = fabric.publisher("later", "a")
        for i in range(20):
            pub.publish("/orders/now" if i % 2 else "/trades/now", json.dumps({"i": i}).encode())
        pub.flush(timeout=120)
        wait_until(lambda: len(seen) >= 10 or query.exception(), what="the new /orders messages")
    finally:
        query.stop()
    assert seen == list(range(before + 2, before + 21, 2))


def test_subscribe_delivers_stored_then_live_messages_once_in_order_across_a_restart(stored, tmp_path):
    fabric, config = stored
    seen: list[int] = []
    query = collecting(replay.subscribe(config, max_rows_per_trigger=150), tmp_path / "cp", seen)
    pub = fabric.publisher("live", "a")
    try:
        wait_until(lambda: len(seen) >= fabric.count("a") or query.exception(), what="the stored messages")
        for i in range(30):
            pub.publish("/orders/live", json.dumps({"i": i}).encode())
        pub.flush(timeout=120)
        wait_until(lambda: len(seen) >= fabric.count("a") or query.exception(), what="the live messages")
    finally:
        query.stop()
    for i in range(30, 60):  # committed while the subscription is down
        pub.publish("/orders/live", json.dumps({"i": i}).encode())
    pub.flush(timeout=120)
    # Restarted from its checkpoint: the bookmark of a new subscription does not apply (NOW here would skip).
    query = collecting(replay.subscribe(config, bookmark="0|1|"), tmp_path / "cp", seen)
    try:
        wait_until(lambda: len(seen) >= fabric.count("a") or query.exception(), what="the messages missed")
        pub.publish("/orders/live", b'{"i": 60}')
        pub.flush(timeout=120)
        wait_until(lambda: len(seen) >= fabric.count("a") or query.exception(), what="the last message")
    finally:
        query.stop()
    assert query.exception() is None
    assert seen == list(range(1, fabric.count("a") + 1))
