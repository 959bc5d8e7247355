"""Batch backfill from files into an instance (real Spark, broker and Delta; a CLI process for kill -9)."""

from __future__ import annotations

import datetime
import decimal
import io
import json
import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable
from deltalake.transaction import AddAction
from kafka import KafkaProducer
from support.cli import run_cli
from support.fabric import AckListener
from support.factories import rejected_rows, wait_until, write_config

from replication import backfill, config
from replication.backfill.commit import check_and_record_input, client_lock, committed_through
from replication.backfill.plan import NumberedFile
from replication.backfill.tasks import files_per_task, message_bodies, write_file_parts
from replication.commands import backfill as backfill_command
from replication.connectors import files, row_json
from replication.connectors.delta.stats import file_stats
from replication.destination.resync import stored_per_publisher
from replication.durability import acks_topic
from replication.errors import ReplicationError
from replication.inbox.staged_parts import StagedPart
from replication.inbox.versions import staged_parts
from replication.messages import publisher_id
from replication.storage.layout import StorageLayout
from replication.txlog.schema import TXLOG_SCHEMA


def handed_over(root, columns: list[str]) -> pa.Table:
    """What backfills handed an instance that has not stored it (it does not run): the rows of the staged parts
    its inbox's commits name, in inbox order."""
    inbox = root / "inbox"
    parts = [StagedPart.from_json(text) for _, text in staged_parts(str(inbox), 0, DeltaTable(str(inbox)).version())]
    return pa.concat_tables([pq.read_table(inbox / part.file, columns=columns) for part in parts])


def stored(fabric, short: str, client: str) -> int:
    return stored_per_publisher(StorageLayout.of(str(fabric.storage(short)))).get(client, 0)


def publisher_rows(fabric, short: str, client: str) -> list[int]:
    rows = fabric.rows(short)
    return [s for p, s in zip(rows["publisher"].to_pylist(), rows["publisher_seq"].to_pylist()) if p == client]


@pytest.fixture
def pair(fabric):
    """A (running) with a sync destination B (running)."""
    fabric.start_one_way_pair()
    return fabric


def test_100k_rows_from_parquet_and_from_json_lines_each_twice_are_stored_once_replicated_and_acked(pair, spark,
                                                                                                    tmp_path):
    cfg = config.load(str(pair.paths["a"]))
    parquet_dir, jsonl_dir = tmp_path / "parquet", tmp_path / "jsonl"
    parquet_dir.mkdir()
    jsonl_dir.mkdir()
    for part, (lo, hi) in enumerate(((0, 40_000), (40_000, 70_000), (70_000, 100_000))):
        ids = list(range(lo, hi))
        pq.write_table(pa.table({"id": ids, "qty": [i % 500 for i in ids], "side": ["buy"] * len(ids)}),
                       parquet_dir / f"orders-{part}.parquet")
    for part, (lo, hi) in enumerate(((0, 60_000), (60_000, 100_000))):
        (jsonl_dir / f"trades-{part}.jsonl").write_bytes(
            b"".join(json.dumps({"trade": i, "px": i / 4}).encode() + b"\n" for i in range(lo, hi)))

    with AckListener("kafka-python", pair.broker.bootstrap, acks_topic(pair.name("a"))) as acks:
        for client, fmt, inputs, topic in (("loader-pq", "parquet", [str(parquet_dir)], "/orders"),
                                           ("loader-jl", "jsonl", [str(jsonl_dir / "trades-0.jsonl"),
                                                                   str(jsonl_dir / "trades-1.jsonl")], "/trades")):
            options = backfill.Options(client, fmt, topic=topic)
            first = backfill.run(spark, cfg, inputs, options)
            assert (first.rows, first.stored, first.rejected, first.last_seq) == (100_000, 100_000, 0, 100_000)
            wait_until(lambda c=client: stored(pair, "a", c) == 100_000, timeout=300, what=f"A to store {client}")
            again = backfill.run(spark, cfg, inputs, options)
            assert (again.rows, again.stored, again.parts) == (100_000, 0, 0), "a repeated backfill writes nothing"
            wait_until(lambda c=client: acks.persisted.get(c) == 100_000,
                       timeout=300, what=f"the persisted ack of {client} (sync: once B has every row)")
            assert publisher_rows(pair, "b", client) == list(range(1, 100_001)), "replicated to B once, in order"
            assert publisher_rows(pair, "a", client) == list(range(1, 100_001)), "stored once, in input order"

    rows = pair.rows("a")
    first_of = {p: i for i, p in reversed(list(enumerate(rows["publisher"].to_pylist())))}
    parquet_row = rows.slice(first_of["loader-pq"], 1).to_pylist()[0]
    assert (parquet_row["topic"], json.loads(parquet_row["data"])) == ("/orders", {"id": 0, "qty": 0, "side": "buy"})
    assert parquet_row["origin"] == pair.name("a") and parquet_row["received_from"] is None
    assert parquet_row["path"] == [pair.name("a")], "a publish of A: its path is A alone"
    b_row = pair.rows("b").slice(0, 1).to_pylist()[0]
    assert (b_row["publisher"], b_row["received_from"], b_row["path"]) == ("loader-pq", pair.name("a"),
                                                                           [pair.name("a"), pair.name("b")])
    jsonl_row = rows.slice(first_of["loader-jl"], 1).to_pylist()[0]
    assert jsonl_row["data"] == b'{"trade": 0, "px": 0.0}', "a JSON line is stored as written"
    assert pair.running["a"].writer.staged.stats == {"stored_as_is": 5, "classified": 0}, \
        "each part's file (one per input file here) stored as the backfill staged it"
    # those files as Spark reads a txlog (replay), and a bookmark found by their statistics
    from replication import replay

    frame = replay.txlog(str(pair.paths["a"]), filter="/qty = 7", spark=spark)
    assert sorted(r["publisher_seq"] for r in frame.select("publisher_seq").collect()) == list(range(8, 100_001, 500))
    mark = f"{publisher_id('loader-pq')}|99999|"
    assert [r["publisher_seq"] for r in replay.txlog(str(pair.paths["a"]), bookmark=mark, topic="/orders",
                                                      spark=spark).select("publisher_seq").collect()] == [100_000]


def test_a_backfill_whose_task_fails_or_that_is_killed_completes_on_a_rerun_with_no_duplicate(pair, tmp_path):
    inputs = tmp_path / "in"
    inputs.mkdir()
    for part in range(5):  # one commit per file: five parts
        ids = range(part * 6000, (part + 1) * 6000)
        pq.write_table(pa.table({"id": list(ids), "kind": ["/fills"] * 6000}), inputs / f"f{part}.parquet")
    args = [str(pair.paths["a"]), "--input", str(inputs), "--format", "parquet", "--client", "loader",
            "--topic-column", "kind"]
    # Two cores: tasks [f0, f1], [f2, f3], [f4]. Each of the first two fails after writing its second part;
    # the driver has committed f0's and f1's parts from the first task's announcements (it never returned them).
    two_cores = {"REPLICATION_SPARK_MASTER": "local[2]"}
    failed = run_cli("backfill", *args, env={"REPLICATION_FAILPOINTS": "backfill.part_written@2:raise", **two_cores})
    assert failed.code == 1, failed.err[-3000:]
    error = next(line for line in failed.err.splitlines() if line.startswith("replication backfill: "))
    assert error.startswith("replication backfill: ") and "f0.parquet (and the files after it in its task): a " \
        "Spark task failed: " in error and "failpoint backfill.part_written reached (pass 2)" in error, error
    assert "run the same backfill again to finish" in error
    wait_until(lambda: stored(pair, "a", "loader") == 12_000, timeout=120, what="the two parts written")
    # killed -9 right after its second commit (parts 3 and 4)
    killed = run_cli("backfill", *args, env={"REPLICATION_FAILPOINTS": "backfill.after_part@2", **two_cores})
    assert killed.code == -9 and "failpoint backfill.after_part reached" in killed.err
    wait_until(lambda: stored(pair, "a", "loader") == 24_000, timeout=120, what="the four committed parts")
    rerun = run_cli("backfill", *args, "--wait", "300", process=True)
    assert rerun.code == 0, rerun.err[-3000:]
    assert "6,000 written, 0 rejected, in 1 new commit(s)" in rerun.out
    assert "stored every backfilled row (client loader through 30,000)" in rerun.out
    assert "backfill" in rerun.err and "rows/s" in rerun.err, "the progress bar, with its rate"
    assert publisher_rows(pair, "a", "loader") == list(range(1, 30_001))
    wait_until(lambda: publisher_rows(pair, "b", "loader") == list(range(1, 30_001)), timeout=120,
               what="B to hold every backfilled row once")


def test_bad_input_stops_before_writing_and_bad_rows_go_to_rejected_with_file_and_row(pair, spark, tmp_path):
    cfg = config.load(str(pair.paths["a"]))
    good = tmp_path / "good.parquet"
    pq.write_table(pa.table({"id": [1, 2], "body": ['{"a": 1}', "not json"]}), good)
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(backfill.BackfillInputError, match=f"{broken}: cannot be read as parquet"):
        backfill.run(spark, cfg, [str(good), str(broken)], backfill.Options("x", "parquet", topic="/t"))
    with pytest.raises(backfill.BackfillInputError,
                       match=rf"{good}: no column 'payload' \(its columns: id, body\)"):
        backfill.run(spark, cfg, [str(good)], backfill.Options("x", "parquet", topic="/t", data_column="payload"))
    lines = tmp_path / "lines.jsonl"
    lines.write_bytes(b'{"v": 1}\n{"v": 2}\n{"v": \n{"v": 4}\n')
    with pytest.raises(backfill.BackfillInputError,  # (JSON lines are counted by Spark's tasks, Parquet here)
                       match=rf"{lines}: no column 'payload' \(its columns: v\)"):
        backfill.run(spark, cfg, [str(lines)], backfill.Options("x", "jsonl", topic="/t", data_column="payload"))
    assert DeltaTable(str(pair.storage("a") / "inbox")).transaction_version("backfill-seq:x") is None, "nothing written"

    # a part of rejected rows only commits the inbox's position alone: the running instance goes on past it
    all_bad = tmp_path / "all-bad.jsonl"
    all_bad.write_bytes(b'{"v": \n"unterminated\n')
    assert backfill.run(spark, cfg, [str(all_bad)], backfill.Options("all-bad", "jsonl", topic="/t")).rejected == 2
    result = run_cli("backfill", str(pair.paths["a"]), "--input", str(lines), "--format", "jsonl", "--client", "lines",
                     "--topic", "/lines", "--wait", "120", process=True)
    assert result.code == 1, result.err[-2000:]
    assert f"rejected: {lines} line 3: body is not valid JSON" in result.err
    assert "3 written, 1 rejected" in result.out and "Traceback" not in result.err
    assert publisher_rows(pair, "a", "lines") == [1, 2, 4]
    # a re-run stores nothing new, but its rows' rejects stand: still said, still exit 1; --wait waits for
    # the rows an earlier run wrote (stored already here)
    again = run_cli("backfill", str(pair.paths["a"]), "--input", str(lines), "--format", "jsonl", "--client", "lines",
                    "--topic", "/lines", "--wait", "120", process=True)
    assert again.code == 1, again.err[-2000:]
    assert f"rejected: {lines} line 3: body is not valid JSON" in again.err
    assert "1 of these rows were rejected by an earlier run of this backfill and stay so" in again.err
    assert "0 written, 0 rejected (1 rejected by an earlier run), in 0 new commit(s)" in again.out
    assert "stored every backfilled row (client lines through 4)" in again.out
    (bad,) = [r for r in rejected_rows(pair.root, pair.name("a")) if r["publisher"] == "lines"]
    assert bad["publisher_seq"] == "3" and bad["reason"].startswith(f"{lines} line 3: body is not valid JSON")
    missing = run_cli("backfill", str(pair.paths["a"]), "--input", str(tmp_path / "absent"), "--format", "csv",
                      "--client", "c", "--topic", "/t", process=True)
    assert missing.code == 2 and missing.err.strip().endswith("absent: no such file or directory")
    assert len(missing.err.strip().splitlines()) == 1
    # an instance without an inbox: said in one line, before Spark starts (its banner would follow on stderr)
    no_inbox = tmp_path / "no-inbox.xml"
    no_inbox.write_text(re.sub(r"<Transport>\s*<Name>amps-replication</Name>.*?</Transport>", "",
                               pair.paths["a"].read_text(), flags=re.S))
    refused = run_cli("backfill", str(no_inbox), "--input", str(lines), "--format", "jsonl", "--client", "c",
                      "--topic", "/t", process=True)
    assert refused.code == 2, refused.err[-2000:]
    assert refused.err.strip().splitlines() == [
        f"replication backfill: {pair.name('a')} has no incoming amps-replication transport: backfilled rows "
        "enter through the inbox. Fix: add <Transport><Name>amps-replication</Name><Type>amps-replication</Type>"
        "</Transport>"]


def test_a_row_as_json_is_what_orjson_makes_of_it_and_each_type_has_a_json_form_a_reader_expects():
    import orjson

    table = pa.table({"id": pa.array([1, None, -3], pa.int64()), "sym": ["ACME", "é✓", None],
                      "ok": [True, False, None], "big": pa.array([2**64 - 1, 0, 5], pa.uint64())})
    bodies, generated = message_bodies(table, backfill.Options("c", "parquet", topic="/t"))
    assert generated and bodies.to_pylist() == [orjson.dumps(row) for row in table.to_pylist()]
    # string columns without nulls (their quotes go in the text between columns), first, inner and last
    plain = pa.table({"sym": ["A", ""], "n": [1, None], "desk": pa.array(["x", "é"], pa.large_string()),
                      "on": [True, True], "note": ["last", "one"]})
    assert row_json.rows_as_json(plain).to_pylist() == [orjson.dumps(row) for row in plain.to_pylist()]
    # strings JSON must escape, floats: dumped value by value, the same text
    for odd in (pa.table({"s": ['say "hi"', "a\\b", "tab\tnl\n"], "n": [1, 2, 3]}), pa.table({"px": [1.5, 1e20, None]}),
                pa.table({"s": ["back\\slash", None]}), pa.table({"s": pa.array(["bell\x07"], pa.large_string())})):
        assert row_json.rows_as_json(odd).to_pylist() == [orjson.dumps(row) for row in odd.to_pylist()]
    # only the rows of a slice count
    sliced = pa.table({"s": ['"before"', "inside", "also inside", "after\n"]}).slice(1, 2)
    assert row_json.rows_as_json(sliced).to_pylist() == [orjson.dumps(row) for row in sliced.to_pylist()]
    # what orjson has no form for, or Python's str() would spell its own way
    kinds = pa.table({
        "raw": pa.array([b"\x00\xff", None]),
        "ts": pa.array([1_700_000_000_123_456_789, None], pa.timestamp("ns", tz="UTC")),
        "wait": pa.array([5_000_000_001, -1], pa.duration("ns")), "pause": pa.array([1_500_000, 0], pa.duration("us")),
        "price": pa.array([decimal.Decimal("1.50"), None], pa.decimal128(5, 2)),
        "tags": pa.array([[("desk", 7)], None], pa.map_(pa.string(), pa.int64())),
        "nested": pa.array([{"x": 1, "m": [("a", "b")]}, None],
                           pa.struct([("x", pa.int64()), ("m", pa.map_(pa.string(), pa.string()))])),
        "day": pa.array([datetime.date(2024, 1, 2), None]), "px": [float("nan"), 2.0],
        "small": pa.array([1.1, float("inf")], pa.float32()), "at": pa.array([1001, None], pa.time64("ns"))})
    assert [json.loads(b) for b in row_json.rows_as_json(kinds).to_pylist()] == [
        {"raw": "AP8=", "ts": "2023-11-14T22:13:20.123456789+00:00", "wait": "PT5.000000001S", "pause": "PT1.5S",
         "price": 1.5, "tags": {"desk": 7}, "nested": {"x": 1, "m": {"a": "b"}}, "day": "2024-01-02", "px": None,
         "small": 1.1, "at": "00:00:00.000001001"},
        {"raw": None, "ts": None, "wait": "-PT0.000000001S", "pause": "PT0S", "price": None, "tags": None,
         "nested": None, "day": None, "px": 2.0, "small": None, "at": None}]
    assert b'"price":1.50' in row_json.rows_as_json(kinds).to_pylist()[0], "a decimal's digits, as a number"


def test_csv_cells_are_text_and_a_cell_that_is_a_json_value_is_that_value(spark, tmp_path):
    cfg = config.load(str(write_config(tmp_path, "solo", "localhost:9")))
    source = tmp_path / "zips.csv"
    # numbers for more than the ~1 MB a type is guessed from, then text in the same column
    rows = [f"{n:08d},{n},1.5e3,TRUE,x" for n in range(1, 130_001)] + ['n/a,-0,"",true,"say ""hi"""', "02134,,,false,",
                                                                        "7,12345678901234567890123,1e999,0.5e-3,1."]
    source.write_text("zip,n,px,flag,note\n" + "\n".join(rows) + "\n")
    result = backfill.run(spark, cfg, [str(source)], backfill.Options("zips", "csv", topic="/orders"))
    assert (result.stored, result.rejected) == (130_003, 0)
    inbox = handed_over(tmp_path / "solo", ["publisher_seq", "data"])
    bodies = dict(zip(inbox["publisher_seq"].to_pylist(), inbox["data"].to_pylist()))
    assert json.loads(bodies[1]) == {"zip": "00000001", "n": 1, "px": 1500.0, "flag": "TRUE", "note": "x"}
    assert bodies[130_001] == b'{"zip":"n/a","n":-0,"px":"","flag":true,"note":"say \\"hi\\""}'
    assert json.loads(bodies[130_002]) == {"zip": "02134", "n": None, "px": None, "flag": False, "note": None}
    # an integer a double would round (an id) and a number no double holds stay text, as written
    assert bodies[130_003] == b'{"zip":7,"n":"12345678901234567890123","px":"1e999","flag":0.5e-3,"note":"1."}'
    marked = tmp_path / "marked.csv"  # (a byte order mark, as spreadsheets write: not part of the first name)
    marked.write_bytes("\ufeffzip,n\n02134,5\n".encode())
    assert [b.to_pylist() for b in files.batches(str(marked), "csv")] == [[{"zip": "02134", "n": "5"}]]


def test_a_part_stages_good_rows_as_txlog_rows_and_each_bad_one_to_rejected_with_its_row_and_reason(tmp_path):
    # One Spark task's work on one file, run here: the checks are per row, the columns Arrow arrays.
    cfg = config.load(str(write_config(tmp_path, "solo", "localhost:9", txlog_topics=(
        "<Topic><Name>/orders</Name><MessageType>json</MessageType></Topic>"))))
    source = tmp_path / "in.parquet"
    pq.write_table(pa.table({"kind": ["/orders", None, "", "/other", "/orders", "/orders"],
                             "body": ['{"a":1}', '{"a":2}', '{"a":3}', '{"a":4}', "not json", '{"a":6}']}), source)
    (tmp_path / "inbox" / "staging").mkdir(parents=True)
    (tmp_path / "rejected").mkdir()
    options = backfill.Options("loader", "parquet", topic_column="kind", data_column="body")
    (part,) = write_file_parts(cfg, NumberedFile(str(source), 6, 101), options,
                               (str(tmp_path / "inbox"), str(tmp_path / "inbox" / "staging")),
                               str(tmp_path / "rejected"), 0)
    assert (part.first_seq, part.rows, part.rejected_rows, part.last_good_seq) == (101, 6, 4, 106)
    staged = StagedPart.from_json(part.staged)
    assert (staged.client, staged.rows, staged.first, staged.last, staged.topics) == ("loader", 2, 101, 106,
                                                                                      ("/orders",))
    rows = pq.read_table(tmp_path / "inbox" / staged.file)
    assert rows.schema == TXLOG_SCHEMA, "the rows as the instance stores them"
    assert rows.select(["publisher", "publisher_seq", "topic", "data", "bookmark", "command"]).to_pylist() == [
        {"publisher": "loader", "publisher_seq": s, "topic": "/orders", "data": body, "command": "publish",
         "bookmark": f"{publisher_id('loader')}|{s}|"} for s, body in ((101, b'{"a":1}'), (106, b'{"a":6}'))]
    assert rows.select(["origin", "received_from", "path"]).to_pylist() == [
        {"origin": "solo", "received_from": None, "path": ["solo"]}] * 2, "a publish of solo"
    whole = file_stats(rows)  # (what delta-rs would write, see test_delta_log)
    assert staged.stats == {key: {c: v for c, v in value.items() if c not in ("seq", "persist_time")}
                            if isinstance(value, dict) else value for key, value in whole.items()}, \
        "its statistics, but for the columns the instance writes"
    rejected = pq.read_table(tmp_path / "rejected" / part.rejected["path"]).to_pylist()
    assert [(r["publisher_seq"], r["topic"], r["data"]) for r in rejected] == [
        ("102", None, b'{"a":2}'), ("103", "", b'{"a":3}'), ("104", "/other", b'{"a":4}'),
        ("105", "/orders", b"not json")]
    reasons = [r["reason"] for r in rejected]
    assert reasons[0] == f"{source} row 2: no topic (column 'kind' is empty)" and reasons[1].startswith(
        f"{source} row 3: no topic")
    assert reasons[2].startswith(f"{source} row 4: topic '/other' (json) is not recorded in solo's TransactionLog")
    assert reasons[3].startswith(f"{source} row 5: body is not valid JSON")
    assert part.bad == reasons


def test_a_file_whose_row_count_changed_since_the_plan_stops_its_task_naming_it(tmp_path):
    # rows are numbered from the plan's counts: a file that grew would take the next file's numbers
    cfg = config.load(str(write_config(tmp_path, "solo", "localhost:9")))
    source = tmp_path / "in.parquet"
    pq.write_table(pa.table({"id": list(range(7))}), source)
    (tmp_path / "inbox").mkdir()
    (tmp_path / "rejected").mkdir()
    options = backfill.Options("loader", "parquet", topic="/orders")
    for planned in (5, 9):
        with pytest.raises(backfill.BackfillInputError, match=f"{source}: its row count is not the {planned} the "
                           "plan counted; the file changed during the backfill"):
            write_file_parts(cfg, NumberedFile(str(source), planned, 1), options,
                             (str(tmp_path), str(tmp_path / "inbox")), str(tmp_path / "rejected"), 0)
    (part,) = write_file_parts(cfg, NumberedFile(str(source), 7, 1), options,
                               (str(tmp_path), str(tmp_path / "inbox")), str(tmp_path / "rejected"), 0)
    assert (part.rows, part.last_good_seq) == (7, 7)


def test_files_share_a_task_up_to_its_rows_unless_that_leaves_a_core_idle_and_keep_their_order():
    def works(*rows: int) -> list:
        out, seq = [], 1
        for n, count in enumerate(rows):
            out.append(NumberedFile(f"f{n}", count, seq))
            seq += count
        return out

    def names(groups: list) -> list[list[str]]:
        return [[w.path for w in group] for group in groups]

    assert names(files_per_task(works(*[1000] * 6), cores=2)) == [["f0", "f1", "f2"], ["f3", "f4", "f5"]]
    small = backfill.tasks.TASK_ROWS // 4
    assert names(files_per_task(works(*[small] * 8), cores=1)) == [
        ["f0", "f1", "f2", "f3"], ["f4", "f5", "f6", "f7"]], "no task beyond TASK_ROWS"
    assert names(files_per_task(works(10, 3 * backfill.tasks.TASK_ROWS, 10, 10), cores=2)) == [
        ["f0"], ["f1"], ["f2", "f3"]], "a large file is a task of its own"


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_progress_bar_cut_short_by_an_error_ends_its_line_and_a_finished_one_shows_its_last_state():
    from replication.commands.progress import ProgressBar

    screen = _Terminal()
    with pytest.raises(RuntimeError), ProgressBar("backfill x", "rows", stream=screen) as bar:
        bar.update(12_000, 30_000)
        raise RuntimeError("a task failed")
    assert "12,000/30,000 rows" in screen.getvalue() and screen.getvalue().endswith("\x1b[K\n")
    assert screen.getvalue().count("\n") == 1, "the bar's line ends; no final line is added before the error"
    untouched = _Terminal()
    with pytest.raises(RuntimeError), ProgressBar("bootstrap x", stream=untouched):
        raise RuntimeError("no instance there")
    assert untouched.getvalue() == "", "an error before any progress: the error alone"
    done = _Terminal()
    with ProgressBar("backfill x", "rows", stream=done) as bar:
        bar.update(30_000, 30_000)
    last = done.getvalue().split("\r")[-1]
    assert last.startswith(f"backfill x [{'#' * 30}] 30,000/30,000 rows") and last.endswith("\n"), last


def test_options_that_could_store_nothing_are_refused_before_any_work(tmp_path):
    cfg = config.load(str(write_config(tmp_path, "solo", "localhost:9", txlog_topics=(
        "<Topic><Name>/orders</Name><MessageType>json</MessageType></Topic>"
        "<Topic><Name>/fix</Name><MessageType>fix</MessageType></Topic>"))))
    refused = {
        "--client is empty": backfill.Options(" ", "csv", topic="/orders"),
        "--topic is empty": backfill.Options("c", "csv", topic=""),
        "topic '/other' (json) is not recorded in solo's TransactionLog: every row would be rejected":
            backfill.Options("c", "csv", topic="/other"),
        "--type fix needs --data-column": backfill.Options("c", "csv", topic="/fix", message_type="fix"),
    }
    for message, options in refused.items():
        with pytest.raises(backfill.BackfillInputError, match=re.escape(message)):
            backfill.check(cfg, options)
    backfill.check(cfg, backfill.Options("c", "csv", topic="/fix", data_column="body", message_type="fix"))
    backfill.check(cfg, backfill.Options("c", "csv", topic_column="t"))  # (each row's topic is checked per row)


def test_a_client_backfills_the_same_input_again_or_extends_it_but_never_other_files_in_its_place(spark, tmp_path):
    cfg = config.load(str(write_config(tmp_path, "solo", "localhost:9")))
    first, second = tmp_path / "day1.csv", tmp_path / "day2.csv"
    first.write_text("id\n1\n2\n3\n")
    second.write_text("id\n10\n20\n30\n40\n50\n")
    options = backfill.Options("history", "csv", topic="/orders")
    assert backfill.run(spark, cfg, [str(first)], options).parts == 1
    with pytest.raises(backfill.BackfillInputError, match=re.escape(
            "client history has backfilled other input into solo: its file 1 was day1.csv (3 rows), this run's is "
            "day2.csv (5 rows)")):
        backfill.run(spark, cfg, [str(second)], options)
    again = backfill.run(spark, cfg, [str(first)], options)
    assert (again.parts, again.last_seq, again.last_stored_seq, again.rejected_earlier) == (0, 3, 3, 0)
    extended = backfill.run(spark, cfg, [str(first), str(second)], options)
    assert (extended.parts, extended.stored, extended.last_seq) == (1, 5, 8)
    # --wait on the instance, which is not running: said at once, and the reason of the timeout
    bar_and_notes = io.StringIO()
    with pytest.raises(ReplicationError, match=re.escape(
            "solo has stored client history through 0 of 8 after 0s: it is not running (no fresh heartbeat in "
            "its storage); it stores the rest when it starts")):
        backfill_command._wait_stored(cfg, "history", extended.last_stored_seq, 0.2, stream=bar_and_notes)
    assert f"solo is not running (no fresh heartbeat in {StorageLayout.of(cfg.storage).heartbeat_json})" in \
        bar_and_notes.getvalue()
    assert "0/8 messages  0 messages/s  -:--:-- left" in bar_and_notes.getvalue(), "no rate: no time left to say"
    rows = handed_over(tmp_path / "solo", ["publisher_seq", "data"])
    assert rows.to_pylist() == [{"publisher_seq": s, "data": json.dumps({"id": v}, separators=(",", ":")).encode()}
                                for s, v in enumerate([1, 2, 3, 10, 20, 30, 40, 50], start=1)]
    assert not (tmp_path / "solo" / "_backfill").exists(), "the tasks' scratch is gone once a run ends"


def test_a_part_of_rejected_rows_only_is_done_once_and_json_lines_may_differ_in_fields(spark, tmp_path):
    cfg = config.load(str(write_config(tmp_path, "solo", "localhost:9")))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{bad json\n\n["not", "an object"]\n{"topic": ""}\n')  # (a blank line: not a row)
    options = backfill.Options("lines", "jsonl", topic_column="topic")
    first = backfill.run(spark, cfg, [str(bad)], options)
    assert (first.parts, first.stored, first.rejected) == (1, 0, 3)
    assert first.bad[0].startswith(f"{bad} line 1: body is not valid JSON (")  # (not "no topic": it has none)
    assert first.bad[1:] == [f"{bad} line {n}: no topic (column 'topic' is empty)" for n in (3, 4)]
    rejected_dir = tmp_path / "solo" / "rejected"
    files_before = sorted(rejected_dir.glob("*.parquet"))
    again = backfill.run(spark, cfg, [str(bad)], options)
    assert (again.parts, again.rejected, again.rejected_earlier, again.last_stored_seq) == (0, 0, 3, 0)
    assert again.bad == first.bad, "an earlier run's rejects are said again"
    assert sorted(rejected_dir.glob("*.parquet")) == files_before, "a re-run leaves no uncommitted copy behind"
    assert len(DeltaTable(str(rejected_dir)).to_pyarrow_table()) == 3

    # more lines than a read batch, the last with other fields than the rest (and no topic column before it)
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text("".join(f'{{"a": {n}}}\n' for n in range(files.BATCH_ROWS)) + '{"b": "x", "topic": "/t"}\n')
    result = backfill.run(spark, cfg, [str(mixed)], backfill.Options("mixed", "jsonl", topic_column="topic"))
    assert (result.stored, result.rejected) == (1, files.BATCH_ROWS)
    stored = handed_over(tmp_path / "solo", ["publisher", "publisher_seq", "topic", "data"])
    assert [r for r in stored.to_pylist() if r["publisher"] == "mixed"] == [
        {"publisher": "mixed", "publisher_seq": files.BATCH_ROWS + 1, "topic": "/t",
         "data": b'{"b": "x", "topic": "/t"}'}]


def test_a_delta_table_is_read_as_its_rows_and_a_body_column_must_hold_bodies(spark, tmp_path):
    from deltalake import write_deltalake

    cfg = config.load(str(write_config(tmp_path, "solo", "localhost:9")))
    table = tmp_path / "orders-delta"
    write_deltalake(str(table), pa.table({"id": [1, 2], "day": ["2024-01-01", "2024-01-02"]}), partition_by=["day"])
    write_deltalake(str(table), pa.table({"id": [3], "day": ["2024-01-02"], "desk": ["fx"]}), mode="append",
                    partition_by=["day"], schema_mode="merge")
    result = backfill.run(spark, cfg, [str(table)], backfill.Options("delta", "delta", topic="/orders"))
    assert (result.stored, result.rejected) == (3, 0)
    inbox = handed_over(tmp_path / "solo", ["publisher", "data"])
    bodies = sorted((json.loads(d) for p, d in zip(inbox["publisher"].to_pylist(), inbox["data"].to_pylist())
                     if p == "delta"), key=lambda body: body["id"])
    assert bodies == [{"id": 1, "day": "2024-01-01", "desk": None}, {"id": 2, "day": "2024-01-02", "desk": None},
                      {"id": 3, "day": "2024-01-02", "desk": "fx"}], \
        "each row with its partition value, and null for a column added after its file was written"
    # files of one name in two partitions (as a converted Parquet directory has): each keeps its own value
    twins = tmp_path / "twins-delta"
    twins_table = DeltaTable.create(str(twins), pa.schema([("id", pa.int64()), ("day", pa.string())]),
                                    partition_by=["day"])
    adds = []
    for n, day in enumerate(("2024-01-01", "2024-01-02")):
        (twins / f"day={day}").mkdir()
        pq.write_table(pa.table({"id": [n]}), twins / f"day={day}" / "part-00000.parquet")
        adds.append(AddAction(f"day={day}/part-00000.parquet", (twins / f"day={day}" / "part-00000.parquet").stat()
                              .st_size, {"day": day}, 0, True, json.dumps({"numRecords": 1})))
    twins_table.create_write_transaction(adds, mode="append", schema=twins_table.schema().to_arrow())
    twins_result = backfill.run(spark, cfg, [str(twins)], backfill.Options("twins", "delta", topic="/orders"))
    assert twins_result.stored == 2
    inbox = handed_over(tmp_path / "solo", ["publisher", "data"])
    assert sorted(d for p, d in zip(inbox["publisher"].to_pylist(), inbox["data"].to_pylist()) if p == "twins") == [
        b'{"id":0,"day":"2024-01-01"}', b'{"id":1,"day":"2024-01-02"}']
    for config_key, value, why in (("delta.columnMapping.mode", "name", "column mapping (mode name)"),
                                   ("delta.enableDeletionVectors", "true", "deletion vectors enabled")):
        refused = tmp_path / f"refused-{value}"
        write_deltalake(str(refused), pa.table({"id": [1]}), configuration={config_key: value})
        with pytest.raises(backfill.BackfillInputError, match=re.escape(f"{refused}: a Delta table with {why} is "
                                                                        "not supported yet")):
            backfill.run(spark, cfg, [str(refused)], backfill.Options("refused", "delta", topic="/orders"))

    # a struct column of bodies: each value an object (a null one rejected); a list is no body
    source = tmp_path / "nested.parquet"
    pq.write_table(pa.table({"payload": pa.array([{"qty": 5, "side": "buy"}, None]), "legs": [[1], [2]]}), source)
    nested = backfill.run(spark, cfg, [str(source)], backfill.Options("nested", "parquet", topic="/orders",
                                                                     data_column="payload"))
    assert (nested.stored, nested.rejected) == (1, 1) and nested.bad[0].startswith(f"{source} row 2: ")
    inbox = handed_over(tmp_path / "solo", ["publisher", "data"])
    assert [d for p, d in zip(inbox["publisher"].to_pylist(), inbox["data"].to_pylist()) if p == "nested"] == [
        b'{"qty":5,"side":"buy"}']
    empty = tmp_path / "empty.parquet"  # (no rows, and not the column: nothing to read, no error)
    pq.write_table(pa.table({"other": pa.array([], pa.string())}), empty)
    assert backfill.run(spark, cfg, [str(empty)], backfill.Options("empty", "parquet", topic="/orders",
                                                                  data_column="payload")).rows == 0
    for column, message_type in (("legs", "json"), ("payload", "xml")):
        with pytest.raises(backfill.BackfillInputError, match=re.escape(
                f"{source}: column {column!r} is ") + ".* not a column of bodies"):
            backfill.run(spark, cfg, [str(source)], backfill.Options(  # (a topic column: xml is not recorded here)
                "bad-column", "parquet", topic_column="legs", data_column=column, message_type=message_type))


def test_an_instance_killed_while_it_stores_staged_parts_stores_each_row_once_after_a_restart(broker, spark, tmp_path):
    from support.factories import assert_exactly_once, txlog_rows
    from support.processes import InstanceProcess
    name = "bfcrash"
    path = write_config(tmp_path, name, broker.bootstrap)
    cfg = config.load(str(path))
    inputs = tmp_path / "in"
    inputs.mkdir()
    for part in range(5):  # five parts, handed over while the instance is stopped
        pq.write_table(pa.table({"id": list(range(part * 6000, (part + 1) * 6000))}), inputs / f"f{part}.parquet")
    assert backfill.run(spark, cfg, [str(inputs)], backfill.Options("loader", "parquet", topic="/orders")).parts == 5
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap)
    for n in range(1, 501):  # publishes of another client (DESIGN §7): in the same first batch as the parts
        producer.send(f"{name}.publish", key=b"live", value=b'{"live": %d}' % n,
                      headers=[("amps-client", b"live"), ("amps-seq", str(n).encode()), ("amps-topic", b"/orders")])
    producer.flush()
    producer.close()
    # killed once the third part has been moved into the txlog and given its seqs, before the commit
    proc = InstanceProcess(path, tmp_path / "run0.log", failpoints="ingest.staged_part_written@3")
    assert proc.wait_killed(timeout=300) == -9, proc.log_text()[-3000:]
    assert "failpoint ingest.staged_part_written reached" in proc.log_text()
    txlog = tmp_path / name / "txlog"
    def committed() -> set[str]:
        return {uri.rsplit("/", 1)[-1] for uri in DeltaTable(str(txlog)).file_uris()}

    moved = {p.name for p in txlog.glob("*.parquet")} - committed()
    assert len(moved) == 3, "three parts moved and written, not committed"
    proc = InstanceProcess(path, tmp_path / "run1.log")
    try:
        with AckListener("kafka-python", broker.bootstrap, acks_topic(name)) as acks:
            for client, count in (("loader", 30_000), ("live", 500)):
                wait_until(lambda c=client, n=count: acks.persisted.get(c) == n, timeout=300,
                           what=f"the persisted ack of {client} from the restarted instance")
    finally:
        assert proc.stop() == 0
    assert_exactly_once(txlog_rows(tmp_path, name), {"loader": 30_000, "live": 500})
    assert moved <= committed(), "the moved parts' files stored as they are, in the replayed batch"
    assert {p.name for p in txlog.glob("*.parquet")} == committed(), "no file left behind in the txlog"
    assert not any(StorageLayout.of(cfg.storage).backfill_staging("loader").iterdir()), "nor in the staging"


def test_a_backfill_updates_the_sow_and_rows_the_sow_refuses_go_to_rejected(fabric, spark, tmp_path, read_path):
    """Run twice: parts in batches the writer reads itself, and in batches collected from Spark's DataFrame."""
    from replication.sow.table import read_current

    fabric.configure("s", sow="<Topic><Name>/orders</Name><MessageType>json</MessageType><Key>/id</Key></Topic>")
    inst = fabric.start("s")
    cfg = config.load(str(fabric.paths["s"]))
    source = tmp_path / "orders.jsonl"
    source.write_text('{"id": 1, "qty": 5}\n{"id": 2, "qty": 7}\n{"id": 1, "qty": 9}\n{"qty": 3}\n')
    plain = tmp_path / "plain.parquet"
    pq.write_table(pa.table({"id": [1, 2]}), plain)
    for client, path, fmt, topic in (("orders", source, "jsonl", "/orders"), ("plain", plain, "parquet", "/other")):
        backfill.run(spark, cfg, [str(path)], backfill.Options(client, fmt, topic=topic))
    wait_until(lambda: stored(fabric, "s", "orders") == 3 and stored(fabric, "s", "plain") == 2, timeout=120,
               what="the backfills stored")
    assert {r["sow_key"]: json.loads(r["data"]) for r in read_current(cfg, "/orders").to_pylist()} == {
        "1": {"id": 1, "qty": 9}, "2": {"id": 2, "qty": 7}}, "a SOW topic's backfilled rows fold into the SOW"
    (refused,) = [r for r in rejected_rows(fabric.root, fabric.name("s")) if r["publisher"] == "orders"]
    assert refused["publisher_seq"] == "4" and "has no value for key /id" in refused["reason"]
    # (the SOW topic's part had its rows classified; the other was stored as it was staged)
    assert inst.writer.staged.stats == {"stored_as_is": 1, "classified": 1}
    assert not any(StorageLayout.of(cfg.storage).backfill_staging("orders").iterdir()), "its staged file removed"


def test_parts_end_at_their_rows_or_bytes_and_a_rerun_starts_after_the_last_row_committed(tmp_path, monkeypatch):
    cfg = config.load(str(write_config(tmp_path, "solo", "localhost:9")))
    source = tmp_path / "wide.parquet"
    pq.write_table(pa.table({"id": list(range(3000)), "blob": ["x" * 1000] * 3000}), source)
    staging = (str(tmp_path / "inbox"), str(tmp_path / "inbox" / "staging"))
    (tmp_path / "inbox" / "staging").mkdir(parents=True)
    (tmp_path / "rejected").mkdir()
    options = backfill.Options("wide", "parquet", topic="/orders")
    monkeypatch.setattr(backfill.tasks, "PART_BYTES", 1_000_000)  # ~1,000 of these rows
    parts = write_file_parts(cfg, NumberedFile(str(source), 3000, 11), options, staging, str(tmp_path / "rejected"), 0)
    sizes = [p.rows for p in parts]  # (a row: ~1,012 bytes as Arrow holds it)
    assert len(parts) == 4 and all(900 < n <= 1000 for n in sizes[:-1]) and sum(sizes) == 3000, sizes
    assert [p.first_seq for p in parts] == [11] + [p.last_seq + 1 for p in parts[:-1]] and parts[-1].last_seq == 3010, \
        "parts of at most PART_BYTES of input, contiguous, the file's rows numbered from its first sequence"
    monkeypatch.setattr(backfill.tasks, "PART_ROWS", 700)
    resumed = write_file_parts(cfg, NumberedFile(str(source), 3000, 11), options, staging,
                               str(tmp_path / "rejected"), 1500)
    assert [(p.first_seq, p.last_seq) for p in resumed] == [(1501, 2200), (2201, 2900), (2901, 3010)], \
        "the rows an earlier run committed are read past; parts of at most PART_ROWS rows"
    first = pq.read_table(tmp_path / "inbox" / StagedPart.from_json(resumed[0].staged).file, columns=["publisher_seq"])
    assert first["publisher_seq"].to_pylist() == list(range(1501, 2201))


def test_a_client_whose_parts_were_numbered_the_earlier_way_resumes_after_its_last_row(tmp_path):
    from deltalake import CommitProperties, Transaction

    from replication.inbox.schema import INBOX_SCHEMA, create_inbox
    from replication.storage.control import write_json_atomic

    cfg = config.load(str(write_config(tmp_path, "solo", "localhost:9")))
    layout = StorageLayout.of(cfg.storage)
    inbox = create_inbox(layout.inbox)

    def commit(app_id: str, version: int) -> None:
        inbox.create_write_transaction([], mode="append", schema=INBOX_SCHEMA, commit_properties=CommitProperties(
            app_transactions=[Transaction(app_id, version)]))
        inbox.update_incremental()

    work = [NumberedFile("a.csv", 250_000, 1), NumberedFile("b.csv", 30_000, 250_001)]
    # an earlier version's parts: 100,000 rows of a file each, numbered 1, 2, 3 (a.csv), 4 (b.csv)
    write_json_atomic(layout.backfill_input("old"), {"client": "old", "files": [["a.csv", 250_000, 1],
                                                                               ["b.csv", 30_000, 4]]})
    commit("backfill:old", 2)
    assert committed_through(inbox, "old", work, layout) == 200_000
    check_and_record_input(cfg, layout, "old", work, 200_000)  # (a run that then fails before a commit)
    assert committed_through(inbox, "old", work, layout) == 200_000, "still its part 2: the version says how to read it"
    commit("backfill-seq:old", 250_000)
    assert committed_through(inbox, "old", work, layout) == 250_000, "once a part is committed the new way, its version"
    layout.backfill_input("old").unlink()
    assert committed_through(inbox, "old", work, layout) == 250_000, "whatever the record says, or that it is gone"
    commit("backfill:older", 3)  # (no record at all: the parts as that run numbered this input)
    assert committed_through(inbox, "older", work, layout) == 250_000
    write_json_atomic(layout.backfill_input("moved"), {"client": "moved", "files": [["a.csv", 250_000, 1],
                                                                                   ["c.csv", 30_000, 4]]})
    with pytest.raises(backfill.BackfillInputError, match="its file 2 was c.csv"):
        check_and_record_input(cfg, layout, "moved", work, 250_001)
    check_and_record_input(cfg, layout, "moved", work, 250_000)  # (nothing of c.csv committed: any file)


def test_one_backfill_of_a_client_at_a_time_and_a_part_the_instance_could_not_find_does_not_stop_the_next(
        spark, tmp_path):
    from datetime import datetime, timezone

    from replication.connectors.delta.tables import IdempotentAppender
    from replication.inbox import staged_parts as sp
    from replication.txlog.schema import REJECTED_SCHEMA

    cfg = config.load(str(write_config(tmp_path, "solo", "localhost:9")))
    layout = StorageLayout.of(cfg.storage)
    source = tmp_path / "in.csv"
    source.write_text("id\n1\n2\n")
    with client_lock(layout, cfg, "busy"):
        with pytest.raises(backfill.BackfillBusyError, match="another backfill by client busy into solo is running"):
            backfill.run(spark, cfg, [str(source)], backfill.Options("busy", "csv", topic="/orders"))
    assert backfill.run(spark, cfg, [str(source)], backfill.Options("busy", "csv", topic="/orders")).stored == 2
    # the instance said a part was gone (a rejected row): the client's next runs read its rejects as before
    part = sp.StagedPart("_backfill/x/1.parquet", "busy", 2, 1, 2, "json", "solo", ("/orders",), {})
    IdempotentAppender(layout.rejected, REJECTED_SCHEMA, app_id="ingest", name="r").append(
        sp._missing_rows([(part, "is gone")], datetime.now(timezone.utc)), 0)
    again = backfill.run(spark, cfg, [str(source)], backfill.Options("busy", "csv", topic="/orders"))
    assert (again.parts, again.rejected_earlier) == (0, 1)
