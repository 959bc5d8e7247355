"""Named crash points for tests of crash safety (off unless the environment asks).

``REPLICATION_FAILPOINTS="ingest.after_txlog_commit@3"`` kills the whole process
group with SIGKILL the 3rd time that point is reached: the same as pulling the
plug at that step, including the Spark JVM. ``...@3:raise`` raises
:class:`FailpointError` there instead (a failure the process survives);
``...@3:pause`` waits :data:`PAUSE_S` there and goes on (a slow step: lets what
runs beside it get ahead).
Several points: comma-separated. In-process tests use :func:`arm`.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

#: How long a point armed with ``pause`` waits.
PAUSE_S = 1.5

_counts: dict[str, int] = {}
_lock = threading.Lock()


class FailpointError(RuntimeError):
    """Raised by a failpoint armed with ``:raise``."""


def _parse(spec: str) -> dict[str, tuple[int, str]]:
    armed: dict[str, tuple[int, str]] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, _, rest = item.partition("@")
        nth, _, action = rest.partition(":")
        armed[name] = (int(nth or 1), action or "kill")
    return armed


#: What is armed: from ``REPLICATION_FAILPOINTS`` at the first pass through any point, or :func:`arm`.
_armed: dict[str, tuple[int, str]] | None = None


def arm(spec: str) -> None:
    """Arm failpoints in this process (same syntax as the environment variable); counts restart."""
    global _armed
    with _lock:
        _armed = _parse(spec)
        _counts.clear()


def hit(name: str) -> None:
    """Count a pass through ``name``; fail here if armed for this pass."""
    global _armed
    if _armed is None:
        _armed = _parse(os.environ.get("REPLICATION_FAILPOINTS", ""))
    if not _armed:
        return
    with _lock:
        _counts[name] = _counts.get(name, 0) + 1
        nth, action = _armed.get(name, (0, ""))
        if nth != _counts[name]:
            return
    if action == "pause":
        time.sleep(PAUSE_S)
        return
    if action == "raise":
        raise FailpointError(f"failpoint {name} reached (pass {nth})")
    sys.stderr.write(f"failpoint {name} reached (pass {nth}): killing the process group\n")
    sys.stderr.flush()
    os.killpg(os.getpgrp(), signal.SIGKILL)
