"""Named crash points for tests of crash safety (off unless the environment asks).

``REPLICATION_FAILPOINTS="ingest.after_txlog_commit@3"`` kills the whole process
group with SIGKILL the 3rd time that point is reached: the same as pulling the
plug at that step, including the Spark JVM. Several points: comma-separated.
"""

from __future__ import annotations

import os
import signal
import sys
import threading

_counts: dict[str, int] = {}
_lock = threading.Lock()


def _armed() -> dict[str, int]:
    spec = os.environ.get("REPLICATION_FAILPOINTS", "")
    armed: dict[str, int] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, _, nth = item.partition("@")
        armed[name] = int(nth or 1)
    return armed


_ARMED = _armed()


def hit(name: str) -> None:
    """Count a pass through ``name``; die here if the environment armed it for this pass."""
    if not _ARMED:
        return
    with _lock:
        _counts[name] = _counts.get(name, 0) + 1
        if _ARMED.get(name) != _counts[name]:
            return
    sys.stderr.write(f"failpoint {name} reached (pass {_counts[name]}): killing the process group\n")
    sys.stderr.flush()
    os.killpg(os.getpgrp(), signal.SIGKILL)
