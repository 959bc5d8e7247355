"""Run instances in one Spark application until Ctrl-C or SIGTERM (to the process or its group), with progress."""

from __future__ import annotations

import logging
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence

from replication.config.model import InstanceConfig
from replication.connectors.spark.session import session
from replication.instance import Instance
from replication.storage.layout import StorageLayout

log = logging.getLogger(__name__)


def stop_on_sigterm(stop: threading.Event | None = None) -> threading.Event:
    """An event SIGTERM sets (in the main thread; elsewhere Python cannot take signals): the clean stop of
    :func:`run_until_stopped`, whether the signal came to this process alone or to its whole group (the
    JVM ignores it: :func:`replication.connectors.spark.session.session`)."""
    stop = stop or threading.Event()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
    return stop


def start_instances(configs: Sequence[InstanceConfig], *, trigger_interval: str = "0 seconds",
                    stop: threading.Event | None = None) -> list[Instance]:
    """Start an instance per config in one Spark application; ``stop`` set ends a wait for a bootstrap source."""
    for cfg in configs:  # (before Spark starts: a bucket that cannot be used is said in one line)
        StorageLayout.of(cfg.storage).check_reachable()
    spark = session("replication " + " ".join(c.name for c in configs),
                    object_storage=any(c.on_object_storage for c in configs))
    started: list[Instance] = []
    try:
        for cfg in configs:
            started.append(Instance(cfg, spark, trigger_interval=trigger_interval).start(stop))
    except BaseException:
        stop_instances(started)
        raise
    return started


def stop_instances(instances: Sequence[Instance]) -> None:
    for inst in reversed(instances):
        inst.stop()


def progress_line(instances: Sequence[Instance], previous: dict[str, tuple[float, int]]) -> str:
    """One line: per instance, local seq, rate, rejects, duplicates, durable position, and each link's progress."""
    parts = []
    now = time.monotonic()
    for inst in instances:
        st = inst.status()
        counters = st.counters
        last_t, last_seq = previous.get(inst.name, (now, st.max_seq))
        rate = (st.max_seq - last_seq) / (now - last_t) if now > last_t else 0.0
        previous[inst.name] = (now, st.max_seq)
        part = (
            f"{inst.name}: seq {st.max_seq:,} ({rate:,.0f} msg/s) "
            f"rejected {counters.get('rejected', 0):,} dup {counters.get('duplicates', 0):,} "
            f"durable {st.durable_seq:,}"
        )
        for dest, link in st.links.items():
            part += f" [->{dest} {link['state']} acked {link['acked_seq']:,} lag {link['lag_messages']:,}]"
        if st.error:
            part += f" ERROR {st.error}"
        parts.append(part)
    return " | ".join(parts)


def run_until_stopped(
    instances: Sequence[Instance],
    *,
    stop: threading.Event | None = None,
    interval: float = 1.0,
    out=None,
    until: Callable[[], bool] | None = None,
) -> None:
    """Print progress until Ctrl-C / SIGTERM, ``stop`` is set or ``until()`` is true.

    A failed query or replicator does not end the run: its instance restarts it (with back-off) and the
    progress line shows the error meanwhile. Exiting here instead raced with that restart, and took every
    instance of the process down with the one whose query had failed.
    """
    out = out or sys.stdout
    stop = stop_on_sigterm(stop)
    previous: dict[str, tuple[float, int]] = {}
    tty = out.isatty()
    try:
        while not stop.wait(interval):
            line = progress_line(instances, previous)
            out.write(("\r" + line + "\x1b[K") if tty else line + "\n")
            out.flush()
            if until is not None and until():
                break
    except KeyboardInterrupt:
        pass
    finally:
        if tty:
            out.write("\n")
        out.write("stopping...\n")
        out.flush()
        stop_instances(instances)
