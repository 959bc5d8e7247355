"""Authenticated incoming replication (issue 37 part 3): signed inbox commits, and what is refused.

Unit tests of the signature and of the config need no services; the end-to-end test runs a signing
pair on the session's broker and Spark and writes hostile commits into the downstream's inbox by hand.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from support.fabric import publish_orders
from support.factories import (
    destination_xml,
    rejected_rows,
    replication_xml,
    wait_until,
)
from support.inbox import inbox_rows

from replication import config
from replication.commands import status as status_command
from replication.config.link_auth import check_link_keys
from replication.config.parser import parse_string
from replication.errors import ConfigError
from replication.inbox.entitlement import Entitlements
from replication.inbox.schema import INBOX_SCHEMA, create_inbox
from replication.inbox.signing import SIGNATURE_KEY, CommitVerifier, rows_digest, sign
from replication.inbox.versions import read_versions
from replication.messages import BACKFILL_LINK
from replication.validation import validate_link

KEY = b"k" * 32
KEY_VARIABLE = "TEST_LINK_KEY"
KEY_VALUE = "link-key-4f1d7c2a9b8e6d5c3b2a1f0e"


def with_column(rows: pa.Table, name: str, values: list) -> pa.Table:
    index = INBOX_SCHEMA.get_field_index(name)
    return rows.set_column(index, name, pa.array(values, INBOX_SCHEMA.field(name).type)).cast(INBOX_SCHEMA)


def commit(inbox: Path, rows: pa.Table, *, signature: str | None = None, app: str | None = None,
           batch: int | None = None) -> int:
    """Append ``rows`` to the inbox as someone with write access would; the version written."""
    info = {SIGNATURE_KEY: signature} if signature else None
    txns = [Transaction(app, batch)] if app is not None and batch is not None else None
    write_deltalake(str(inbox), rows, mode="append",
                    commit_properties=CommitProperties(custom_metadata=info, app_transactions=txns))
    return DeltaTable(str(inbox)).version()


def signed_commit(inbox: Path, rows: pa.Table, key: bytes, *, app: str, batch: int, upstream: str = "amps-1",
                  to: str = "amps-2") -> int:
    return commit(inbox, rows, signature=sign(key, upstream=upstream, to=to, app_id=app, batch=batch, rows=rows),
                  app=app, batch=batch)


# -- the signature -------------------------------------------------------------


def test_digest_is_of_the_values_not_their_chunking_or_encoding():
    rows = inbox_rows(50)
    rechunked = pa.concat_tables([rows.slice(0, 7), rows.slice(7, 30), rows.slice(37)])
    assert rows_digest(rechunked) == rows_digest(rows)
    assert rows_digest(rows.slice(10, 20)) == rows_digest(inbox_rows(20, first=11))
    changed = rows.set_column(rows.schema.get_field_index("data"), "data",
                              pa.array([b"x"] + rows["data"].to_pylist()[1:], pa.binary()))
    assert rows_digest(changed) != rows_digest(rows)
    # a null and an empty value differ; so does moving a byte from one value to the next
    a = rows.set_column(rows.schema.get_field_index("sow_key"), "sow_key", pa.array([""] + [None] * 49, pa.string()))
    assert rows_digest(a) != rows_digest(rows)
    b1 = inbox_rows(2).set_column(9, "data", pa.array([b"ab", b"c"], pa.binary()))
    b2 = inbox_rows(2).set_column(9, "data", pa.array([b"a", b"bc"], pa.binary()))
    assert rows_digest(b1) != rows_digest(b2)


def test_verifier_refuses_unsigned_forged_tampered_replayed_and_unknown(tmp_path):
    inbox = tmp_path / "inbox"
    create_inbox(inbox)
    verifier = CommitVerifier(str(inbox), {"amps-1": KEY}, "amps-2")

    def verdict(version: int):
        rows = read_versions(str(inbox), version, version).select(INBOX_SCHEMA.names)
        info = DeltaTable(str(inbox)).history(limit=1)[0] if version == DeltaTable(str(inbox)).version() else {}
        return verifier.check(version, rows, info)

    good = signed_commit(inbox, inbox_rows(5), KEY, app="amps-1->b#x", batch=1)
    assert verdict(good) is None
    unsigned = commit(inbox, inbox_rows(3, first=6))
    assert "unsigned" in verdict(unsigned).reason and verdict(unsigned).upstream == "amps-1"
    forged = signed_commit(inbox, inbox_rows(3, first=9), b"w" * 32, app="amps-1->b#x", batch=2)
    assert "forged" in verdict(forged).reason
    signature = sign(KEY, upstream="amps-1", to="amps-2", app_id="amps-1->b#x", batch=3, rows=inbox_rows(3, first=12))
    tampered = commit(inbox, inbox_rows(3, first=12, publisher="evil"), signature=signature, app="amps-1->b#x",
                      batch=3)
    assert "tampered" in verdict(tampered).reason
    again = signed_commit(inbox, inbox_rows(5), KEY, app="amps-1->b#x", batch=1)
    assert "replayed" in verdict(again).reason
    stranger = signed_commit(inbox, inbox_rows(2, link="amps-9"), KEY, app="amps-9->b#y", batch=1,
                             upstream="amps-9")
    refusal = verdict(stranger)
    assert "not admitted" in refusal.reason and refusal.upstream == "amps-9"
    nxt = signed_commit(inbox, inbox_rows(2, first=20), KEY, app="amps-1->b#x", batch=4)
    assert verdict(nxt) is None
    # a valid commit of the same upstream (and key) to another instance, copied here
    elsewhere = signed_commit(inbox, inbox_rows(2, first=30), KEY, app="amps-1->c#z", batch=1, to="amps-3")
    assert "replayed: signed for the inbox of amps-3, not of amps-2" in verdict(elsewhere).reason
    # a verifier started later (a restart) knows what was committed before from the inbox itself
    fresh = CommitVerifier(str(inbox), {"amps-1": KEY}, "amps-2")
    rows = read_versions(str(inbox), again, again).select(INBOX_SCHEMA.names)
    info = {SIGNATURE_KEY: sign(KEY, upstream="amps-1", to="amps-2", app_id="amps-1->b#x", batch=1,
                                rows=inbox_rows(5))}
    assert "replayed" in fresh.check(again, rows, info).reason


# -- the config ----------------------------------------------------------------

_CONFIG = """<AMPSConfig><Name>amps-2</Name><Storage>{root}/amps-2</Storage>
<Transports>
  <Transport><Name>in</Name><Type>amps-replication</Type>
    {inbox}
  </Transport>
</Transports>
<TransactionLog><Topic><Name>.*</Name><MessageType>json</MessageType></Topic></TransactionLog>
<Replication><Destination><Name>amps-3</Name><SyncType>async</SyncType>
  <Topic><Name>.*</Name><MessageType>json</MessageType></Topic>
  <Transport><Type>amps-replication</Type><InetAddr>{root}/amps-3</InetAddr>
    {authenticator}
  </Transport></Destination></Replication>
</AMPSConfig>"""


def load(tmp_path, inbox: str = "", authenticator: str = "", env=None):
    text = _CONFIG.format(root=tmp_path, inbox=inbox, authenticator=authenticator)
    path = tmp_path / "amps-2.xml"
    path.write_text(text)
    return parse_string(text, filename=str(path), base_dir=str(tmp_path), env=env or {})


def test_amps_default_modules_as_in_the_spec_load_and_admit_everyone(tmp_path):
    # spec/replication.txt "Replication Security", as written there
    cfg = load(tmp_path, inbox="<Entitlement><Module>amps-default-entitlement-module</Module></Entitlement>"
                               "<Authentication><Module>amps-default-authentication-module</Module></Authentication>",
               authenticator="<Authenticator><Module>amps-default-authenticator-module</Module></Authenticator>")
    assert cfg.replication_transport.upstream_keys is None
    assert cfg.destinations[0].signing_key is None


def test_keys_come_from_the_environment_or_a_file_and_print_as_secret(tmp_path, monkeypatch):
    (tmp_path / "a3.key").write_text(KEY_VALUE + "\n")
    cfg = load(tmp_path, inbox="<Authentication><Module>replication-hmac-authentication</Module>"
                               f"<Upstream><Name>amps-1</Name><Key>${{{KEY_VARIABLE}}}</Key></Upstream>"
                               "<Upstream><Name>amps-4</Name><KeyFile>a3.key</KeyFile></Upstream></Authentication>",
               authenticator="<Authenticator><Module>replication-hmac-authenticator</Module>"
                             "<KeyFile>a3.key</KeyFile></Authenticator>")
    keys = dict(cfg.replication_transport.upstream_keys)
    assert set(keys) == {"amps-1", "amps-4"}
    assert repr(keys["amps-4"]) == "<secret>" and KEY_VALUE not in repr(cfg)
    assert keys["amps-4"].reveal() == KEY_VALUE
    monkeypatch.delenv(KEY_VARIABLE, raising=False)
    with pytest.raises(ConfigError, match=f"{KEY_VARIABLE} .a replication link key. is not set") as exc:
        check_link_keys(cfg)
    assert "Fix:" in str(exc.value)
    monkeypatch.setenv(KEY_VARIABLE, "short")
    with pytest.raises(ConfigError, match="5 bytes long; a signing key needs at least 16") as exc:
        check_link_keys(cfg)
    assert "short" not in str(exc.value).replace("is 5 bytes", "")
    monkeypatch.setenv(KEY_VARIABLE, KEY_VALUE)
    check_link_keys(cfg)


@pytest.mark.parametrize(("inbox", "authenticator", "says"), [
    ("<Authentication><Module>replication-hmac-authentication</Module>"
     "<Upstream><Name>amps-1</Name><Key>inline-secret-value-123456</Key></Upstream></Authentication>", "",
     "must come from the environment or a file"),
    ("<Authentication><Module>amps-kerberos-authentication</Module></Authentication>", "",
     "'amps-kerberos-authentication' is not supported yet"),
    ("<Entitlement><Module>amps-simple-access-entitlements</Module></Entitlement>", "",
     "'amps-simple-access-entitlements' is not supported yet"),
    ("<Entitlement><Module>replication-topic-entitlement</Module></Entitlement>", "", "none is listed"),
    ("<Entitlement><Module>replication-topic-entitlement</Module><Upstream><Name>a</Name><Group>g</Group>"
     "<Topic>.*</Topic></Upstream></Entitlement>", "", "names one instance (<Name>) or one group"),
    ("<Entitlement><Module>replication-topic-entitlement</Module><Upstream><Name>a</Name></Upstream>"
     "</Entitlement>", "", "<Topic>"),
    ("<Entitlement><Module>replication-topic-entitlement</Module><Upstream><Name>a</Name><Topic>(</Topic>"
     "</Upstream></Entitlement>", "", "("),
    ("<Entitlement><Module>amps-default-entitlement-module</Module><Upstream><Name>a</Name><Topic>.*</Topic>"
     "</Upstream></Entitlement>", "", "allows everything"),
    ("<Authentication><Module>replication-hmac-authentication</Module></Authentication>", "", "none is given"),
    ("<Authentication><Module>amps-default-authentication-module</Module>"
     "<Upstream><Name>amps-1</Name><KeyFile>k</KeyFile></Upstream></Authentication>", "", "admits every upstream"),
    ("", "<Authenticator><Module>replication-hmac-authenticator</Module></Authenticator>", "signs with a key"),
    ("", "<Authenticator><Module>amps-default-authenticator-module</Module><KeyFile>k</KeyFile></Authenticator>",
     "presents no credentials"),
])
def test_refused_forms_name_file_line_and_fix(tmp_path, inbox, authenticator, says):
    with pytest.raises(ConfigError) as exc:
        load(tmp_path, inbox=inbox, authenticator=authenticator)
    text = str(exc.value)
    assert says in text and "Fix:" in text
    assert exc.value.file.endswith("amps-2.xml") and exc.value.line
    assert "inline-secret-value" not in text


_ENTITLED = ("<Entitlement><Module>replication-topic-entitlement</Module>"
             "<Upstream><Name>amps-1</Name><Topic>^/orders/</Topic></Upstream>"
             "<Upstream><Group>ny</Group><Topic>.*</Topic></Upstream></Entitlement>")


def test_entitlements_refuse_unlisted_upstreams_and_topics(tmp_path):
    cfg = load(tmp_path, inbox=_ENTITLED)
    rules = Entitlements("amps-2", cfg.replication_transport.entitlements)
    rows = pa.concat_tables([
        with_column(inbox_rows(2, link="amps-1"), "topic", ["/orders/1", "/quotes/1"]),
        inbox_rows(2, link="amps-7"),  # group amps-7: not listed
        with_column(with_column(inbox_rows(1, link="amps-8"), "link_group", ["ny"]), "topic", ["/x"]),
        inbox_rows(1, link=BACKFILL_LINK),
    ])
    reasons = rules.refusals(rows).to_pylist()
    assert reasons[0] is None and reasons[4] is None and reasons[5] is None
    assert reasons[1] == "topic '/quotes/1' from upstream amps-1 is not entitled in amps-2: it may send '^/orders/'"
    assert reasons[2] == reasons[3] == ("upstream amps-7 (group amps-7) is not entitled to replicate into amps-2: "
                                        "its <Entitlement> names neither")
    assert rules.refusals(rows.slice(0, 1)) is None


def test_validation_names_the_destination_and_the_topics_not_admitted(tmp_path):
    down = load(tmp_path, inbox=_ENTITLED)
    (tmp_path / "up").mkdir()
    up_text = _CONFIG.format(root=tmp_path, inbox="", authenticator="").replace("amps-2", "amps-1").replace(
        "<Name>.*</Name><MessageType>json</MessageType></Topic>\n  <Transport>",
        "<Name>^/orders/</Name><MessageType>json</MessageType></Topic><Topic><Name>/quotes</Name>"
        "<MessageType>json</MessageType></Topic>\n  <Transport>")
    up = parse_string(up_text, filename=str(tmp_path / "up" / "amps-1.xml"), env={})
    dest = up.destinations[0]
    found = [(f.destination, f.topic, f.check) for f in validate_link(up, dest, down) if f.check == "entitlement"]
    assert found == [("amps-3", "/quotes", "entitlement")]
    text = next(str(f) for f in validate_link(up, dest, down) if f.check == "entitlement")
    assert "does not cover topic '/quotes'" in text and "<Topic>/quotes</Topic>" in text
    stranger = parse_string(up_text.replace("amps-1", "amps-5"), filename="amps-5.xml", env={})
    found = [(f.topic, f.check) for f in validate_link(stranger, stranger.destinations[0], down)
             if f.check == "entitlement"]
    assert found == [("^/orders/", "entitlement"), ("/quotes", "entitlement")]


# -- end to end ----------------------------------------------------------------


STRANGER_KEY_VARIABLE = "TEST_STRANGER_LINK_KEY"
STRANGER_KEY = b"s" * 32


def test_a_signed_entitled_pair_takes_only_verified_commits_of_admitted_topics(fabric, monkeypatch, caplog):
    monkeypatch.setenv(KEY_VARIABLE, KEY_VALUE)
    monkeypatch.setenv(STRANGER_KEY_VARIABLE, STRANGER_KEY.decode())
    a_name, b_name = fabric.name("a"), fabric.name("b")
    fabric.configure("b", inbox_auth=(
        "<Authentication><Module>replication-hmac-authentication</Module>"
        f"<Upstream><Name>{a_name}</Name><Key>${{{KEY_VARIABLE}}}</Key></Upstream>"
        f"<Upstream><Name>stranger</Name><Key>${{{STRANGER_KEY_VARIABLE}}}</Key></Upstream></Authentication>"
        "<Entitlement><Module>replication-topic-entitlement</Module>"
        f"<Upstream><Name>{a_name}</Name><Topic>^/orders</Topic></Upstream></Entitlement>"))
    # A sends every topic, its entitlement check excluded: B is the one to refuse /quotes
    sends_all = ("<Topic><Name>.*</Name><MessageType>json</MessageType>"
                 "<ExcludeValidation>replicate,cascade,entitlement</ExcludeValidation></Topic>")
    fabric.configure("a", replication=replication_xml(destination_xml(
        b_name, [fabric.storage("b")], topics=sends_all,
        authenticator=f"<Authenticator><Module>replication-hmac-authenticator</Module><Key>${{{KEY_VARIABLE}}}</Key>"
                      "</Authenticator>")))
    with caplog.at_level(logging.INFO, logger="replication.instance"):
        fabric.start("b")
        fabric.start("a")
    assert any(f"incoming replication is authenticated: only commits signed by {a_name}, stranger are taken"
               in r.getMessage() for r in caplog.records)
    assert any(f"{a_name}: incoming replication is not authenticated" in r.getMessage() for r in caplog.records)
    pub = fabric.publisher("signed-pub", "a")
    publish_orders(pub, 200)
    # sync: B took A's signed commits and acknowledged them, the /quotes B refuses by entitlement too (A sent
    # them and B handled them: rejected)
    publish_orders(pub, 20, topic="/quotes")
    assert pub.flush(timeout=240) == []
    inbox = fabric.storage("b") / "inbox"
    valid_version = DeltaTable(str(inbox)).version()
    valid_info = DeltaTable(str(inbox)).history(limit=1)[0]
    assert SIGNATURE_KEY in valid_info, "A signs what it writes into B's inbox"
    valid_rows = read_versions(str(inbox), valid_version, valid_version).select(INBOX_SCHEMA.names)

    def forged_rows(client: str) -> pa.Table:
        rows = valid_rows.slice(0, 3)
        return with_column(rows, "publisher", [client] * 3)

    app = json.loads(valid_info[SIGNATURE_KEY])["app"]
    commit(inbox, forged_rows("by-hand"))  # deltalake, no signature
    # (no app transaction of A's in it: one would make A take its later batches for committed ones, a denial
    # of service open to anyone who can write the inbox, which signing does not claim to prevent)
    commit(inbox, forged_rows("wrong-key"), signature=sign(b"w" * 32, upstream=a_name, to=b_name, app_id=app,
                                                          batch=10**6, rows=forged_rows("wrong-key")))
    commit(inbox, forged_rows("tampered"), signature=valid_info[SIGNATURE_KEY])  # A's signature, other rows
    commit(inbox, valid_rows, signature=valid_info[SIGNATURE_KEY])  # a valid commit copied again
    # an upstream that authenticates but is not entitled to replicate here at all
    stranger = with_column(with_column(with_column(inbox_rows(3, link="stranger", publisher="stranger-pub"),
                                                   "link_group", ["strangers"] * 3), "topic", ["/orders"] * 3),
                           "origin", ["stranger"] * 3)
    signed_commit(inbox, stranger, STRANGER_KEY, app="stranger->b#1", batch=1, upstream="stranger", to=b_name)
    publish_orders(pub, 200)
    assert pub.flush(timeout=240) == []  # the valid upstream's rows keep flowing
    wait_until(lambda: fabric.count("b") >= 400, what="B to hold A's 400 orders")
    wait_until(lambda: len(rejected_rows(fabric.root, b_name)) >= 32 + valid_rows.num_rows,
               what="B to reject what it refuses")
    rows = fabric.rows("b")
    # once each, in order: the orders (seqs 1-200 and 221-420), not the /quotes between them
    assert rows["publisher_seq"].to_pylist() == [*range(1, 201), *range(221, 421)]
    assert set(rows["topic"].to_pylist()) == {"/orders"}
    rejected = rejected_rows(fabric.root, b_name)
    reasons = {r["publisher"]: r["reason"] for r in rejected if r["topic"] != "/quotes"}
    assert "unsigned" in reasons["by-hand"] and f"upstream {a_name}" in reasons["by-hand"]
    assert "forged" in reasons["wrong-key"] and f"upstream {a_name}" in reasons["wrong-key"]
    assert "tampered" in reasons["tampered"]
    assert "replayed" in reasons["signed-pub"]
    assert reasons["stranger-pub"] == (f"upstream stranger (group strangers) is not entitled to replicate into "
                                       f"{b_name}: its <Entitlement> names neither")
    assert sum(1 for r in rejected if "replayed" in r["reason"]) == valid_rows.num_rows
    quotes = [r for r in rejected if r["topic"] == "/quotes" and "replayed" not in r["reason"]]
    assert len(quotes) == 20 and {r["reason"] for r in quotes} == {
        f"topic '/quotes' from upstream {a_name} is not entitled in {b_name}: it may send '^/orders'"}

    def refusals():
        return status_command.collect(config.load(str(fabric.paths["b"])))["refusals"]

    # (the stranger's refusal may reach the heartbeat a second after A's: wait for both)
    wait_until(lambda: refusals().get(a_name, {}).get("commits") == 4 and "stranger" in refusals(),
               what="status to show B's 4 refused commits and the stranger's")
    assert refusals()[a_name]["rows"] == 9 + valid_rows.num_rows + 20
    assert refusals()["stranger"]["rows"] == 3
    assert fabric.running["b"].query.isActive
    # the keys are nowhere: not in a file the pair wrote, not in a log line
    for path in fabric.root.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            assert KEY_VALUE.encode() not in data and STRANGER_KEY not in data, path
    assert KEY_VALUE not in caplog.text
