"""The instance config: XML → dataclasses, every error names file, line, value and fix."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from lxml import etree
from support.repo import REPO

from replication.actions import policy_of
from replication.config import effective as effective_config
from replication.config import load
from replication.config.model import (
    Action,
    ActionStep,
    Bootstrap,
    Destination,
    DestinationTopic,
    InstanceConfig,
    KafkaTransport,
    QueueTopic,
    ReplicationTransport,
    SowTopic,
    TopicSpec,
)
from replication.config.parser import parse_interval, parse_string
from replication.errors import ConfigError, ReplicationError
from replication.expressions import Filter
from replication.storage.control import read_instance_config, write_instance_config

XSD = REPO / "conf" / "replication.xsd"
MARK = "<!--HERE-->"

# DESIGN §4's example, plus a queue, a kafka cap and a second destination.
FULL = """\
<?xml version="1.0" encoding="UTF-8"?>
<AMPSConfig>
  <Name>amps-1</Name>
  <Group>DataCenter-NYC-1</Group>
  <Storage>file:///var/lib/replication/amps-1</Storage>
  <Transports>
    <Transport>                         <!-- publish ingress -->
      <Name>json-kafka</Name>
      <Type>kafka</Type>
      <InetAddr>localhost:9092</InetAddr>
      <Topic>amps-1.publish</Topic>
      <MessageType>json</MessageType>
      <MaxOffsetsPerTrigger>50000</MaxOffsetsPerTrigger>
    </Transport>
    <Transport>                         <!-- incoming replication (the inbox) -->
      <Name>amps-replication</Name>
      <Type>amps-replication</Type>
      <InetAddr>file:///var/lib/replication/amps-1</InetAddr>
    </Transport>
  </Transports>
  <TransactionLog>
    <Topic><Name>.*</Name><MessageType>json</MessageType></Topic>
  </TransactionLog>
  <SOW>
    <Topic><Name>/orders</Name><MessageType>json</MessageType><Key>/id</Key></Topic>
    <Queue><Name>/work</Name><MessageType>json</MessageType><UnderlyingTopic>^/work/</UnderlyingTopic></Queue>
  </SOW>
  <Replication>
    <Destination>
      <Name>amps-2</Name>
      <Group>DataCenter-NYC-1</Group>
      <SyncType>sync</SyncType>
      <PassThrough>.*</PassThrough>
      <Topic>
        <Name>^/orders/</Name>
        <MessageType>json</MessageType>
        <Filter>/qty &gt; 100</Filter>
        <ExcludeValidation>replicate,cascade</ExcludeValidation>
      </Topic>
      <Transport>
        <Type>amps-replication</Type>
        <InetAddr>file:///var/lib/replication/amps-2</InetAddr>
        <InetAddr>file:///var/lib/replication/amps-2b</InetAddr>
      </Transport>
    </Destination>
    <Destination>
      <Name>amps-3</Name>
      <SyncType>async</SyncType>
      <Compression>lz4</Compression>
      <Topic><Name>.*</Name><MessageType>json</MessageType></Topic>
      <Transport><Type>amps-replication</Type><InetAddr>file:///var/lib/replication/amps-3/</InetAddr></Transport>
    </Destination>
    <Destination>
      <Group>Archive</Group>
      <SyncType>async</SyncType>
      <Topic><Name>.*</Name><MessageType>json</MessageType></Topic>
      <Transport><Type>amps-replication</Type><InetAddr>/var/lib/replication/archive-a</InetAddr></Transport>
    </Destination>
  </Replication>
  <Bootstrap>
    <Topic><Name>^audit-topic</Name><MessageType>json</MessageType></Topic>
    <DataType>sow,txlog</DataType>
    <Transport><InetAddr>file:///var/lib/replication/source</InetAddr><Type>amps-replication</Type></Transport>
  </Bootstrap>
  <Actions>                               <!-- automatic downgrade / upgrade -->
    <Action>
      <On><Module>amps-action-on-schedule</Module><Options><Every>15s</Every></Options></On>
      <Do><Module>amps-action-do-downgrade-replication</Module><Options><Age>300s</Age><GracePeriod>1m</GracePeriod></Options></Do>
      <Do><Module>amps-action-do-upgrade-replication</Module><Options><Age>10s</Age></Options></Do>
    </Action>
  </Actions>
  <Tuning><MinimumSyncDestinations>1</MinimumSyncDestinations></Tuning>
</AMPSConfig>
"""


def write(tmp_path: Path, text: str, name: str = "amps-1.xml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def mutate(old: str, new: str, text: str = FULL) -> str:
    assert text.count(old) == 1, f"fixture text {old!r} is not unique"
    return text.replace(old, new)


def marked_line(text: str) -> int:
    """Line holding the <!--HERE--> marker: where the error must point."""
    return next(n for n, line in enumerate(text.splitlines(), 1) if MARK in line)


# ---------------------------------------------------------------------------
# A valid config


def test_full_config_parses_into_dataclasses(tmp_path):
    path = write(tmp_path, FULL)

    cfg = load(str(path))

    assert cfg == InstanceConfig(
        name="amps-1",
        group="DataCenter-NYC-1",
        storage="/var/lib/replication/amps-1",
        kafka_transports=(
            KafkaTransport(
                name="json-kafka",
                bootstrap_servers=("localhost:9092",),
                topics=("amps-1.publish",),
                message_type="json",
                max_offsets_per_trigger=50000,
            ),
        ),
        replication_transport=ReplicationTransport(
            name="amps-replication", inet_addr="/var/lib/replication/amps-1"
        ),
        txlog_topics=(TopicSpec(".*", "json"),),
        sow_topics=(SowTopic("/orders", "json", ("/id",)),),
        queues=(QueueTopic("/work", "json", "^/work/", kind="Queue"),),
        destinations=(
            Destination(
                name="amps-2",
                group="DataCenter-NYC-1",
                sync_type="sync",
                topics=(
                    DestinationTopic(
                        "^/orders/",
                        "json",
                        filter=Filter("/qty > 100"),
                        exclude_validation=frozenset({"replicate", "cascade"}),
                    ),
                ),
                inet_addrs=("/var/lib/replication/amps-2", "/var/lib/replication/amps-2b"),
                pass_through=".*",
                group_declared=True,
            ),
            Destination(
                name="amps-3",
                group="amps-3",  # defaults to the name
                sync_type="async",
                topics=(DestinationTopic(".*", "json"),),
                inet_addrs=("/var/lib/replication/amps-3",),
                compression="lz4",
            ),
            Destination(
                name="Archive",  # no <Name>: named by its group, as AMPS identifies it
                group="Archive",
                sync_type="async",
                topics=(DestinationTopic(".*", "json"),),
                inet_addrs=("/var/lib/replication/archive-a",),
                group_declared=True,
            ),
        ),
        bootstrap=Bootstrap(
            topics=(TopicSpec("^audit-topic", "json"),),
            data_types=frozenset({"sow", "txlog"}),
            inet_addr="/var/lib/replication/source",
            inet_addrs=("/var/lib/replication/source",),
        ),
        actions=(
            Action(
                on=ActionStep("amps-action-on-schedule", every=15.0),
                do=(
                    ActionStep("amps-action-do-downgrade-replication", age=300.0, grace_period=60.0),
                    ActionStep("amps-action-do-upgrade-replication", age=10.0),
                ),
            ),
        ),
        minimum_sync_destinations=1,
    )
    # Every element remembers where it was written.
    assert cfg.destination("amps-2").source.file == str(path)
    assert cfg.destination("amps-2").source.line == FULL.splitlines().index("    <Destination>") + 1
    assert cfg.actions[0].do[0].age == 300.0, "intervals are seconds on the dataclasses"


def test_defaults_group_inbox_address_and_message_type(tmp_path):
    text = """<AMPSConfig>
  <Name>solo</Name>
  <Storage>/data/solo</Storage>
  <Transports>
    <Transport><Name>in</Name><Type>kafka</Type><InetAddr>k1:9092,k2:9092</InetAddr><Topic>solo.publish</Topic></Transport>
    <Transport><Name>amps-replication</Name><Type>amps-replication</Type></Transport>
  </Transports>
</AMPSConfig>"""
    cfg = load(str(write(tmp_path, text)))
    assert cfg.group == "solo"
    assert cfg.replication_transport.inet_addr == "/data/solo"
    assert cfg.kafka_transports[0].message_type == "json"
    assert cfg.kafka_transports[0].bootstrap_servers == ("k1:9092", "k2:9092")
    assert cfg.destinations == () and cfg.bootstrap is None


def test_relative_storage_is_relative_to_the_config_file(tmp_path, monkeypatch):
    conf_dir = tmp_path / "conf"
    conf_dir.mkdir()
    path = write(conf_dir, "<AMPSConfig><Name>a</Name><Storage>../var/a</Storage></AMPSConfig>")
    monkeypatch.chdir("/")
    assert load(str(path)).storage == str(tmp_path / "var" / "a")


@pytest.mark.parametrize(
    "written, expected",
    [
        ("file:///data/x", "/data/x"),
        ("file://localhost/data/x/", "/data/x"),
        ("file:///data/with%20space", "/data/with space"),
        ("/data/./x/../y", "/data/y"),
    ],
)
def test_storage_locations(written, expected):
    cfg = parse_string(f"<AMPSConfig><Name>a</Name><Storage>{written}</Storage></AMPSConfig>")
    assert cfg.storage == expected


def test_the_cascading_mesh_blog_destinations_without_a_name_are_named_by_their_group():
    """The blog's Incoming-A, as written: its inter-tier destination has a <Group> and no <Name>."""
    cfg = parse_string(
        """<AMPSConfig><Name>Incoming-A</Name><Group>IncomingMessages</Group><Storage>/s/Incoming-A</Storage>
        <TransactionLog><Topic><Name>.*</Name><MessageType>json</MessageType></Topic></TransactionLog>
        <Replication>
        <Destination>
        <Name>Incoming-B</Name>
        <Group>IncomingMessages</Group>
        <PassThrough>.*</PassThrough>
        <Topic>
        <Name>.*</Name>
        <MessageType>json</MessageType>
        <ExcludeValidation>cascade</ExcludeValidation>
        </Topic>
        <SyncType>sync</SyncType>
        <Transport>
        <InetAddr>/s/Incoming-B</InetAddr> <!-- Incoming-B -->
        <Type>amps-replication</Type>
        </Transport>
        </Destination>
        <Destination>
        <Group>LiveProdSubscriptions</Group>
        <PassThrough>.*</PassThrough>
        <Topic>
        <Name>.*</Name>
        <MessageType>json</MessageType>
        <ExcludeValidation>replicate,cascade</ExcludeValidation>
        </Topic>
        <SyncType>async</SyncType>
        <Transport>
        <InetAddr>/s/Live-A</InetAddr> <!-- Live-A -->
        <InetAddr>/s/Live-B</InetAddr> <!-- Live-B -->
        <Type>amps-replication</Type>
        </Transport>
        </Destination>
        </Replication></AMPSConfig>"""
    )
    inter_tier = cfg.destinations[1]
    assert (inter_tier.name, inter_tier.group, inter_tier.sync_type) == ("LiveProdSubscriptions",
                                                                        "LiveProdSubscriptions", "async")
    assert inter_tier.inet_addrs == ("/s/Live-A", "/s/Live-B")


def test_minimum_sync_destinations_is_an_instance_level_tuning_parameter():
    cfg = parse_string("<AMPSConfig><Name>a</Name><Storage>/s</Storage>"
                       "<Tuning><MinimumSyncDestinations>2</MinimumSyncDestinations></Tuning></AMPSConfig>")
    assert cfg.minimum_sync_destinations == 2
    assert parse_string("<AMPSConfig><Name>a</Name><Storage>/s</Storage></AMPSConfig>").minimum_sync_destinations == 0


def test_group_local_queue_and_downgrade_options():
    cfg = parse_string(
        """<AMPSConfig><Name>a</Name><Storage>/s</Storage>
        <TransactionLog><Topic><Name>.*</Name><MessageType>json</MessageType></Topic></TransactionLog>
        <SOW><GroupLocalQueue><Name>q</Name><MessageType>json</MessageType>
             <InitialOwner>a</InitialOwner><Filter>/x = 1</Filter></GroupLocalQueue></SOW>
        <Actions><Action>
          <On><Module>amps-action-on-schedule</Module><Options><Every>500ms</Every></Options></On>
          <Do><Module>amps-action-do-downgrade-replication</Module>
              <Options><GracePeriod>0s</GracePeriod><Age>5m</Age></Options></Do>
        </Action></Actions></AMPSConfig>"""
    )
    assert cfg.queues == (
        QueueTopic("q", "json", "q", kind="GroupLocalQueue", filter=Filter("/x = 1"), initial_owner="a"),)
    assert cfg.actions[0].on.every == 0.5
    downgrade = cfg.actions[0].do[0]
    assert (downgrade.grace_period, downgrade.age) == (0.0, 300.0)


def test_the_specs_bootstrap_with_sow_and_txlog_loads_on_an_instance_without_those_sow_topics():
    # spec: "If either of these topics is recorded in the SOW, the current messages ... will be copied"
    cfg = parse_string(
        """<AMPSConfig><Name>a</Name><Storage>/s</Storage>
        <Transports><Transport><Name>r</Name><Type>amps-replication</Type></Transport></Transports>
        <TransactionLog><Topic><Name>.*</Name><MessageType>json</MessageType></Topic></TransactionLog>
        <Bootstrap>
          <Topic><Name>important-topic</Name><MessageType>json</MessageType></Topic>
          <Topic><Name>^audit-topic</Name><MessageType>json</MessageType></Topic>
          <DataType>sow,txlog</DataType>
          <Transport><InetAddr>/src-a</InetAddr><InetAddr>/src-b</InetAddr><Type>amps-replication</Type></Transport>
        </Bootstrap></AMPSConfig>""")
    assert cfg.bootstrap.data_types == {"sow", "txlog"} and cfg.sow_topics == ()
    assert cfg.bootstrap.inet_addrs == ("/src-a", "/src-b")


def test_downgrade_and_upgrade_written_as_two_actions_each_keep_their_schedule():
    cfg = parse_string(
        """<AMPSConfig><Name>a</Name><Storage>/s</Storage><Actions>
        <Action><On><Module>amps-action-on-schedule</Module><Options><Every>2s</Every></Options></On>
          <Do><Module>amps-action-do-downgrade-replication</Module><Options><Age>30s</Age></Options></Do></Action>
        <Action><On><Module>amps-action-on-schedule</Module><Options><Every>1m</Every></Options></On>
          <Do><Module>amps-action-do-upgrade-replication</Module><Options><Age>5s</Age></Options></Do></Action>
        </Actions></AMPSConfig>""")
    policy = policy_of(cfg)
    assert (policy.every, policy.downgrade_age, policy.upgrade_interval, policy.upgrade_age) == (2.0, 30.0, 60.0, 5.0)


# ---------------------------------------------------------------------------
# Environment variables and intervals


def test_env_substitution_in_text_values(tmp_path, monkeypatch):
    monkeypatch.setenv("REPL_HOME", str(tmp_path / "data"))
    monkeypatch.setenv("KAFKA", "broker:9093")
    monkeypatch.setenv("EMPTY", "")
    monkeypatch.delenv("UNSET_GROUP", raising=False)
    text = """<AMPSConfig>
  <Name>amps-${SUFFIX:-9}</Name>
  <Group>${UNSET_GROUP:-grp}</Group>
  <Storage>${REPL_HOME}/amps</Storage>
  <Transports><Transport><Name>k</Name><Type>kafka</Type><InetAddr>${KAFKA}</InetAddr>
    <Topic>t${EMPTY:-x}</Topic></Transport></Transports>
</AMPSConfig>"""
    cfg = load(str(write(tmp_path, text)))
    assert cfg.name == "amps-9"
    assert cfg.group == "grp"
    assert cfg.storage == str(tmp_path / "data" / "amps")
    assert cfg.kafka_transports[0].bootstrap_servers == ("broker:9093",)
    assert cfg.kafka_transports[0].topics == ("tx",)  # empty counts as unset with :-


def test_env_value_cannot_inject_xml():
    cfg = parse_string(
        "<AMPSConfig><Name>a</Name><Group>${G}</Group><Storage>/s</Storage></AMPSConfig>",
        env={"G": "</Group><Storage>/evil</Storage>"},
    )
    assert cfg.group == "</Group><Storage>/evil</Storage>" and cfg.storage == "/s"


@pytest.mark.parametrize(
    "text, seconds",
    [("15s", 15.0), ("500ms", 0.5), ("5m", 300.0), ("2h", 7200.0), ("1d", 86400.0), ("30", 30.0), (" 1.5 s ", 1.5)],
)
def test_parse_interval(text, seconds):
    assert parse_interval(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "s", "10 x", "-5s", "5S", "1m30s", "ten seconds"])
def test_parse_interval_rejects(text):
    with pytest.raises(ValueError, match="interval|unit"):
        parse_interval(text)


# ---------------------------------------------------------------------------
# Malformed configs: (id, config text with <!--HERE--> on the line the error must name, value quoted)

BAD: list[tuple[str, str, str]] = [
    (
        "unknown element",
        mutate("\n  <Group>DataCenter-NYC-1</Group>\n",
               "\n  <Group>DataCenter-NYC-1</Group>\n  <Colour>red</Colour>" + MARK + "\n"),
        "<Colour>",
    ),
    (
        "typo with did-you-mean",
        mutate("      <SyncType>sync</SyncType>", "      <SynType>sync</SynType>" + MARK),
        "did you mean <SyncType>?",
    ),
    ("missing instance Name", mutate("<AMPSConfig>\n  <Name>amps-1</Name>\n", "<AMPSConfig>" + MARK + "\n"), "<Name>"),
    (
        "missing Storage",
        mutate("<AMPSConfig>\n", "<AMPSConfig>" + MARK + "\n").replace(
            "  <Storage>file:///var/lib/replication/amps-1</Storage>\n", ""
        ),
        "<Storage>",
    ),
    ("duplicate Storage", mutate("/amps-1</Storage>\n", "/amps-1</Storage>\n  <Storage>/other</Storage>" + MARK + "\n"),
     "<Storage>"),
    ("bad SyncType", mutate("<SyncType>async</SyncType>\n      <Compression>",
                            "<SyncType>snyc</SyncType>" + MARK + "\n      <Compression>"), "'snyc'"),
    (
        "bad MessageType",
        mutate("<Topic><Name>.*</Name><MessageType>json</MessageType></Topic>\n  </TransactionLog>",
               "<Topic><Name>.*</Name><MessageType>jsno</MessageType></Topic>" + MARK + "\n  </TransactionLog>"),
        "'jsno'",
    ),
    ("bad PassThrough regex", mutate("<PassThrough>.*</PassThrough>", "<PassThrough>(DC-[0-9</PassThrough>" + MARK),
     "'(DC-[0-9'"),
    (
        "bad topic regex",
        mutate("<Name>^/orders/</Name>", "<Name>^/orders/(*</Name>" + MARK),
        "'^/orders/(*'",
    ),
    (
        "excluding queue",
        mutate("<ExcludeValidation>replicate,cascade</ExcludeValidation>",
               "<ExcludeValidation>replicate,queue</ExcludeValidation>" + MARK),
        "'queue' cannot be excluded",
    ),
    (
        "unknown validation check",
        mutate("<ExcludeValidation>replicate,cascade</ExcludeValidation>",
               "<ExcludeValidation>replicate,cascde</ExcludeValidation>" + MARK),
        "'cascde'",
    ),
    ("duplicate destination", mutate("<Name>amps-3</Name>", "<Name>amps-2</Name>" + MARK), "'amps-2'"),
    ("destination is the instance", mutate("<Name>amps-3</Name>", "<Name>amps-1</Name>" + MARK), "'amps-1'"),
    (
        "destination without InetAddr",
        mutate("<Transport><Type>amps-replication</Type><InetAddr>file:///var/lib/replication/amps-3/</InetAddr></Transport>",
               "<Transport><Type>amps-replication</Type></Transport>" + MARK),
        "<InetAddr>",
    ),
    (
        "destination at a host:port",
        mutate("<InetAddr>file:///var/lib/replication/amps-2b</InetAddr>", "<InetAddr>amps-2:10005</InetAddr>" + MARK),
        "'amps-2:10005'",
    ),
    ("undefined variable", mutate("<Group>DataCenter-NYC-1</Group>\n  <Storage>",
                                  "<Group>${NO_SUCH_GROUP_VAR}</Group>" + MARK + "\n  <Storage>"), "NO_SUCH_GROUP_VAR"),
    ("XML syntax error",
     mutate("\n  <Group>DataCenter-NYC-1</Group>\n", "\n  <Group>DataCenter-NYC-1</Grop>" + MARK + "\n"), "Grop"),
    ("bare ampersand", mutate("<Filter>/qty &gt; 100</Filter>", "<Filter>/a = 1 && /b = 2</Filter>" + MARK), "&amp;"),
    (
        "DOCTYPE with entity",
        mutate('<?xml version="1.0" encoding="UTF-8"?>\n',
               '<?xml version="1.0" encoding="UTF-8"?>\n<!DOCTYPE AMPSConfig [<!ENTITY x "y">]>' + MARK + "\n"),
        "DOCTYPE",
    ),
    (
        "non-numeric MaxOffsetsPerTrigger",
        mutate("<MaxOffsetsPerTrigger>50000</MaxOffsetsPerTrigger>",
               "<MaxOffsetsPerTrigger>lots</MaxOffsetsPerTrigger>" + MARK),
        "'lots'",
    ),
    ("bad interval unit", mutate("<Age>300s</Age>", "<Age>300x</Age>" + MARK), "'300x'"),
    ("bad transport Type", mutate("<Type>kafka</Type>", "<Type>kafak</Type>" + MARK), "'kafak'"),
    ("bad Compression", mutate("<Compression>lz4</Compression>", "<Compression>zlib</Compression>" + MARK), "'zlib'"),
    ("Kafka topic with a slash", mutate("<Topic>amps-1.publish</Topic>", "<Topic>/orders</Topic>" + MARK), "'/orders'"),
    ("unknown action module", mutate("amps-action-do-upgrade-replication</Module>",
                                     "amps-action-do-upgrade-replicaton</Module>" + MARK),
     "'amps-action-do-upgrade-replicaton'"),
    ("bad DataType", mutate("<DataType>sow,txlog</DataType>", "<DataType>sow,log</DataType>" + MARK), "'log'"),
    ("a second downgrade action", mutate("    </Action>\n  </Actions>", "    </Action>\n    <Action>\n"
                                         "      <On><Module>amps-action-on-schedule</Module><Options><Every>1s</Every>"
                                         "</Options></On>\n      <Do><Module>amps-action-do-downgrade-replication"
                                         "</Module><Options><Age>5s</Age></Options></Do>" + MARK + "\n    </Action>\n"
                                         "  </Actions>"),
     "keep one <Do><Module>amps-action-do-downgrade-replication</Module></Do>"),
    (
        "bootstrap without a transaction log",
        """<AMPSConfig>
  <Name>a</Name>
  <Storage>/s</Storage>
  <Transports><Transport><Name>r</Name><Type>amps-replication</Type></Transport></Transports>
  <Bootstrap>""" + MARK + """
    <Topic><Name>.*</Name><MessageType>json</MessageType></Topic>
    <Transport><Type>amps-replication</Type><InetAddr>/src</InetAddr></Transport>
  </Bootstrap>
</AMPSConfig>""",
        "<TransactionLog>",
    ),
    ("attribute",
     mutate("    <Destination>\n      <Name>amps-3", '    <Destination id="3">' + MARK + "\n      <Name>amps-3"),
     "id='3'"),
    (
        "destination with neither Name nor Group",
        mutate("    <Destination>\n      <Name>amps-3</Name>\n", "    <Destination>" + MARK + "\n"),
        "needs a <Name> or a <Group>",
    ),
    (
        "a nameless destination whose group cannot name it",
        mutate("      <Group>Archive</Group>", "      <Group>Archive NYC</Group>" + MARK),
        "add a <Name>",
    ),
    (
        "a nameless destination whose group is another destination's name",
        mutate("      <Group>Archive</Group>", "      <Group>amps-3</Group>" + MARK),
        "named by its <Group>",
    ),
    (
        "MinimumSyncDestinations in the downgrade action",
        mutate("<Age>300s</Age><GracePeriod>1m</GracePeriod>",
               "<Age>300s</Age><MinimumSyncDestinations>1</MinimumSyncDestinations>" + MARK),
        "<Tuning><MinimumSyncDestinations>1</MinimumSyncDestinations></Tuning>",
    ),
    (
        "incoming replication address not the storage",
        mutate("      <InetAddr>file:///var/lib/replication/amps-1</InetAddr>",
               "      <InetAddr>file:///var/lib/replication/elsewhere</InetAddr>" + MARK),
        "not supported yet",
    ),
    (
        "remote storage",
        mutate("<Storage>file:///var/lib/replication/amps-1</Storage>",
               "<Storage>gs://bucket/amps-1/</Storage>" + MARK),
        "gs:// locations are not supported yet",
    ),
    (
        "remote destination address",
        mutate("<InetAddr>file:///var/lib/replication/amps-3/</InetAddr>",
               "<InetAddr>abfss://c@acct.dfs.core.windows.net/amps-3</InetAddr>" + MARK),
        "file:///absolute/path",
    ),
]


@pytest.mark.parametrize("text, value", [(t, v) for _, t, v in BAD], ids=[i for i, _, _ in BAD])
def test_malformed_config_names_file_line_value_and_fix(tmp_path, monkeypatch, text, value):
    monkeypatch.delenv("NO_SUCH_GROUP_VAR", raising=False)
    path = write(tmp_path, text)
    line = marked_line(text)

    with pytest.raises(ConfigError) as info:
        load(str(path))

    err = info.value
    message = str(err)
    assert err.file == str(path)
    assert err.line == line, message
    assert message.startswith(f"{path}:{line}: "), message
    assert "Fix: " in message, message
    assert value in message, message


def test_unknown_element_lists_the_allowed_names(tmp_path):
    text = BAD[0][1]
    with pytest.raises(ConfigError) as info:
        load(str(write(tmp_path, text)))
    assert "AMPSConfig/Colour" in str(info.value)
    assert "allowed here: Name, Group, Storage, Transports" in str(info.value)


def test_error_names_the_element_path(tmp_path):
    text = mutate("<SyncType>async</SyncType>\n      <Compression>", "<SyncType>snyc</SyncType>\n      <Compression>")
    with pytest.raises(ConfigError, match=r"AMPSConfig/Replication/Destination\[2\]/SyncType: 'snyc'.*"
                                          r"valid values are: sync, async"):
        load(str(write(tmp_path, text)))


def test_bad_filter_is_a_config_error_with_its_position(tmp_path):
    text = mutate("<Filter>/qty &gt; 100</Filter>", "<Filter>/qty &gt; &gt; 100</Filter>" + MARK)
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load(str(path))
    assert info.value.line == marked_line(text)
    assert "position" in str(info.value) and "'/qty > > 100'" in str(info.value) and "Fix: " in str(info.value)


def test_missing_file(tmp_path):
    path = tmp_path / "nope.xml"
    with pytest.raises(ConfigError, match="config file not found") as info:
        load(str(path))
    assert info.value.file == str(path) and str(info.value).startswith(str(path))


def test_config_error_pickles(tmp_path):
    import pickle

    with pytest.raises(ConfigError) as info:
        load(str(write(tmp_path, BAD[5][1])))
    copy = pickle.loads(pickle.dumps(info.value))
    assert (str(copy), copy.file, copy.line) == (str(info.value), info.value.file, info.value.line)


# ---------------------------------------------------------------------------
# python -m replication.config_check


def run_check(*files: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "NO_SUCH_GROUP_VAR"}
    return subprocess.run(
        [sys.executable, "-m", "replication.config_check", *map(str, files)],
        capture_output=True, text=True, cwd=REPO, env=env, timeout=60,
    )


def test_config_check_ok(tmp_path):
    path = write(tmp_path, FULL)
    result = run_check(path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"{path}: OK (instance amps-1)"


@pytest.mark.parametrize("case", ["XML syntax error", "undefined variable", "DOCTYPE with entity", "bad SyncType"])
def test_config_check_bad_file_prints_no_traceback(tmp_path, case):
    text = next(t for i, t, _ in BAD if i == case)
    path = write(tmp_path, text)
    result = run_check(path)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr + result.stdout
    assert result.stderr.startswith(f"{path}:{marked_line(text)}: ")
    assert "Fix: " in result.stderr


@pytest.mark.parametrize("message_type", ["xml", "binary"])
def test_config_check_refuses_a_filter_on_a_topic_whose_messages_have_no_fields(tmp_path, message_type):
    """A content filter is parsed and checked at load: a destination <Topic> of a type it cannot read is
    a config error naming the file and the <Filter>'s line, not a link that would retry for ever."""
    text = mutate(
        "<MessageType>json</MessageType>\n        <Filter>/qty &gt; 100</Filter>",
        f"<MessageType>{message_type}</MessageType>\n        <Filter>/qty &gt; 100</Filter>" + MARK,
    )
    path = write(tmp_path, text)
    result = run_check(path)
    assert result.returncode == 2 and "Traceback" not in result.stderr + result.stdout
    assert result.stderr.startswith(
        f"{path}:{marked_line(text)}: AMPSConfig/Replication/Destination[1]/Topic[1]/Filter: ")
    assert f"a <Filter> on {message_type} messages cannot be applied" in result.stderr
    assert "Fix: remove the <Filter>, or filter a topic whose <MessageType> is json" in result.stderr


def test_config_check_missing_file(tmp_path):
    result = run_check(tmp_path / "absent.xml")
    assert result.returncode == 2 and "not found" in result.stderr and "Traceback" not in result.stderr


# ---------------------------------------------------------------------------
# XSD


@pytest.fixture(scope="module")
def schema() -> etree.XMLSchema:
    return etree.XMLSchema(etree.parse(str(XSD)))


SHIPPED = sorted(glob.glob(str(REPO / "conf" / "*.xml")))


@pytest.mark.parametrize("path", SHIPPED, ids=[os.path.basename(p) for p in SHIPPED])
def test_shipped_configs_match_the_xsd_and_parse(schema, path):
    assert schema.validate(etree.parse(path)), schema.error_log
    load(path)


def test_fixture_matches_the_xsd(schema):
    assert schema.validate(etree.fromstring(FULL.encode())), schema.error_log


def test_xsd_refuses_a_bad_enum_and_an_unknown_element(schema):
    assert not schema.validate(
        etree.fromstring(mutate("<SyncType>sync</SyncType>", "<SyncType>snyc</SyncType>").encode()))
    assert not schema.validate(etree.fromstring(BAD[0][1].encode()))


# ---------------------------------------------------------------------------
# Effective config (_control/instance.json)


def test_effective_config_round_trips_exactly(tmp_path):
    cfg = load(str(write(tmp_path, FULL)))

    data = effective_config.to_dict(cfg)
    back = effective_config.from_dict(json.loads(json.dumps(data)))

    assert data["format"] == 1
    assert back == cfg
    assert effective_config.to_dict(back) == data  # sources (file, line) survive too
    assert back.destinations[0].source == cfg.destinations[0].source


def test_effective_config_write_is_atomic_and_readable(tmp_path):
    cfg = load(str(write(tmp_path, FULL)))
    target = tmp_path / "root" / "_control" / "instance.json"

    write_instance_config(cfg, target)
    write_instance_config(cfg, target)  # replaces in place

    assert read_instance_config(target) == cfg
    assert json.loads(target.read_text())["name"] == "amps-1"
    assert sorted(p.name for p in target.parent.iterdir()) == ["instance.json"]


def test_effective_config_refuses_another_format():
    with pytest.raises(ValueError, match="format 2"):
        effective_config.from_dict({"format": 2, "name": "a"})
    with pytest.raises(ValueError, match="instance.storage is missing"):
        effective_config.from_dict({"format": 1, "name": "a", "group": "a"})


# ---------------------------------------------------------------------------
# Secure, predictable XML handling


def test_external_entity_is_refused_without_reading_it(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP-SECRET")
    text = (
        f'<!DOCTYPE AMPSConfig [<!ENTITY xxe SYSTEM "file://{secret}">]>\n'
        "<AMPSConfig><Name>&xxe;</Name><Storage>/s</Storage></AMPSConfig>"
    )
    with pytest.raises(ConfigError, match="DOCTYPE") as info:
        load(str(write(tmp_path, text)))
    assert info.value.line == 1 and "TOP-SECRET" not in str(info.value)


def test_cdata_and_comments_inside_values():
    cfg = parse_string(
        """<AMPSConfig><Name>amps<!-- the first -->-1</Name><Storage>/s</Storage>
        <TransactionLog><Topic><Name>.*</Name><MessageType>json</MessageType></Topic></TransactionLog>
        <Replication><Destination><Name>b</Name><SyncType>async</SyncType>
          <Topic><Name>.*</Name><MessageType>json</MessageType><Filter><![CDATA[/qty > 100]]></Filter></Topic>
          <Transport><Type>amps-replication</Type><InetAddr>/b</InetAddr></Transport>
        </Destination></Replication></AMPSConfig>"""
    )
    assert cfg.name == "amps-1"
    assert cfg.destinations[0].topics[0].filter.text == "/qty > 100"


# ---------------------------------------------------------------------------
# SOW topics


def sow_config(topic_xml: str) -> str:
    return f"""<AMPSConfig><Name>a</Name><Storage>/s</Storage>
    <TransactionLog><Topic><Name>.*</Name><MessageType>json</MessageType></Topic></TransactionLog>
    <SOW>{topic_xml}</SOW></AMPSConfig>"""


def test_sow_topics_keyed_composite_keyless_and_their_compaction_interval():
    cfg = parse_string(sow_config(
        "<Topic><Name>/orders</Name><MessageType>json</MessageType><Key>/region</Key><Key>/order/id</Key>"
        "<CompactionInterval>30s</CompactionInterval></Topic>"
        "<Topic><Name>/quotes</Name><MessageType>fix</MessageType><Key>/55</Key></Topic>"
        "<Topic><Name>/blobs</Name><MessageType>binary</MessageType></Topic>"))
    orders, quotes, blobs = cfg.sow_topics
    assert (orders.keys, orders.key_paths, orders.compaction_interval) == (
        ("/region", "/order/id"), (("region",), ("order", "id")), 30.0)
    assert (quotes.keys, quotes.compaction_interval) == (("/55",), 5.0)
    assert blobs.keys == (), "no <Key>: each message names its key in amps-sow-key"


@pytest.mark.parametrize("topic_xml,problem,fix", [
    ("<Topic><Name>/x</Name><MessageType>xml</MessageType><Key>/id</Key></Topic>",
     "a <Key> on xml messages cannot be read", "remove the <Key> elements"),
    ("<Topic><Name>/x</Name><MessageType>fix</MessageType><Key>/55/1</Key></Topic>",
     "'/55/1' is a nested path, but fix fields are flat", "<Key>/55</Key>"),
    ("<Topic><Name>/x</Name><MessageType>json</MessageType><Key>id</Key></Topic>",
     "'id' is not a SOW key path", "<Key>/id</Key>"),
    ("<Topic><Name>/x</Name><MessageType>json</MessageType><Key>/id</Key><Key>/id</Key></Topic>",
     "key '/id' is listed twice", "list each <Key> once"),
])
def test_a_sow_key_that_cannot_be_read_is_a_config_error(topic_xml, problem, fix):
    with pytest.raises(ConfigError) as info:
        parse_string(sow_config(topic_xml), filename="c.xml")
    assert problem in str(info.value) and fix in str(info.value) and str(info.value).startswith("c.xml:")


def test_filters_read_fix_and_nvfix_fields():
    cfg = parse_string("""<AMPSConfig><Name>a</Name><Storage>/s</Storage>
      <TransactionLog><Topic><Name>.*</Name><MessageType>fix</MessageType></Topic></TransactionLog>
      <Replication><Destination><Name>b</Name><SyncType>async</SyncType>
        <Topic><Name>.*</Name><MessageType>fix</MessageType><Filter>/55 = 'IBM'</Filter></Topic>
        <Transport><Type>amps-replication</Type><InetAddr>/b</InetAddr></Transport>
      </Destination></Replication></AMPSConfig>""")
    assert cfg.destinations[0].topics[0].filter.matches(b"55=IBM\x01", "fix")


def test_storage_on_s3_loads_for_an_instance_that_ingests_and_replicates_and_refuses_what_is_not_built_yet():
    from replication.config.parser import parse_string

    plain = """<AMPSConfig><Name>amps-1</Name><Storage>{storage}</Storage><Transports>
<Transport><Name>k</Name><Type>kafka</Type><InetAddr>localhost:9092</InetAddr><Topic>amps-1.publish</Topic>
<MessageType>json</MessageType></Transport>{inbox}</Transports>
<TransactionLog><Topic><Name>.*</Name><MessageType>json</MessageType></Topic></TransactionLog>{more}</AMPSConfig>"""
    cfg = parse_string(plain.format(storage="s3a://bkt/fabric/amps-1/", inbox="", more=""), filename="a.xml")
    assert cfg.storage == "s3://bkt/fabric/amps-1"
    from replication import backfill

    # (a backfill into an instance on S3 is built: refused here only for the incoming transport it lacks)
    with pytest.raises(ReplicationError, match=r"amps-1 has no incoming amps-replication transport"):
        backfill.check(cfg, backfill.Options("loader", "parquet", topic="/orders"))
    with pytest.raises(ConfigError, match=r"a.xml:1: AMPSConfig/Storage: 's3:///fabric' is not an S3 prefix\. "
                                          r"Fix: write s3://BUCKET/PREFIX"):
        parse_string(plain.format(storage="s3:///fabric", inbox="", more=""), filename="a.xml")
    inbox = "\n<Transport><Name>amps-replication</Name><Type>amps-replication</Type></Transport>"
    replication = ("<Replication><Destination><Name>b</Name><SyncType>sync</SyncType><Topic><Name>.*</Name>"
                   "<MessageType>json</MessageType></Topic><Transport><Type>amps-replication</Type>"
                   "<InetAddr>s3a://bkt/b/</InetAddr><InetAddr>/mnt/b</InetAddr></Transport></Destination>"
                   "</Replication>")
    cfg = parse_string(plain.format(storage="s3://bkt/a", inbox=inbox, more=replication), filename="a.xml")
    assert cfg.replication_transport.inet_addr == "s3://bkt/a"
    assert cfg.destinations[0].inet_addrs == ("s3://bkt/b", "/mnt/b")  # a fabric may span a bucket and a mount
    with pytest.raises(ConfigError, match=r"a\.xml:5: .*'s3://bkt/a' is this instance's own storage"):
        parse_string(plain.format(storage="s3://bkt/a", inbox=inbox, more=replication.replace("s3a://bkt/b/",
                                                                                          "s3://bkt/a")),
                     filename="a.xml")
    sow = "\n<SOW><Topic><Name>/o</Name><MessageType>json</MessageType><Key>/id</Key></Topic></SOW>"
    assert parse_string(plain.format(storage="s3://bkt/a", inbox="", more=sow), filename="a.xml").sow_topics
