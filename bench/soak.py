"""Soak: the cascading mesh under continuous publishing while lower-tier instances are killed with kill -9.

The eight instances of ``conf/mesh`` run in three ``replication run`` processes
(each its own Spark application, in its own process group):

- ``incoming``: Incoming-A and Incoming-B (they take the publishes; never killed);
- ``side-A``: Live-A, Dev-A, Archive-A;  ``side-B``: Live-B, Dev-B, Archive-B.

Two HA publishers publish at a steady rate to Incoming-A and Incoming-B. About
every ``--kill-every`` seconds one of the two sides, chosen at random, is
killed with kill -9 (its JVM too) and started again at once: the mesh must
fail over to the other instance of each tier and resync the restarted ones.
At the end publishing stops and the run checks what it promises:

- every publisher has its persisted acks for everything it published;
- every message is in all eight txlogs exactly once, in publish order;
- ``replication verify`` finds nothing (each link holds what it acknowledged,
  the two instances of each group agree).

It prints what it survived (kills, restarts, messages, time to converge)
and exits 0 only when all holds::

    .venv/bin/python bench/soak.py --minutes 10
    .venv/bin/python bench/soak.py --minutes 60 --kill-every 20 --rate 100

``tests/test_soak.py`` runs a short variant (1 minute of publishing) in the suite.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MESH = REPO / "conf" / "mesh"
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import add_kafka_arguments, kafka_security, use_kafka_security  # noqa: E402

GROUPS = {
    "incoming": ("Incoming-A", "Incoming-B"),
    "side-A": ("Live-A", "Dev-A", "Archive-A"),
    "side-B": ("Live-B", "Dev-B", "Archive-B"),
}
KILLABLE = ("side-A", "side-B")
ALL = [name for names in GROUPS.values() for name in names]
#: Micro-batch trigger of the soak's processes: eight ingest queries and fourteen replicators on few cores.
TRIGGER = "250 milliseconds"


@dataclass
class SoakResult:
    minutes: float
    kills: list[tuple[float, str]] = field(default_factory=list)
    """(seconds into the run, group killed with kill -9 and restarted)."""
    published: dict[str, int] = field(default_factory=dict)
    acknowledged: dict[str, int] = field(default_factory=dict)
    converged_s: float | None = None
    """Seconds from the end of publishing until all eight txlogs held everything."""
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        lines = [f"soak: {self.minutes:g} min of publishing, {len(self.kills)} kill -9 + restart "
                 f"({', '.join(f'{g} at {t:.0f}s' for t, g in self.kills) or 'none'})",
                 f"  published {sum(self.published.values()):,} messages "
                 f"({', '.join(f'{c} {n:,}' for c, n in self.published.items())}), "
                 f"acknowledged {sum(self.acknowledged.values()):,}",
                 f"  all 8 txlogs complete {self.converged_s:.1f}s after publishing stopped"
                 if self.converged_s is not None else "  the txlogs did not converge"]
        lines += [f"  PROBLEM: {p}" for p in self.problems] or ["  every txlog exactly once; verify: consistent"]
        return "\n".join(lines)


class _Group:
    """One ``replication run`` process in its own process group (kill -9 takes its JVM too)."""

    def __init__(self, name: str, workdir: Path, env: dict[str, str], conf: Path = MESH) -> None:
        self.name, self.workdir, self.env, self.conf = name, workdir, env, conf
        self.starts = 0
        self.proc: subprocess.Popen | None = None
        self.start()

    def start(self) -> None:
        self.starts += 1
        log = open(self.workdir / f"{self.name}.{self.starts}.log", "wb")
        configs = [str(self.conf / f"{n}.xml") for n in GROUPS[self.name]]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "replication.cli", "run", *configs, "--trigger", TRIGGER, "--log-level", "WARNING"],
            stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True)
        log.close()

    def kill9(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=60)

    def signal_stop(self) -> None:
        """Ask for the clean stop (SIGTERM: the JVM ignores it, the driver stops); :meth:`stop` waits for it."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.signal_stop()
            try:
                self.proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.kill9()


def mesh_configs(workdir: Path) -> Path:
    """The mesh's configs: ``conf/mesh/`` itself, or, with ``--kafka-security``, copies whose Kafka transports
    carry its ``<Security>`` element."""
    from replication.config.security import security_xml

    element = security_xml(kafka_security())
    if not element:
        return MESH
    folder = workdir / "mesh-conf"
    folder.mkdir(parents=True, exist_ok=True)
    for name in ALL:
        text = (MESH / f"{name}.xml").read_text()
        topic = f"<Topic>{name}.publish</Topic>"  # (the Kafka transport of the tiers that have one)
        (folder / f"{name}.xml").write_text(text.replace(topic, topic + element, 1))
    return folder


def soak(workdir: Path, bootstrap: str, *, minutes: float, kill_every: float = 30.0, rate: float = 20.0,
         seed: int | None = None, say=print) -> SoakResult:
    """Run the soak with storage under ``workdir`` and the Kafka broker at ``bootstrap`` (with the benchmark's
    ``--kafka-security``, if given)."""
    from replication import config
    from replication.client import Publisher
    from replication.config.fabric import Fabric
    from replication.destination.resync import heartbeat_fresh
    from replication.storage.layout import StorageLayout
    from replication.verify import verify

    env = dict(os.environ, REPLICATION_HOME=str(workdir), KAFKA_BOOTSTRAP=bootstrap)
    env.pop("REPLICATION_FAILPOINTS", None)
    os.environ.update(REPLICATION_HOME=str(workdir), KAFKA_BOOTSTRAP=bootstrap)  # for the configs read here
    conf = mesh_configs(workdir)
    cfgs = {name: config.load(str(conf / f"{name}.xml")) for name in ALL}
    layouts = {name: StorageLayout.of(cfg.storage) for name, cfg in cfgs.items()}
    rng = random.Random(seed)
    result = SoakResult(minutes)

    def wait_running(names, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not all(heartbeat_fresh(layouts[n]) for n in names):
            if time.monotonic() > deadline:
                raise TimeoutError(f"not running after {timeout:.0f}s: "
                                   f"{[n for n in names if not heartbeat_fresh(layouts[n])]}")
            time.sleep(0.5)

    groups: dict[str, _Group] = {}
    pubs: list[Publisher] = []
    stop = threading.Event()
    try:
        for name in ("side-A", "side-B", "incoming"):  # all at once: an upper tier connects as a lower one starts
            groups[name] = _Group(name, workdir, env, conf)
        wait_running(ALL, timeout=300)
        say(f"mesh running ({', '.join(ALL)})")
        pubs = [Publisher(f"soak-{n}", bootstrap=bootstrap, topic=f"{n}.publish", instance=n,
                          store_path=workdir / f"soak-{n}.store", resend_after=10, logon_timeout=120,
                          security=kafka_security())
                for n in GROUPS["incoming"]]
        counts = {pub.name: 0 for pub in pubs}

        def publish(pub: Publisher) -> None:
            while not stop.wait(1.0 / rate):
                counts[pub.name] = pub.publish("/orders", json.dumps({"n": counts[pub.name], "qty": 7}).encode())

        threads = [threading.Thread(target=publish, args=(pub,), daemon=True) for pub in pubs]
        for t in threads:
            t.start()
        started = time.monotonic()
        end = started + minutes * 60
        # no kill in the last half interval: the last side restarted is up and resyncing when publishing ends
        last_kill = end - kill_every / 2
        while True:
            pause = kill_every * rng.uniform(0.7, 1.3)
            if time.monotonic() + pause > last_kill:
                time.sleep(max(0.0, end - time.monotonic()))
                break
            time.sleep(pause)
            victim = rng.choice(KILLABLE)
            groups[victim].kill9()
            groups[victim].start()
            result.kills.append((time.monotonic() - started, victim))
            say(f"{time.monotonic() - started:5.0f}s  kill -9 {victim} ({', '.join(GROUPS[victim])}) and restart")
        stop.set()
        for t in threads:
            t.join()
        stopped = time.monotonic()
        result.published = dict(counts)
        for pub in pubs:
            try:
                pub.flush(timeout=300)
            except TimeoutError:
                result.problems.append(f"{pub.name}: acks stopped at {pub.persisted_seq} of {counts[pub.name]}")
            result.acknowledged[pub.name] = pub.persisted_seq
        total = sum(counts.values())
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            held = {n: _rows(layouts[n]) for n in ALL}
            if all(h == total for h in held.values()):
                result.converged_s = time.monotonic() - stopped
                break
            time.sleep(1.0)
        else:
            result.problems.append(f"txlogs did not converge to {total}: {held}")
        for name in ALL:
            problem = _exactly_once(layouts[name], counts)
            if problem:
                result.problems.append(f"{name}: {problem}")
        report = verify(Fabric(cfgs.values()))
        result.problems += [f"verify: {f.message}" for f in report.findings]
    finally:
        stop.set()
        for pub in pubs:
            pub.close()
        for group in groups.values():  # (stopped together: each stop takes a few seconds)
            group.signal_stop()
        for group in groups.values():
            group.stop()
    return result


def _rows(layout) -> int:
    from deltalake import DeltaTable

    try:
        return DeltaTable(str(layout.txlog)).to_pyarrow_dataset().count_rows()
    except Exception:
        return -1


def _exactly_once(layout, counts: dict[str, int]) -> str | None:
    """None when the txlog holds each publisher's 1..N once, in order, with contiguous ``seq``; else what is off."""
    from deltalake import DeltaTable

    rows = DeltaTable(str(layout.txlog)).to_pyarrow_table(columns=["seq", "publisher", "publisher_seq"]).sort_by("seq")
    seqs = rows["seq"].to_pylist()
    if seqs != list(range(1, len(seqs) + 1)):
        return "seq is not contiguous from 1"
    for client, n in counts.items():
        got = [s for p, s in zip(rows["publisher"].to_pylist(), rows["publisher_seq"].to_pylist()) if p == client]
        if got != list(range(1, n + 1)):
            return f"{client}: {len(got)} rows, not exactly 1..{n} in order"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="minutes of publishing and killing (default 10)")
    parser.add_argument("--kill-every", type=float, default=30.0, help="seconds between kills, ±30%% (default 30)")
    parser.add_argument("--rate", type=float, default=20.0, help="messages per second per publisher (default 20)")
    parser.add_argument("--seed", type=int, default=None, help="random seed (which side is killed when)")
    add_kafka_arguments(parser, "Kafka bootstrap servers whose Incoming-A/B.publish topics are empty "
                                "(default: an embedded broker)")
    parser.add_argument("--workdir", default=None, help="storage root (default: a temporary directory)")
    args = parser.parse_args(argv)
    use_kafka_security(parser, args)
    from replication.connectors.kafka.broker import EmbeddedBroker

    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="soak-"))
    workdir.mkdir(parents=True, exist_ok=True)
    print(f"soak under {workdir}", flush=True)
    if args.bootstrap:
        result = soak(workdir, args.bootstrap, minutes=args.minutes, kill_every=args.kill_every, rate=args.rate,
                      seed=args.seed, say=lambda s: print(s, flush=True))
    else:
        with EmbeddedBroker() as broker:
            result = soak(workdir, broker.bootstrap, minutes=args.minutes, kill_every=args.kill_every,
                          rate=args.rate, seed=args.seed, say=lambda s: print(s, flush=True))
    print(result.summary(), flush=True)
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
