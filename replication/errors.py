"""The project's exception hierarchy: one root, one subclass per concern."""

from __future__ import annotations


class ReplicationError(Exception):
    """Root of every error this package raises on purpose.

    ``transient`` tells a caller whether retrying the same operation later may
    succeed (a destination that is down) or not (a wrong config).
    """

    transient: bool = False


class ConfigError(ReplicationError):
    """A configuration file is wrong; the message names file, line, problem and fix."""

    def __init__(self, message: str, *, file: str = "", line: int | None = None) -> None:
        super().__init__(message)
        self.file = file
        self.line = line

    def __reduce__(self):  # keep picklable across Spark workers
        return (_rebuild_config_error, (str(self), self.file, self.line))


def _rebuild_config_error(message: str, file: str, line: int | None) -> ConfigError:
    return ConfigError(message, file=file, line=line)


class BrokerError(ReplicationError):
    """The embedded Kafka-protocol broker could not be started or stopped."""


class StorageError(ReplicationError):
    """A Delta table or control file could not be read or written."""

    transient = True


class LinkError(ReplicationError):
    """A replication link cannot be used right now (destination down, validation failed)."""

    transient = True
