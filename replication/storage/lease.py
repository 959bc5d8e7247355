"""A lock held as a leased object in an S3 bucket: what a ``flock`` is on a local disk, for one writer at a time.

S3 has no lock, and a process killed with kill -9 cannot let go of one. So
the lock is an object naming its holder and when its lease ends, taken with a
conditional put (``If-None-Match``: only one of two racing takers gets it),
renewed by a thread of the holder's (``If-Match`` on what it last wrote: a
holder that lost it learns so at its next renewal), and deleted on release.

A lease left by a process that was killed is taken over:

* at once when its holder ran on this host and that process is gone (the
  usual case: the run killed, then run again on the same machine);
* else once its lease has ended: :data:`LEASE_S` after its last renewal
  (the taker waits for that while the lease is no longer renewed, and refuses
  at once while it is: another run is alive).

Expiry compares the holder's clock with the taker's: machines whose clocks
differ by more than a few seconds would take a lease early.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

from replication.connectors.s3.objects import ObjectPath, PreconditionFailed
from replication.errors import StorageError

log = logging.getLogger(__name__)

#: How long a lease lasts after its last renewal.
LEASE_S = 30.0
#: How often the holder renews it.
RENEW_S = 5.0


class LeaseHeld(StorageError):
    """Another live process holds the lease."""

    transient = False

    def __init__(self, message: str, holder: dict) -> None:
        super().__init__(message)
        self.holder = holder


@dataclass
class Lease:
    """A lease this process holds; :meth:`check` raises once it was lost (another process took it over)."""

    path: ObjectPath
    owner: str
    etag: str
    lost: str | None = None

    def check(self) -> None:
        if self.lost is not None:
            raise StorageError(f"{self.path}: this process's lease was lost ({self.lost}); it stopped so as not to "
                               "write beside the process that took it over")

    def body(self) -> bytes:
        return json.dumps({"owner": self.owner, "host": socket.gethostname(), "pid": os.getpid(),
                           "renewed": time.time(), "lease_s": LEASE_S}).encode()


@contextlib.contextmanager
def held(path: ObjectPath, *, what: str) -> Iterator[Lease]:
    """Hold the lease at ``path`` for the block (``what``: the holder's task, for messages); raises
    :class:`LeaseHeld` while another live process holds it."""
    lease = _take(path, what)
    stop = threading.Event()
    renewer = threading.Thread(target=_renew, args=(lease, stop), name=f"lease {path.name}", daemon=True)
    renewer.start()
    try:
        yield lease
    finally:
        stop.set()
        renewer.join()
        if lease.lost is None:
            with contextlib.suppress(StorageError, FileNotFoundError):
                if json.loads(path.read_bytes()).get("owner") == lease.owner:
                    path.unlink(missing_ok=True)


def _take(path: ObjectPath, what: str) -> Lease:
    lease = Lease(path, uuid.uuid4().hex, "")
    while True:
        try:
            lease.etag = path.write_bytes(lease.body(), if_none_match=True)
            return lease
        except PreconditionFailed:
            pass
        try:
            raw, etag = path.read_with_etag()
        except FileNotFoundError:
            continue  # released meanwhile: take it
        holder = _parse(raw)
        wait = _wait_before_taking(holder)
        if wait is None:
            raise LeaseHeld(f"{what}: another process holds {path} (host {holder.get('host')}, pid "
                            f"{holder.get('pid')}, renewed {time.time() - float(holder.get('renewed', 0)):.0f} s ago)",
                            holder)
        if wait > 0:
            log.warning("%s: %s is held by host %s pid %s, no longer renewed; taking it over in %.0f s when its "
                        "lease ends", what, path, holder.get("host"), holder.get("pid"), wait)
            time.sleep(wait)
        try:  # (conditional on the object read: two takers of one stale lease, one wins)
            lease.etag = path.write_bytes(lease.body(), if_match=etag)
            log.warning("%s: took over the lease at %s from host %s pid %s", what, path, holder.get("host"),
                        holder.get("pid"))
            return lease
        except PreconditionFailed:
            continue  # renewed or taken meanwhile: look again


def _parse(raw: bytes) -> dict:
    try:
        holder = json.loads(raw)
        return holder if isinstance(holder, dict) else {}
    except ValueError:
        return {}  # (unreadable: treated as ended)


def _wait_before_taking(holder: dict, now: float | None = None) -> float | None:
    """Seconds to wait before taking over ``holder``'s lease (0: at once); None: its holder is alive."""
    now = time.time() if now is None else now
    if holder.get("host") == socket.gethostname() and isinstance(holder.get("pid"), int):
        if not _process_alive(holder["pid"]):
            return 0.0
    renewed = float(holder.get("renewed", 0))
    ends = renewed + float(holder.get("lease_s", LEASE_S))
    if now >= ends:
        return 0.0
    if now - renewed <= 3 * RENEW_S:
        return None  # renewed lately: its holder runs
    return ends - now


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # (another user's process: alive)
    return True


def _renew(lease: Lease, stop: threading.Event) -> None:
    while not stop.wait(RENEW_S):
        try:
            lease.etag = lease.path.write_bytes(lease.body(), if_match=lease.etag)
        except PreconditionFailed:
            lease.lost = "another process took it over: its renewals had stopped for the length of a lease"
            log.error("%s: the lease was taken over by another process", lease.path)
            return
        except StorageError as exc:  # (S3 unreachable for a moment: the next renewal tries again)
            log.warning("%s: could not renew the lease (%s)", lease.path, exc)
