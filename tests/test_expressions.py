"""AMPS content filters: parser errors, Python semantics, and the Spark compilation agreeing row by row."""

from __future__ import annotations

import json
import pickle
import random

import pytest

from replication import expressions
from replication.errors import ConfigError
from replication.expressions import FilterSyntaxError, evaluate, parse

ORDER = {
    "id": 7,
    "qty": 150,
    "px": 90.5,
    "sym": "IBM",
    "side": "buy",
    "note": "",
    "flag": True,
    "gone": None,
    "text_num": "12",
    "client": {"country": "US", "tier": 2, "desk": {"name": "rates"}},
    "tags": ["a", "b"],
    "trade": "TRADE-X-TRADE",
}

# (filter, message, expected): hand-written expectations from the AMPS expression chapter.
CASES: list[tuple[str, dict, bool]] = [
    # comparisons, numeric
    ("/qty > 100", ORDER, True),
    ("/qty >= 150", ORDER, True),
    ("/qty < 150", ORDER, False),
    ("/qty <= 150", ORDER, True),
    ("/qty = 150", ORDER, True),
    ("/qty == 150.0", ORDER, True),  # 2 = 2.0: numeric comparison
    ("/qty != 150", ORDER, False),
    ("/qty <> 151", ORDER, True),
    ("/px > 90.4 AND /px < 90.6", ORDER, True),
    ("/px = -90.5", ORDER, False),
    ("/qty > -1", ORDER, True),
    # strings
    ("/sym = 'IBM'", ORDER, True),
    ('/sym = "IBM"', ORDER, True),
    ("/sym != 'MSFT'", ORDER, True),
    ("/sym < 'J'", ORDER, True),
    ("/sym > 'IBMA'", ORDER, False),
    # number vs string: the string is converted when it can be
    ("/text_num = 12", ORDER, True),
    ("/text_num > 9", ORDER, True),  # numeric, not string, comparison
    ("/text_num = '12.0'", ORDER, False),  # two strings: '12' <> '12.0'
    ("/qty = '150'", ORDER, True),
    ("/qty = '150.00'", ORDER, True),  # number vs numeric string: numeric
    # a string that is not a number is greater than any number
    ("/sym > 5", ORDER, True),
    ("/sym < 5", ORDER, False),
    ("/sym = 5", ORDER, False),
    ("/sym != 5", ORDER, True),
    ("/qty < 'Crank It Up'", ORDER, True),
    # nested paths
    ("/client/country = 'US'", ORDER, True),
    ("/client/tier BETWEEN 1 AND 2", ORDER, True),
    ("/client/desk/name = 'rates'", ORDER, True),
    ("/client/missing/name = 'rates'", ORDER, False),
    # NULL: missing, JSON null and '' are NULL; comparisons with NULL are false
    ("/missing = 1", ORDER, False),
    ("/missing != 1", ORDER, False),
    ("NOT (/missing = 1)", ORDER, False),  # NOT NULL is NULL
    ("/missing IS NULL", ORDER, True),
    ("/gone IS NULL", ORDER, True),
    ("/note IS NULL", ORDER, True),  # '' IS NULL
    ("/note = ''", ORDER, False),  # '' = '' is false
    ("/qty IS NOT NULL", ORDER, True),
    ("/client IS NOT NULL", ORDER, True),
    ("/client = 1", ORDER, False),  # objects compare as NULL
    ("/missing = 1 OR /qty = 150", ORDER, True),  # NULL OR TRUE
    ("/missing = 1 AND /qty = 150", ORDER, False),  # NULL AND TRUE
    # IN / NOT IN
    ("/sym IN ('IBM', 'MSFT')", ORDER, True),
    ("/sym in ('ORCL', 'MSFT')", ORDER, False),
    ("/sym NOT IN ('ORCL', 'MSFT')", ORDER, True),
    ("/qty IN (1, 150, 'x')", ORDER, True),
    ("/missing NOT IN (1, 2)", ORDER, False),
    # BETWEEN (inclusive)
    ("/qty BETWEEN 150 AND 200", ORDER, True),
    ("/qty BETWEEN 151 AND 200", ORDER, False),
    ("/qty NOT BETWEEN 151 AND 200", ORDER, True),
    ("/px BETWEEN 90.0 AND 90.5", ORDER, True),
    # LIKE: regex search, unanchored, as AMPS
    ("/sym LIKE '^IB.?$'", ORDER, True),
    ("/sym LIKE 'B'", ORDER, True),
    ("/trade LIKE 'TRADE$'", ORDER, True),
    ("/sym LIKE '(?i)^ibm$'", ORDER, True),
    ("/sym NOT LIKE '^MS'", ORDER, True),
    ('/px LIKE "^90\\..*"', ORDER, True),
    ("/qty LIKE '^15'", ORDER, True),
    ("/missing LIKE '.*'", ORDER, False),
    # booleans compare as 'true' / 'false'
    ("/flag = 'true'", ORDER, True),
    ("/flag = TRUE", ORDER, True),
    # logic, precedence, case-insensitive keywords
    ("/qty > 100 and /side = 'buy' or /sym = 'X'", ORDER, True),
    ("/sym = 'X' OR /qty > 100 AND /side = 'sell'", ORDER, False),  # AND binds tighter
    ("(/sym = 'X' OR /qty > 100) AND /side = 'buy'", ORDER, True),
    ("not /side = 'sell'", ORDER, True),
    ("NOT NOT /side = 'buy'", ORDER, True),
    ("/qty > 100 AND NOT (/sym IN ('MSFT') OR /px < 10)", ORDER, True),
    # a message that is not JSON: every field is NULL
    ("/qty > 1", "not json at all", False),
    ("/qty IS NULL", "not json at all", True),
]


def _message_bytes(message) -> bytes:
    return message.encode() if isinstance(message, str) else json.dumps(message).encode()


@pytest.mark.parametrize("text,message,expected", CASES, ids=[c[0] for c in CASES])
def test_python_evaluator(text, message, expected):
    assert evaluate(parse(text), message) is expected


def test_python_evaluator_takes_dict_text_or_bytes():
    f = parse("/client/country = 'US'")
    assert evaluate(f, ORDER) and evaluate(f, json.dumps(ORDER)) and evaluate(f, _message_bytes(ORDER))


def test_spark_agrees_with_python_on_every_case(spark):
    from pyspark.sql import functions as F

    rows = [(i, _message_bytes(m)) for i, (_t, m, _e) in enumerate(CASES)]
    df = spark.createDataFrame(rows, "i int, data binary").cache()
    got: dict[int, bool] = {}
    for start in range(0, len(CASES), 12):  # small plans compile fast
        chunk = list(enumerate(CASES))[start : start + 12]
        cols = [expressions.to_spark_column(parse(t)).alias(f"c{i}") for i, (t, _m, _e) in chunk]
        for r in df.where(F.col("i").between(start, start + len(chunk) - 1)).select("i", *cols).collect():
            got[r["i"]] = r[f"c{r['i']}"]
    mismatches = [(t, expected, got[i]) for i, (t, _m, expected) in enumerate(CASES) if got[i] is not expected]
    assert mismatches == []


def test_spark_filter_selects_rows_and_takes_a_string_column(spark):
    msgs = [{"qty": q, "sym": s} for q, s in [(50, "IBM"), (150, "IBM"), (500, "MSFT"), (None, "IBM")]] + ["{bad"]
    df = spark.createDataFrame([(json.dumps(m) if isinstance(m, dict) else m,) for m in msgs], "body string")
    f = parse("/qty > 100 AND /sym IN ('IBM', 'MSFT')")
    col = expressions.to_spark_column(f, "body")
    picked = [json.loads(r.body) for r in df.where(col).collect()]
    assert picked == [{"qty": 150, "sym": "IBM"}, {"qty": 500, "sym": "MSFT"}]
    # the same as the Python evaluator
    assert picked == [m for m in msgs if evaluate(f, m)]


QUOTE = b"8=FIX.4.2\x0135=S\x0155=IBM\x01132=150.5\x01133=\x0158=hello world\x0155=MSFT\x01"
NV = b"Symbol=IBM\x01Qty=200\x01Note=\x01Side=buy\x01"
TAG_CASES = [
    # (filter, message type, body, expected): fields are strings; numeric ones compare as numbers
    ("/55 = 'IBM'", "fix", QUOTE, True),
    ("/55 = 'MSFT'", "fix", QUOTE, False),  # a repeated tag: its first occurrence counts
    ("/132 > 100", "fix", QUOTE, True),
    ("/132 BETWEEN 150 AND 151", "fix", QUOTE, True),
    ("/132 = '150.50'", "fix", QUOTE, False),  # two strings compare as strings
    ("/133 IS NULL", "fix", QUOTE, True),  # an empty value is NULL
    ("/999 IS NULL", "fix", QUOTE, True),
    ("/999 > 1", "fix", QUOTE, False),
    ("/58 LIKE 'o w'", "fix", QUOTE, True),
    ("/55 IN ('MSFT', 'IBM') AND NOT /35 = 'D'", "fix", QUOTE, True),
    ("/55/x = 'IBM'", "fix", QUOTE, False),  # fix fields are flat
    ("/Symbol = 'IBM' AND /Qty >= 200", "nvfix", NV, True),
    ("/Note IS NULL OR /Side = 'sell'", "nvfix", NV, True),
    ("/Qty < 'abc'", "nvfix", NV, True),  # a string that is not a number is greater than any number
    ("/Symbol = 'IBM'", "xml", NV, False),  # bodies without fields never match
]


@pytest.mark.parametrize("text,message_type,body,expected", TAG_CASES, ids=[c[0] + " " + c[1] for c in TAG_CASES])
def test_fix_and_nvfix_fields_in_python(text, message_type, body, expected):
    assert evaluate(parse(text), body, message_type) is expected


def test_spark_agrees_with_python_on_fix_and_nvfix_fields_and_on_a_column_of_types(spark):
    rows = [(i, mt, body) for i, (_t, mt, body, _e) in enumerate(TAG_CASES)]
    df = spark.createDataFrame(rows, "i int, mt string, data binary")
    cols = [expressions.to_spark_column(parse(t), message_type=mt).alias(f"c{i}")
            for i, (t, mt, _b, _e) in enumerate(TAG_CASES)]
    typed = [expressions.to_spark_column(parse(t), message_type=df["mt"]).alias(f"t{i}")
             for i, (t, _mt, _b, _e) in enumerate(TAG_CASES)]
    got = {r["i"]: r for r in df.select("i", *cols, *typed).collect()}
    for i, (text, _mt, _b, expected) in enumerate(TAG_CASES):
        assert got[i][f"c{i}"] is expected, text
        assert got[i][f"t{i}"] is expected, f"{text} (message type from a column)"


def test_the_compiled_python_form_agrees_with_the_evaluator_on_every_case():
    """compile_python (orjson, closures) gives evaluate's answer, for JSON and tag=value bodies alike."""
    from replication.expressions import compile_python

    for text, message, expected in CASES:
        for form in (message, _message_bytes(message)) if isinstance(message, dict) else (message,):
            assert compile_python(parse(text))(form) is expected, (text, form)
    for text, message_type, body, expected in TAG_CASES:
        assert compile_python(parse(text), message_type)(body) is expected, (text, message_type)
    rng = random.Random(4)
    filters = [parse(t) for t, _m, _e in CASES if "LIKE" not in t.upper()]
    for _ in range(300):
        doc = {k: rng.choice([None, "", "7", "abc", 7, 7.5, -1, True, False, {"x": 1}, [1], "1e3"])
               for k in ("qty", "sym", "px", "side", "flag", "missing")}
        body = json.dumps(doc).encode()
        for f in filters:
            assert compile_python(f)(body) is evaluate(f, body), (str(f), doc)


def test_spark_plan_has_no_python_udf(spark):
    df = spark.createDataFrame([(b'{"a": 1}',)], "data binary")
    plan = df.where(expressions.to_spark_column(parse("/a = 1 OR /b LIKE 'x'")))._jdf.queryExecution().toString()
    assert "PythonUDF" not in plan and "BatchEvalPython" not in plan and "ArrowEvalPython" not in plan


def test_numbers_print_as_spark_prints_them_for_like(spark):
    from pyspark.sql import functions as F

    bodies = ['{"n": 90.50}', '{"n": 1e3}', '{"n": 7}', '{"n": 0.00001}', '{"n": 1.5E-7}', '{"n": 100.0}']
    patterns = ["^90\\.5$", "^1000\\.0$", "^7$", "^0\\.00001$", "^1\\.5E-7$", "^100$"]
    df = spark.createDataFrame([(b,) for b in bodies], "data string")
    for body, pattern in zip(bodies, patterns):
        f = parse(f"/n LIKE '{pattern}'")
        assert evaluate(f, body), (body, pattern)
        assert df.where(F.col("data") == body).where(expressions.to_spark_column(f)).count() == 1, (body, pattern)


@pytest.mark.parametrize(
    "text,position,words",
    [
        ("/qty >", 7, "expected a value after '>'"),
        ("/qty > 100 AND", 15, "expected a condition"),
        ("qty > 100", 1, "fields start with '/'"),
        ("/sym = 'IBM", 8, "close the string"),
        ("(/qty > 1", 10, "expected ')'"),
        ("/sym LIKE '['", 11, "not a valid regular expression"),
        ("/sym LIKE /x", 11, "quoted regular expression"),
        ("/a IN 1, 2", 7, "expected '(' after IN"),
        ("/a BETWEEN 1 2", 14, "expected AND"),
        ("/a IS 5", 7, "expected NULL"),
        ("/a = 1 /b = 2", 8, "expected AND, OR"),
        ("", 1, "empty"),
    ],
)
def test_syntax_errors_show_the_position(text, position, words):
    with pytest.raises(FilterSyntaxError) as err:
        parse(text)
    message = str(err.value)
    assert f"at position {position}:" in message and words in message
    lines = message.splitlines()
    # the filter, then a caret under the fault
    assert lines[-1].index("^") - lines[-2].index(text[:1] or " ") == position - 1 if text else True
    assert isinstance(err.value, ConfigError) and err.value.position == position - 1


def test_syntax_error_pickles_for_spark_workers():
    with pytest.raises(FilterSyntaxError) as err:
        parse("/a >")
    clone = pickle.loads(pickle.dumps(err.value))
    assert type(clone) is FilterSyntaxError and str(clone) == str(err.value) and clone.position == 4


def test_canonical_form_ignores_spacing_case_and_redundant_parentheses():
    a = expressions.canonical("/qty>100 and ( /sym in ('IBM','MSFT') )")
    b = expressions.canonical("(/qty > 100) AND /sym IN ('IBM', 'MSFT')")
    assert a == b == "(/qty > 100 AND /sym IN ('IBM', 'MSFT'))"
    assert parse(a) == parse(b)


def test_fields_lists_every_path_read():
    f = parse("/a/b = 1 AND (/c IS NULL OR /d LIKE 'x') AND /e BETWEEN /f AND 3")
    assert {str(x) for x in expressions.fields(f)} == {"/a/b", "/c", "/d", "/e", "/f"}


# --------------------------------------------------------------------------- column-wise evaluation


def _column_answers(text: str, bodies: list[bytes | None], valid_json: bool = False):
    """(column-wise answer or None, matching's answer, the per-record answers)."""
    import pyarrow as pa

    from replication.expressions.columnar import column_wise, matching

    flt = expressions.Filter(text)
    array = pa.array(bodies, pa.binary())
    return (column_wise(flt, array, valid_json=valid_json), matching(flt, array, valid_json=valid_json).tolist(),
            [flt.matches(b) for b in bodies])


def test_column_wise_agrees_with_the_per_record_path_on_every_case():
    """Every hand-written case, as one column per case: the column-wise answer (or its fallback) is the case's."""
    for text, message, expected in CASES:
        bodies = [_message_bytes(message)] * 3
        for valid_json in (False, True) if isinstance(message, dict) else (False,):
            _, mask, per_record = _column_answers(text, bodies, valid_json)
            assert mask == per_record == [expected] * 3, text


def test_column_wise_answers_typed_columns_without_the_per_record_path():
    """Bodies whose fields keep one type each are answered column-wise, and the answers are the per-record ones:
    numbers vs numeric strings vs other strings, NULLs, booleans, nested paths, IN, BETWEEN, NOT, LIKE on text."""
    rng = random.Random(11)
    words = ["7", "12", "abc", "", " 8 ", "1e3", ".5", "-3", "IBM", "\u0663", "9\u2003", "x\u00e9"]
    bodies = []
    for _ in range(400):
        doc = {"qty": rng.choice([None, 0, 7, 7.5, -1, 12, 1000, 1e3]), "sym": rng.choice(words + [None]),
               "flag": rng.choice([True, False, None]),
               "client": rng.choice([None, {"tier": rng.choice([1, 2, None]), "name": rng.choice(words)}, {}])}
        bodies.append(json.dumps({k: v for k, v in doc.items() if v is not None or rng.random() < 0.5}).encode())
    bodies += [None, b""]
    filters = [
        "/qty > 7", "/qty = '7'", "/sym > 5", "/sym < 100", "/sym = 7", "/sym != 'abc'", "/sym <= 'IBM'",
        "/sym IS NULL", "/qty IS NOT NULL", "/flag = 'true'", "/flag = TRUE", "/flag > 1",
        "/client/tier BETWEEN 1 AND 2", "/client/name IN ('IBM', 7, '12')", "NOT (/qty < 7 OR /sym = 'IBM')",
        "/qty NOT BETWEEN 0 AND 10 AND /client/tier IS NULL", "/sym LIKE '^[0-9]'", "/sym NOT LIKE 'B'",
        "/qty > /client/tier", "/sym > /qty", "1 = 1", "/missing = 1", "/missing IS NULL",
    ]
    for text in filters:
        for valid_json in (False, True):  # bodies wrapped one per row, or read where they lie
            column, mask, per_record = _column_answers(text, bodies, valid_json)
            assert column is not None, f"{text}: took the per-record path"
            assert column.tolist() == mask == per_record, text
        assert any(per_record) or text == "/missing = 1", f"{text} matched nothing: not a useful case"


def test_column_wise_falls_back_where_the_per_record_path_is_needed():
    """A field of two types, an object where a value is read, two objects in one body, not JSON, LIKE on a
    number, NaN, a repeated field: the per-record answer, for the whole set."""
    cases = [
        ("/qty > 5", [b'{"qty": 7}', b'{"qty": "9"}', b'{"qty": "x"}']),
        ("/client = 1", [b'{"client": {"a": 1}}', b'{"client": 1}']),
        ("/qty > 5", [b'{"qty": 7} {"qty": 1}', b' ', b'{"qty": 9}']),
        ("/qty > 5", [b'{"qty": 7}', b'not json', b'{"qty": 9}']),
        ("/qty > 5", [b'{"qty": 7}', b'[1, 2]']),
        ("/qty LIKE '^1'", [b'{"qty": 10}', b'{"qty": 20}']),
        ("/qty > 5", [b'{"qty": 7}', b'{"qty": NaN}']),
        ("/a/b = 1 AND /a = 2", [b'{"a": {"b": 1}}']),
        ("/qty > 5", [b'{"qty": 7, "qty": 1}']),
    ]
    for text, bodies in cases:
        column, mask, per_record = _column_answers(text, bodies)
        assert column is None, f"{text} on {bodies}: answered column-wise"
        assert mask == per_record, text


def test_column_wise_reads_bodies_over_several_lines():
    for valid_json in (False, True):
        column, mask, per_record = _column_answers("/qty > 5", [b'{\n  "qty": 7\n}', b'{"qty": 3}', b' null ', b'',
                                                                b' {"qty": 8}\n'], valid_json)
        assert column is not None and column.tolist() == mask == per_record == [True, False, False, False, True]


def test_column_wise_over_many_chunks_answers_each_piece_and_falls_back_for_all():
    """A SOW read gives one chunk per file: chunks are parsed where they lie (tiny ones joined), side by side,
    each with its own field types; a piece that needs the per-record path sends the whole set there."""
    import pyarrow as pa

    from replication.expressions.columnar import MIN_PIECE, column_wise, matching

    def chunk(n: int, start: int, as_text: bool) -> pa.Array:
        return pa.array([json.dumps({"qty": str(i % 13) if as_text else i % 13}).encode()
                         for i in range(start, start + n)], pa.binary())

    # qty a number in some files, text in others (tiny chunks are joined with the next: the same type there)
    files = [(MIN_PIECE + 5, True), (7, False), (3, False), (MIN_PIECE, False), (2 * MIN_PIECE + 1, True), (11, False)]
    chunks, start = [], 0
    for size, as_text in files:
        chunks.append(chunk(size, start, as_text))
        start += size
    bodies = pa.chunked_array(chunks)
    flt = expressions.Filter("/qty = 7")
    per_record = [flt.matches(b) for b in bodies.to_pylist()]
    column = column_wise(flt, bodies, valid_json=True)
    assert column is not None and column.tolist() == per_record and sum(per_record) > 10

    broken = pa.chunked_array(chunks + [pa.array([b'{"qty": 7}', b"not json"], pa.binary())])
    assert column_wise(flt, broken, valid_json=False) is None
    assert matching(flt, broken).tolist() == per_record + [True, False]
