"""SOW test workloads and the reference a test computes in plain Python from what was published.

Each publisher owns its keys (and its filters only match its own records), so
the final SOW and every stored body follow from each publisher's own sequence,
whatever order the instance interleaves publishers in. The reference merges
and deletes with its own code, written from the spec, not the engine's.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Op:
    """One message as a publisher sends it."""

    command: str  # publish, delta_publish, sow_delete
    topic: str
    body: bytes | None = None
    keys: tuple[str, ...] | None = None  # sow_delete by keys
    filter: str | None = None  # sow_delete by filter
    message_type: str = "json"


@dataclass
class Reference:
    """Records by (topic, key), and per published op what the txlog must hold for it."""

    records: dict[tuple[str, str], Any] = field(default_factory=dict)
    stored: list[tuple[Any, frozenset[str] | None]] = field(default_factory=list)
    """Per op in publish order: (the stored body parsed, the keys a sow_delete removed or None)."""


def json_merge(current: dict, delta: dict) -> dict:
    out = dict(current)
    for name, value in delta.items():
        if isinstance(out.get(name), dict) and isinstance(value, dict):
            out[name] = json_merge(out[name], value)
        else:
            out[name] = value
    return out


def fix_fields(body: bytes) -> list[tuple[str, str]]:
    return [tuple(f.split("=", 1)) for f in body.decode().split("\x01") if f]  # type: ignore[misc]


def fix_merge(current: list, delta: list) -> list:
    out = list(current)
    for tag, value in delta:
        at = next((i for i, (t, _) in enumerate(out) if t == tag), None)
        if at is None:
            out.append((tag, value))
        else:
            out[at] = (tag, value)
    return out


def parsed(op: Op, body: bytes | None) -> Any:
    if body is None:
        return None
    return fix_fields(body) if op.message_type == "fix" else json.loads(body)


def fold(ops: list[Op], matches, key_of) -> Reference:
    """The SOW after ``ops`` (one publisher's, in order). ``matches(filter, topic, doc)`` and
    ``key_of(topic, doc)`` say what the test's filters select and what each record's key is."""
    ref = Reference()
    for op in ops:
        doc = parsed(op, op.body)
        if op.command == "sow_delete":
            if op.keys is not None:
                removed = {k for k in op.keys if (op.topic, k) in ref.records}
            elif op.filter is not None:
                removed = {k for (t, k), d in ref.records.items() if t == op.topic and matches(op.filter, t, d)}
            else:
                removed = {key_of(op.topic, doc)} & {k for (t, k) in ref.records if t == op.topic}
            for k in removed:
                del ref.records[(op.topic, k)]
            ref.stored.append((doc, frozenset(removed)))
            continue
        key = key_of(op.topic, doc)
        current = ref.records.get((op.topic, key))
        if op.command == "delta_publish" and current is not None:
            doc = fix_merge(current, doc) if op.message_type == "fix" else json_merge(current, doc)
        ref.records[(op.topic, key)] = doc
        ref.stored.append((doc, None))
    return ref


# ---------------------------------------------------------------------------- the workloads


def order_ops(owner: str, keys: list[int], count: int, rng: random.Random) -> list[Op]:
    """JSON orders on /orders keyed by /id: 70% publish, 25% delta_publish (nested objects, arrays, new
    fields), 5% sow_delete (by keys, by data and, now and then, by a filter on the owner's group)."""
    ops = []
    for n in range(count):
        roll = rng.random()
        k = rng.choice(keys)
        if roll < 0.70:
            body = {"id": k, "owner": owner, "group": k % 7, "qty": rng.randint(1, 999),
                    "side": rng.choice(["buy", "sell"]), "tags": [rng.choice("abc") for _ in range(rng.randint(0, 3))],
                    "addr": {"city": rng.choice(["Oslo", "Lima"]), "geo": {"lat": rng.randint(-90, 90), "lon": 1}}}
            ops.append(Op("publish", "/orders", json.dumps(body).encode()))
        elif roll < 0.95:
            delta: dict[str, Any] = {"id": k}
            choice = rng.randrange(4)
            if choice == 0:
                delta["qty"] = rng.randint(1, 999)
            elif choice == 1:
                delta["tags"] = [f"t{n}"]
            elif choice == 2:
                delta["addr"] = {"geo": {"lat": rng.randint(-90, 90)}, "zip": str(n)}
            else:
                delta[f"note{n % 5}"] = {"n": n}
            ops.append(Op("delta_publish", "/orders", json.dumps(delta).encode()))
        else:
            form = rng.random()
            if form < 0.45:
                ops.append(Op("sow_delete", "/orders",
                              keys=tuple(str(rng.choice(keys)) for _ in range(rng.randint(1, 3)))))
            elif form < 0.95:
                ops.append(Op("sow_delete", "/orders", json.dumps({"id": k}).encode()))
            else:
                ops.append(Op("sow_delete", "/orders", filter=f"/owner = '{owner}' AND /group = {k % 7}"))
    return ops


def quote_ops(owner: str, symbols: list[str], count: int, rng: random.Random) -> list[Op]:
    """FIX quotes on /quotes keyed by tag 55, the owner in tag 1; deletes by keys, data or a filter on tags."""
    ops = []
    for n in range(count):
        roll = rng.random()
        sym = rng.choice(symbols)
        if roll < 0.70:
            body = f"35=S\x011={owner}\x0155={sym}\x01132={rng.randint(1, 999)}\x01133={rng.randint(1, 999)}\x01"
            ops.append(Op("publish", "/quotes", body.encode(), message_type="fix"))
        elif roll < 0.95:
            tag = rng.choice(["132", "133", "58"])
            ops.append(Op("delta_publish", "/quotes", f"55={sym}\x01{tag}={n}\x01".encode(), message_type="fix"))
        else:
            form = rng.random()
            if form < 0.45:
                ops.append(Op("sow_delete", "/quotes", keys=(rng.choice(symbols),), message_type="fix"))
            elif form < 0.90:
                ops.append(Op("sow_delete", "/quotes", f"55={sym}\x01".encode(), message_type="fix"))
            else:
                ops.append(Op("sow_delete", "/quotes", filter=f"/1 = '{owner}' AND /132 > 900", message_type="fix"))
    return ops


def matches(flt: str, topic: str, doc: Any) -> bool:
    """What the workloads' filters select, written out by hand."""
    if topic == "/orders":
        owner, group = flt.split("'")[1], int(flt.rsplit(" ", 1)[1])
        # a record a delta_publish created (no record before) may lack the fields: then it does not match
        return doc.get("owner") == owner and doc.get("group") == group
    fields = dict(doc)
    return fields.get("1") == flt.split("'")[1] and int(fields.get("132", "0")) > 900


def key_of(topic: str, doc: Any) -> str:
    return str(doc["id"]) if topic == "/orders" else dict(doc)["55"]


def send(pub, op: Op) -> None:
    if op.command == "sow_delete":
        pub.sow_delete(op.topic, keys=list(op.keys) if op.keys is not None else None, filter=op.filter,
                       data=op.body, message_type=op.message_type)
    else:
        pub.publish(op.topic, op.body, command=op.command, message_type=op.message_type)


def txlog_fold(rows: list[dict]) -> dict[tuple[str, str], bytes]:
    """The SOW the txlog's own rows say (seq order): a publish writes its sow_key, a sow_delete removes its keys."""
    from replication.sow.keys import split_keys

    records: dict[tuple[str, str], bytes] = {}
    for row in sorted(rows, key=lambda r: r["seq"]):
        if row["sow_key"] is None:
            continue
        if row["command"] == "sow_delete":
            for key in split_keys(row["sow_key"]):
                records.pop((row["topic"], key), None)
        else:
            records[(row["topic"], row["sow_key"])] = row["data"]
    return records
