"""Free loopback ports for the services the project starts itself (broker, Spark cluster, S3 server)."""

from __future__ import annotations

import socket


def free_loopback_port() -> int:
    """A TCP port on 127.0.0.1 free at the time of the call (the caller binds it next)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
