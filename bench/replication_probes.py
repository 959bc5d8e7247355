"""What ``bench/replicate.py`` watches during a run: the engine's driver steps by instance role, CPU by
process kind, and when each message reached each step of its path."""

from __future__ import annotations

import functools
import os
import time
from collections import defaultdict
from collections.abc import Callable

from timing import Labeler, PhaseTimer, process_tree

# -- stage timing ------------------------------------------------------------------

class StageTimer(PhaseTimer):
    """Wall time of engine functions, summed per label, while :meth:`patched` is active.

    Labels name the instance's role (``A``, ``B``, ``A->B``), found from the
    call's arguments, so several instances in one process are told apart.
    The patches are on classes and modules: they must be in place before the
    instances start (some methods are bound once, at start).
    """

    def __init__(self) -> None:
        super().__init__()
        self.roles: dict[str, str] = {}

    def role(self, name: str) -> str:
        return self.roles.get(name, name)


def stage_targets(timer: StageTimer) -> list[tuple[object, str, Labeler]]:
    """The driver-side steps of ingest, replication and durability (see the engine modules' docstrings).

    Labels are ``<group> / <step>``; a group's total is its ``foreachBatch``
    (or release) call, the steps run inside it.
    """
    from replication.connectors.delta.tables import IdempotentAppender
    from replication.destination import manager, replicator
    from replication.destination.link import Link
    from replication.durability import AckSender, Durability
    from replication.ingest import inputs, writer
    from replication.storage.control import Ack, DurableState, LinkState
    from replication.txlog.publishers import PublisherState

    r = timer.role

    def link_of(link: Link) -> str:  # <upstream root>/_control/links/<destination>.json
        return f"{r(up(link.path, 3).name)}->{r(link.state.destination)}"

    def appended(appender: IdempotentAppender, *_a, **_k) -> str:
        if appender.app_id.split(":")[0] == "ingest":
            return f"{r(appender.path.parent.name)} ingest commit / {appender.path.name} append"
        upstream, _, downstream = appender.app_id.partition("#")[0].partition("->")
        return f"{r(upstream)}->{r(downstream)} replicator / inbox append"

    def control_file(group: str) -> Labeler:
        def label(_file, path, *_a, **_k) -> str:  # <root>/_control/<file>
            root = up(path, 2) if path.parent.name == "_control" else up(path, 3)
            kind = path.name if path.parent.name == "_control" else f"{path.parent.name}/*.json"
            return f"{r(root.name)} {group} / write {kind}"
        return label

    return [
        (writer.IngestWriter, "__call__", lambda w, *_a: f"{r(w.cfg.name)} ingest"),
        (writer.IngestWriter, "wait_for_commit",
         lambda w, *_a: f"{r(w.cfg.name)} ingest / waiting for the last batch's commit"),
        # (each batch is committed on a thread of its own, beside Spark's work on the next: a group of its own)
        (writer.IngestWriter, "write_arrow", lambda w, *_a: f"{r(w.cfg.name)} ingest commit"),
        (writer, "classify", lambda *_a, instance, **_k: f"{r(instance)} ingest commit / classify"),
        (inputs.InboxRows, "__call__", lambda x, *_a: f"{r(x.instance)} ingest commit / inbox rows (read_versions)"),
        (IdempotentAppender, "append", appended),
        (PublisherState, "save", lambda _s, path: f"{r(up(path, 2).name)} heartbeat / write publishers.json"),
        (Durability, "on_commit", lambda d, *_a: f"{r(d._layout.root.name)} ingest commit / durability on_commit"),
        (Durability, "release", lambda d, *_a: f"{r(d._layout.root.name)} durability release"),
        (AckSender, "send", lambda s, *_a: f"{r(s.instance)} durability release / persisted acks (Kafka send+flush)"),
        (DurableState, "write", control_file("durability release")),
        (Ack, "write", control_file("durability release")),
        (replicator.Replicator, "_replicate",
         lambda w, *_a: f"{r(w.cfg.name)}->{r(w.dest.name)} replicator"),
        (replicator.Replicator, "_inbox_rows",
         lambda w, *_a: f"{r(w.cfg.name)}->{r(w.dest.name)} replicator / inbox rows"),
        (Link, "on_sent", lambda link, *_a: f"{link_of(link)} replicator / link on_sent (link file)"),
        (manager, "read_ack",
         lambda layout, upstream: f"{r(upstream)}->{r(layout.root.name)} ack watch / read ack file"),
        (Link, "on_ack", lambda link, *_a: f"{link_of(link)} ack watch / link on_ack"),
        (LinkState, "write", control_file("link")),
    ]


def up(path, levels: int):
    """``path``'s ancestor ``levels`` up (a local path or a key in a bucket, which has no ``parents``)."""
    for _ in range(levels):
        path = path.parent
    return path


# -- CPU by process ------------------------------------------------------------------

SOURCE_RUNNERS = "Spark source runners (latestOffset...)"
PYTHON_WORKERS = "Spark Python workers (reads)"
BROKER = "broker (Kafka)"
SPARK_JVM = "JVM (Spark)"
#: Process kinds by a fragment of their command line, in the order they are matched.
PROCESS_KINDS = (
    ("python_streaming_source_runner", SOURCE_RUNNERS),
    ("pyspark.daemon", PYTHON_WORKERS),
    ("kafka.Kafka", BROKER),
    ("connect.mirror.MirrorMaker", "MirrorMaker 2"),
    ("replication.connectors.s3.server", "S3 server (moto, --storage s3)"),
    ("java", SPARK_JVM),
    ("multiprocessing", "publisher process"),
)
DRIVER = "driver (Python: foreachBatch, durability, acks)"
PUBLISHER = PROCESS_KINDS[-1][1]
#: The kinds that are the instances' own processes (their Spark application): the idle target's scope.
INSTANCE_KINDS = (DRIVER, SPARK_JVM, SOURCE_RUNNERS, PYTHON_WORKERS)


def cpu_by_kind() -> dict[str, float]:
    """CPU seconds (user + system) so far of this process and its descendants, summed by kind.

    A process that ended and was waited for counts in its parent's
    ``cutime``/``cstime``: with its parent's kind (a JVM's ``chmod`` and
    ``readlink`` helpers), or as the publisher for this process (the only
    child it waits for during a run).
    """
    out: dict[str, float] = defaultdict(float)
    for pid, cpu in process_tree(commands=True).items():
        if pid == os.getpid():
            out[DRIVER] += cpu.own
            out[PUBLISHER] += cpu.ended
            continue
        kind = next((name for fragment, name in PROCESS_KINDS if fragment in cpu.command), "other")
        out[kind] += cpu.own + cpu.ended
    return out


def cpu_since(before: dict[str, float]) -> dict[str, float]:
    """CPU seconds by kind spent since ``before`` (a :func:`cpu_by_kind`), kinds that spent any."""
    spent = {k: v - before.get(k, 0.0) for k, v in cpu_by_kind().items()}
    return {k: v for k, v in spent.items() if v > 0.005}


# -- latency -------------------------------------------------------------------------


class Milestones:
    """When each step covered each seq: per step, events (highest seq covered, wall time).

    Events come from hooks on one instance's own attributes (so no other
    instance is seen), or are added to :attr:`events` directly.
    """

    def __init__(self) -> None:
        self.events: dict[str, list[tuple[int, float]]] = defaultdict(list)

    def hook(self, owner: object, attr: str, *, before: str | None = None, after: str | None = None,
             seq: Callable[..., int]) -> None:
        """Record ``seq(*args)`` with the time just before (``before``) and/or after (``after``) each call."""
        fn = getattr(owner, attr)

        @functools.wraps(fn)
        def recorded(*args, **kwargs):
            if before:
                self.events[before].append((seq(*args, **kwargs), time.time()))
            out = fn(*args, **kwargs)
            if after:
                self.events[after].append((seq(*args, **kwargs), time.time()))
            return out

        setattr(owner, attr, recorded)

    def reached(self, step: str, seqs):
        """Wall time at which ``step`` first covered each of ``seqs`` (NaN: never)."""
        import numpy as np

        events = sorted(self.events.get(step, []), key=lambda e: e[1])
        if not events:
            return np.full(len(seqs), np.nan)
        covered = np.maximum.accumulate(np.array([e[0] for e in events], dtype=np.int64))
        times = np.array([e[1] for e in events])
        i = np.searchsorted(covered, np.asarray(seqs, dtype=np.int64), side="left")
        return np.where(i < len(times), times[np.minimum(i, len(times) - 1)], np.nan)


#: The path of one message, in order: (step, what reaches it).
LATENCY_STEPS = (
    ("A txlog commit", "A ingest committed the message"),
    ("B inbox commit", "A->B replicator appended it to B's inbox"),
    ("B txlog commit", "B ingest committed it"),
    ("B ack file", "B wrote its ack to A (_control/acks/A.json)"),
    ("A reads ack", "A's ack watcher read that file (every 20 ms on disk, 100 ms on S3, while rows wait)"),
    ("publisher ack", "the persisted ack reached the Publisher"),
)
