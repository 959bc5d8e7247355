"""``replication validate``, ``trace`` and ``topology`` as a user runs them: output text, files and exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from lxml import etree
from support.cli import run_cli
from support.repo import MESH, mesh_copy

from replication.config.fabric import Fabric

MESH_FILES = sorted(str(p) for p in MESH.glob("*.xml"))
INSTANCES = ["Incoming-A", "Incoming-B", "Live-A", "Live-B", "Dev-A", "Dev-B", "Archive-A", "Archive-B"]


PAIR = """<?xml version="1.0"?>
<AMPSConfig>
  <Name>{me}</Name>
  <Group>DataCenter-NYC-1</Group>
  <Storage>{root}/{me}</Storage>
  <Transports>
    <Transport><Name>json-kafka</Name><Type>kafka</Type><InetAddr>localhost:9092</InetAddr>
      <Topic>{me}.publish</Topic><MessageType>json</MessageType></Transport>
    <Transport><Name>amps-replication</Name><Type>amps-replication</Type><InetAddr>{root}/{me}</InetAddr></Transport>
  </Transports>
  <TransactionLog><Topic><Name>.*</Name><MessageType>json</MessageType></Topic></TransactionLog>
  <Replication>
    <Destination>
      <Name>{other}</Name><Group>DataCenter-NYC-1</Group><SyncType>sync</SyncType><PassThrough>.*</PassThrough>
      <Topic><Name>^/orders/</Name><MessageType>json</MessageType>{excl}</Topic>
      <Topic><Name>topic</Name><MessageType>json</MessageType></Topic>
      <Transport><Type>amps-replication</Type><InetAddr>{root}/{other}</InetAddr></Transport>
    </Destination>
    {extra}
  </Replication>
</AMPSConfig>
"""

VIEW = """<Destination>
      <Name>view-server</Name><SyncType>async</SyncType>
      <Topic><Name>^/orders/</Name><MessageType>json</MessageType><Filter>/qty &gt; 100</Filter>
        <ExcludeValidation>replicate,cascade</ExcludeValidation></Topic>
      <Transport><Type>amps-replication</Type><InetAddr>{root}/view</InetAddr></Transport>
    </Destination>"""


def write_pair(directory: Path, *, excludes_cascade: bool = True) -> list[str]:
    """amps-1 <-> amps-2 (sync), and amps-1 -> a view server not among the configs."""
    root = directory / "var"
    paths = []
    # amps-1 relaxes replicate,cascade towards its view server, so amps-2 must exclude cascade towards
    # amps-1; amps-2 then relaxes cascade, so amps-1 must exclude it towards amps-2 (the blog's tier rule)
    excl = "<ExcludeValidation>cascade</ExcludeValidation>" if excludes_cascade else ""
    for me, other, extra in (("amps-1", "amps-2", VIEW.format(root=root)), ("amps-2", "amps-1", "")):
        ex = excl
        p = directory / f"{me}.xml"
        p.write_text(PAIR.format(me=me, other=other, root=root, extra=extra, excl=ex))
        paths.append(str(p))
    return paths


@pytest.fixture
def pair(tmp_path) -> list[str]:
    return write_pair(tmp_path)


# --------------------------------------------------------------------------- validate


def test_validate_the_mesh_is_clean():
    code, out, _ = run_cli("validate", *MESH_FILES)
    assert code == 0
    assert out.strip().endswith("8 instances, 20 links checked: all clean")
    assert "ok    Incoming-A -> Live-B (destination LiveProdSubscriptions) (failover 2)" in out


def test_validate_reports_findings_with_fixes_and_fails(tmp_path):
    paths = mesh_copy(tmp_path, {"Incoming-B": [("<ExcludeValidation>replicate,cascade</ExcludeValidation>",
                                                 "<ExcludeValidation>cascade</ExcludeValidation>")]})
    code, out, _ = run_cli("validate", *paths)
    assert code == 1
    assert "FAIL  Incoming-B -> Live-B (destination LiveProdSubscriptions)" in out
    assert "replicate check failed: Live-B does not replicate topic '.*' (json) back to Incoming-B" in out
    assert "fix: in Live-B's config add <Replication><Destination><Name>Incoming-B</Name>" in out
    assert "20 links checked: 2 failed with 2 findings" in out


def test_validate_json(tmp_path):
    paths = mesh_copy(tmp_path, {"Archive-A": [("<ExcludeValidation>cascade</ExcludeValidation>", "")]})
    code, out, _ = run_cli("validate", "--format", "json", *paths)
    report = json.loads(out)
    assert code == 1 and report["ok"] is False
    assert {(f["upstream"], f["downstream"], f["check"]) for f in report["findings"]} == {
        ("Archive-A", "Archive-B", "cascade")
    }
    assert len(report["links"]) == 20 and {link["status"] for link in report["links"]} == {"ok", "failed"}


def test_validate_the_pair_needs_cascade_excluded_towards_a_view_server_host(tmp_path):
    code, out, _ = run_cli("validate", *write_pair(tmp_path, excludes_cascade=False))
    assert code == 1
    assert ("amps-2 -> amps-1 (destination amps-1, topic '^/orders/' json): cascade check failed: amps-1 excludes "
            "replicate,cascade for topic '^/orders/' on its destination view-server, which this link enforces") in out
    assert "fix: if amps-1's relaxed checks are intended, in amps-2's config set " in out


def test_validate_lists_links_to_instances_not_given(pair):
    code, out, _ = run_cli("validate", *pair)
    assert code == 0
    assert "amps-1 -> " in out and "(destination view-server): no given config has this address; not checked" in out
    assert "2 links checked: all clean; 1 not checked" in out
    code, _out, _ = run_cli("validate", "--strict", *pair)
    assert code == 1


def test_validate_a_config_that_does_not_parse(tmp_path):
    bad = tmp_path / "bad.xml"
    bad.write_text("<AMPSConfig><Name>x</Name></AMPSConfig>")
    code, _out, err = run_cli("validate", str(bad))
    assert code == 2 and "bad.xml" in err


# --------------------------------------------------------------------------- trace


def reached(out: str) -> list[str]:
    section = out.split("Reaches ")[1].split("\n\n")[0].splitlines()[1:]
    return [line.split()[0] for line in section if line.startswith("  ") and not line.startswith("   ")]


def test_trace_the_mesh_reaches_all_eight():
    code, out, _ = run_cli("trace", *MESH_FILES, "--from", "Incoming-A", "--topic", "/orders/1")
    assert code == 0
    assert "Reaches 8 of 8 instances:" in out and "Does not reach: none" in out
    assert sorted(reached(out)) == sorted(INSTANCES)
    assert "  Incoming-A  published here" in out
    assert "  Live-A      Incoming-A -> Live-A" in out
    assert "Incoming-A -> Live-A -> Dev-A -> Archive-A" in out


def test_trace_without_live_a_still_reaches_the_seven_others():
    code, out, _ = run_cli("trace", *MESH_FILES, "--from", "Incoming-A", "--topic", "/orders/1",
                           "--without", "Live-A")
    assert code == 0
    assert "Reaches 7 of 8 instances:" in out
    assert sorted(reached(out)) == sorted(i for i in INSTANCES if i != "Live-A")
    assert "  Live-A      down (--without)" in out
    assert "  Live-B      Incoming-A -> Live-B" in out  # Incoming-A fails over to its second address
    # and with one instance down in every tier
    code, out, _ = run_cli("trace", *MESH_FILES, "--from", "Incoming-A", "--topic", "/x",
                           "--without", "Live-A", "--without", "Dev-B", "--without", "Archive-A")
    assert sorted(reached(out)) == ["Archive-B", "Dev-A", "Incoming-A", "Incoming-B", "Live-B"]


def test_trace_with_passthrough_removed_names_what_is_lost_and_why(tmp_path):
    paths = mesh_copy(tmp_path, {"Live-A": [("<PassThrough>.*</PassThrough>", "")]})
    # the mesh still delivers everywhere (Live-B covers), but the report shows the copies Live-A holds back
    code, out, _ = run_cli("trace", *paths, "--from", "Incoming-A", "--topic", "/orders/1")
    assert "Reaches 8 of 8 instances:" in out
    assert ("Live-A -> Dev-A (destination DevUAT): [passthrough] Live-A received it from Incoming-A "
            "(group IncomingMessages) and destination DevUAT has no PassThrough") in out
    # ...and with Incoming-B down, Live-A is the only way on: everything after it is lost
    code, out, _ = run_cli("trace", *paths, "--from", "Incoming-A", "--topic", "/orders/1",
                           "--without", "Incoming-B")
    assert code == 0
    assert "Reaches 2 of 8 instances:" in out and "Does not reach 6:" in out
    lost = out.split("Does not reach 6:")[1].split("\n\n")[0]
    assert ("  Live-B      Live-A -> Live-B: Live-A received it from Incoming-A (group IncomingMessages) "
            "and destination Live-B has no PassThrough, so replicated messages are not forwarded") in lost
    assert "  Dev-A       Live-A -> Dev-A: Live-A received it from Incoming-A" in lost
    assert "  Archive-A   " in lost and "Dev-A (destination ArchiveAudit) is itself not reached" in lost
    assert "  Incoming-B  down (--without)" in lost


def test_trace_passthrough_by_group_regex(tmp_path):
    """The spec's HKG example: pass through every group except those containing HKG."""
    paths = mesh_copy(tmp_path, {"Live-A": [("<PassThrough>.*</PassThrough>",
                                             "<PassThrough>^((?!Incoming).)*$</PassThrough>")]})
    code, out, _ = run_cli("trace", *paths, "--from", "Incoming-A", "--topic", "/t", "--without", "Incoming-B",
                           "--format", "json")
    report = json.loads(out)
    assert sorted(report["reached"]) == ["Incoming-A", "Live-A"]
    reasons = {(h["sender"], h["target"]): h["reason"] for h in report["not_sent"]}
    assert "does not match PassThrough '^((?!Incoming).)*$'" in reasons[("Live-A", "Live-B")]


def test_trace_filters_and_destinations_outside_the_configs(pair):
    code, out, _ = run_cli("trace", *pair, "--from", "amps-1", "--topic", "/orders/1", "--message", '{"qty": 500}')
    assert "Reaches 2 of 2 instances:" in out
    assert "Leaves the given configs (sent, not followed further):" in out and "(destination view-server)" in out
    code, out, _ = run_cli("trace", *pair, "--from", "amps-1", "--topic", "/orders/1", "--message", '{"qty": 5}')
    assert ("amps-1 -> view-server (destination view-server): [filter] filter false: the message does not match "
            "'/qty > 100'") in out
    code, out, _ = run_cli("trace", *pair, "--from", "amps-2", "--topic", "/trades/1")
    assert ("amps-2 -> amps-1 (destination amps-1): [topic] no <Topic> of destination amps-1 matches topic "
            "'/trades/1'") in out
    assert "  amps-1  amps-2 -> amps-1: no <Topic> of destination amps-1" in out


def test_trace_names_the_queues_a_message_enters_where_they_are_held_and_who_delivers(pair):
    queues = ("<SOW><Queue><Name>/orders/work</Name><MessageType>json</MessageType><UnderlyingTopic>^/orders/new/"
              "</UnderlyingTopic></Queue><GroupLocalQueue><Name>/orders/glq</Name><MessageType>json</MessageType>"
              "<UnderlyingTopic>^/orders/g/</UnderlyingTopic><InitialOwner>amps-1</InitialOwner></GroupLocalQueue>"
              "</SOW>")
    for path in pair:
        Path(path).write_text(Path(path).read_text().replace("</TransactionLog>", "</TransactionLog>" + queues))
    _code, out, _ = run_cli("trace", *pair, "--from", "amps-2", "--topic", "/orders/new/1")
    assert "Queue /orders/work (Queue): a message of the queue; held at amps-2, amps-1" in out
    assert "delivered by amps-2 (its owner; another instance only after a transfer)" in out
    _code, out, _ = run_cli("trace", *pair, "--from", "amps-2", "--topic", "/orders/g/7", "--format", "json")
    [glq] = json.loads(out)["queues"]
    assert glq["queue"] == "/orders/glq" and glq["delivered_by"] == "amps-1"  # its InitialOwner
    _code, out, _ = run_cli("trace", *pair, "--from", "amps-1", "--topic", "/orders/work")
    assert "Queue /orders/work (Queue): the queue topic: its acknowledgements and transfers go where" in out


def test_trace_errors():
    code, _out, err = run_cli("trace", *MESH_FILES, "--from", "Nope", "--topic", "/t")
    assert code == 2 and "no given config is named 'Nope'" in err
    code, _out, err = run_cli("trace", *MESH_FILES, "--from", "Live-A", "--topic", "/t", "--message", "{bad")
    assert code == 2 and "--message is not valid JSON" in err


# --------------------------------------------------------------------------- topology


@pytest.mark.parametrize("which", ["pair", "mesh"])
def test_topology_svg_names_every_instance_and_link(which, pair, tmp_path):
    files = pair if which == "pair" else MESH_FILES
    out_file = tmp_path / f"{which}.svg"
    code, out, _ = run_cli("topology", *files, "-o", str(out_file))
    assert code == 0 and out.startswith(f"wrote {out_file}")
    svg = etree.fromstring(out_file.read_bytes())  # well-formed XML
    texts = {t.text for t in svg.iter("{http://www.w3.org/2000/svg}text")}
    fabric = Fabric.load(files)
    for cfg in fabric:
        assert cfg.name in texts
        assert f"Group {cfg.group}" in texts
    drawn = {(g.get("data-from"), g.get("data-to"), g.get("data-destination"))
             for g in svg.iter("{http://www.w3.org/2000/svg}g") if g.get("class") == "link"}
    expected = {(lk.upstream, lk.downstream or "view-server", lk.destination.name) for lk in fabric.all_links()}
    assert drawn == expected
    for cfg in fabric:
        for d in cfg.destinations:
            assert any(t and t.startswith(f"{d.name} · {d.sync_type}") for t in texts)
    if which == "mesh":
        assert len(drawn) == 20
        assert "failover: Live-A → Live-B" in texts and ".* json · excl. replicate,cascade" in texts
    else:
        assert "  filter: /qty > 100" in texts and "view-server" in texts


@pytest.mark.parametrize("which", ["pair", "mesh"])
def test_topology_png_and_mermaid(which, pair, tmp_path):
    from PIL import Image

    files = pair if which == "pair" else MESH_FILES
    png = tmp_path / f"{which}.png"
    assert run_cli("topology", *files, "-o", str(png))[0] == 0
    with Image.open(png) as img:
        assert img.format == "PNG" and img.width > 600 and img.height > 400
        assert len(img.convert("RGB").resize((64, 64)).getcolors(4096) or ()) > 10  # not blank
    mmd = tmp_path / f"{which}.mmd"
    assert run_cli("topology", *files, "-o", str(mmd))[0] == 0
    text = mmd.read_text()
    assert text.startswith("flowchart TB")
    for cfg in Fabric.load(files):
        assert f"<b>{cfg.name}</b>" in text
    assert text.count("-->|") + text.count("-.->|") == len(Fabric.load(files).all_links())


def test_topology_refuses_an_unknown_picture_type():
    code, _out, err = run_cli("topology", *MESH_FILES, "-o", "fabric.gif")
    assert code == 2 and "use .svg, .png or .mmd" in err


def test_validate_and_trace_take_the_mesh_with_every_address_in_a_bucket(monkeypatch):
    """The shipped mesh with ``REPLICATION_HOME=s3://fabric``: every storage and replication address is an S3
    prefix; validate and trace resolve them as they do paths (no bucket is contacted)."""
    monkeypatch.setenv("REPLICATION_HOME", "s3://fabric")
    fabric = Fabric.load(MESH_FILES)
    assert {cfg.storage for cfg in fabric} == {f"s3://fabric/mesh/{name}" for name in INSTANCES}
    code, out, _ = run_cli("validate", *MESH_FILES)
    assert code == 0 and "8 instances, 20 links checked: all clean" in out, out
    code, out, _ = run_cli("trace", *MESH_FILES, "--from", "Incoming-A", "--topic", "/orders/1")
    assert code == 0 and "Reaches 8 of 8 instances:" in out, out
    assert "Incoming-A -> Live-A -> Dev-A -> Archive-A" in out
