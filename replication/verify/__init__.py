"""Does a fabric hold what its routing rules and acknowledgements promise? The checks of ``replication verify``.

Reads tables and control files only, so it runs beside running instances. For
every link among the given configs (an upstream's destination, as its link
file says: the instance reached at the address in use and the upstream seq it
has acknowledged), it takes the upstream's txlog rows up to that acknowledged
position, keeps those the routing rules send to that instance (the engine's
own rules) and looks them up, by bookmark, in the downstream's txlog:

- **missing**: an acknowledged message the downstream does not hold, listed
  per publisher as ranges of ``publisher_seq``;
- **body**: the same bookmark with a different body on the two sides.

For two instances of one ``<Group>`` that replicate to each other it also
compares the bookmarks of the topics each replicates to the other (whatever
the filters and PassThrough say: instances of one group are meant to be
equivalent), each side up to what its link to the other has acknowledged:
**group** findings name what one holds and the other lacks, leaving out
messages still on their way to it over another link. And it compares their
SOWs key by key (**sow** findings, :mod:`replication.verify.sow`). For every
queue of every instance it checks that no message was acknowledged twice
(**queue** findings, :mod:`replication.verify.queues`).

Rows past an acknowledged position are never compared (they may be in
flight), so a running fabric verifies clean. A link never connected, or to an
instance whose config is not given, is listed as not checked.

The txlogs are read with deltalake and joined in Arrow in this process
(:mod:`replication.verify.arrow`) unless together they are larger than
:data:`ARROW_MAX_BYTES`; then Spark does the joins
(:mod:`replication.verify.spark`) and only findings reach the driver.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Literal, Protocol

from replication import routing
from replication.config.fabric import Fabric
from replication.config.model import Destination, InstanceConfig
from replication.storage.control import LinkState
from replication.storage.layout import StorageLayout
from replication.verify.queues import check_queues
from replication.verify.report import Compared, Finding, Outcome, Report, count, listed, ranges_text
from replication.verify.sow import compare_sows

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: Compressed txlog bytes (all instances together) up to which ``auto`` compares in this process.
ARROW_MAX_BYTES = 256 << 20

Engine = Literal["auto", "arrow", "spark"]


class Txlogs(Protocol):
    """What reads the txlogs and compares them (:class:`replication.verify.arrow.ArrowTxlogs`,
    :class:`replication.verify.spark.SparkTxlogs`)."""

    name: str

    def link(self, up: InstanceConfig, dest: Destination, down: str, acked: int) -> Outcome: ...

    def group(self, here: str, acked: int, there: str, shared: Callable[[str, str], bool],
              in_flight: list[tuple[str, int]]) -> Outcome: ...


def verify(fabric: Fabric, *, topic: str | None = None, engine: Engine = "auto",
           spark: SparkSession | None = None) -> Report:
    """Compare every link of ``fabric``, every group pair and their SOWs, up to each acknowledged position.

    Args:
        fabric: the configs, as :class:`replication.config.fabric.Fabric` reads them.
        topic: a regex; only messages (and SOW records) whose topic it matches (searched, as AMPS matches).
        engine: ``arrow`` (this process), ``spark``, or ``auto``: Spark when the txlogs together are larger
            than :data:`ARROW_MAX_BYTES`.
        spark: the session for the Spark engine (default: the active one, or a local one).
    """
    pattern = re.compile(topic) if topic is not None else None
    # Link states first, tables after: a row acknowledged now is in its destination's table when read.
    states = {(cfg.name, dest.name): LinkState.read(StorageLayout.of(cfg.storage).link_file(dest.name))
              for cfg in fabric for dest in cfg.destinations}
    logs = _txlogs(fabric, pattern, engine, spark)
    report = Report(engine=logs.name)
    used: dict[tuple[str, str], tuple[Destination, int]] = {}
    for cfg in fabric:
        for dest in cfg.destinations:
            compared = _check_link(fabric, logs, cfg, dest, states[(cfg.name, dest.name)])
            report.links.append(compared)
            if compared.downstream is not None and not compared.not_checked:
                used[(cfg.name, compared.downstream)] = (dest, compared.acked_seq)
    into: dict[str, list[tuple[str, int]]] = {}
    for (up, down), (_, acked) in used.items():
        into.setdefault(down, []).append((up, acked))
    for (a, b), (dest_ab, acked_ab) in used.items():
        if a < b and (b, a) in used and fabric[a].group == fabric[b].group:
            dest_ba, acked_ba = used[(b, a)]
            shared = _shared(dest_ab, dest_ba, pattern)
            report.groups.append(_check_group(logs, fabric[a], acked_ab, fabric[b], acked_ba, shared, into))
            report.sows.extend(compare_sows(fabric, fabric[a], fabric[b], shared, into))
    for cfg in fabric:
        report.queues.extend(check_queues(cfg))
    return report


def _txlogs(fabric: Fabric, pattern: re.Pattern[str] | None, engine: Engine,
            spark: SparkSession | None) -> Txlogs:
    if engine == "auto":
        engine = "spark" if _txlog_bytes(fabric) > ARROW_MAX_BYTES else "arrow"
    if engine == "arrow":
        from replication.verify.arrow import ArrowTxlogs

        return ArrowTxlogs(fabric, pattern)
    from replication.connectors.spark.session import session
    from replication.verify.spark import SparkTxlogs

    on_s3 = any(cfg.on_object_storage for cfg in fabric)  # (Spark reads those through S3A)
    return SparkTxlogs(fabric, pattern, spark or session("replication verify", object_storage=on_s3))


def _txlog_bytes(fabric: Fabric) -> int:
    """The compressed size of every readable txlog of ``fabric`` (from the Delta log, no data read)."""
    from replication.connectors.delta.tables import open_table

    total = 0
    for cfg in fabric:
        try:
            txlog = str(StorageLayout.of(cfg.storage).txlog)
            sizes = open_table(txlog).get_add_actions(flatten=True)
        except Exception:  # absent or unreadable: the comparison reports it
            continue
        total += sum(sizes.column("size_bytes").to_pylist())
    return total


def _check_link(fabric: Fabric, logs: Txlogs, cfg: InstanceConfig, dest: Destination,
                state: LinkState | None) -> Compared:
    if state is None or not state.downstream:
        return Compared(cfg.name, dest.name, None, not_checked="never connected")
    down = state.downstream
    compared = Compared(cfg.name, dest.name, down, acked_seq=state.acked_seq)
    if down not in fabric:
        compared.not_checked = f"{down}'s config is not among those given"
        return compared
    try:
        found = logs.link(cfg, dest, down, state.acked_seq)
    except Exception as exc:  # a table that cannot be read is a finding, not a crash of the whole check
        compared.findings.append(Finding("unreadable", cfg.name, down, dest.name, f"a txlog could not be read: {exc}"))
        return compared
    compared.messages = found.messages
    where = f"{cfg.name} -> {down} (destination {dest.name})"
    for publisher, ranges in found.missing.items():
        compared.findings.append(Finding(
            "missing", cfg.name, down, dest.name,
            f"{where}: {count(ranges)} acknowledged message(s) of publisher {publisher} missing at {down}: "
            f"publisher_seq {ranges_text(ranges)}", publisher=publisher, seq_ranges=ranges))
    if found.differ_count:
        compared.findings.append(Finding(
            "body", cfg.name, down, dest.name,
            f"{where}: {found.differ_count} message(s) with a different body at {down}: "
            f"bookmark {listed(found.differ, found.differ_count)}", bookmarks=found.differ))
    return compared


def _check_group(logs: Txlogs, a: InstanceConfig, acked_ab: int, b: InstanceConfig, acked_ba: int,
                 shared: Callable[[str, str], bool], into: dict[str, list[tuple[str, int]]]) -> Compared:
    """A and B, one group, replicating to each other: each holds what the other holds on those topics."""
    compared = Compared(a.name, None, b.name, acked_seq=min(acked_ab, acked_ba))
    for here, acked, there in ((a, acked_ab, b), (b, acked_ba, a)):
        in_flight = [(up, up_acked) for up, up_acked in into.get(there.name, []) if up != here.name]
        try:
            found = logs.group(here.name, acked, there.name, shared, in_flight)
        except Exception as exc:
            compared.findings.append(Finding("unreadable", a.name, b.name, None, f"a txlog could not be read: {exc}"))
            return compared
        compared.messages += found.messages
        for publisher, ranges in found.missing.items():
            compared.findings.append(Finding(
                "group", here.name, there.name, None,
                f"group {a.group}: {here.name} holds {count(ranges)} message(s) of publisher {publisher} on "
                f"topics the two replicate to each other that {there.name} lacks: publisher_seq "
                f"{ranges_text(ranges)}", publisher=publisher, seq_ranges=ranges))
    return compared


def _shared(one: Destination, other: Destination, pattern: re.Pattern[str] | None) -> Callable[[str, str], bool]:
    """Does each of the two destinations replicate (topic, message type), filters and PassThrough aside?"""
    answers: dict[tuple[str, str], bool] = {}

    def shared(topic: str, message_type: str) -> bool:
        key = (topic, message_type)
        if key not in answers:
            answers[key] = (pattern is None or pattern.search(topic) is not None) and all(
                any(t.message_type == message_type and routing.regex_matches(t.name, topic) for t in d.topics)
                for d in (one, other))
        return answers[key]

    return shared
