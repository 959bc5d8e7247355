"""The project's exception hierarchy: one root, one subclass per concern, each transient or terminal.

Retry loops (a destination's connect loop, the ingest query's restart) retry
only *transient* errors: a destination that is down, a table being written.
A *terminal* error (a wrong config, an address the engine cannot use) will not
go away by waiting: it is shown to the operator (log, ``replication status``)
and the loop stops. Errors that may cross to Spark's Python workers pickle.
"""

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
        return (_rebuild_config_error, (type(self), str(self), self.file, self.line))


def _rebuild_config_error(cls: type[ConfigError], message: str, file: str, line: int | None) -> ConfigError:
    return cls(message, file=file, line=line)


class InputError(ReplicationError):
    """A value a user passed to a command or an API call (a bookmark, a source) is wrong; the message names
    the value, the accepted forms and the fix. Terminal: the same call fails the same way."""


class UnsupportedAddressError(ConfigError):
    """A storage or destination address the engine cannot use (a scheme not supported yet)."""


class BrokerError(ReplicationError):
    """The embedded Kafka-protocol broker could not be started or stopped."""


class StorageError(ReplicationError):
    """A Delta table or control file could not be read or written."""

    transient = True


class StorageAccessError(StorageError):
    """An object-store address cannot be used: unreachable endpoint, refused credentials, missing bucket. The
    user's to fix (a command exits 2); only an endpoint that cannot be reached may come back by itself
    (``transient``: an instance waiting for a bootstrap source retries it)."""

    def __init__(self, message: str, *, transient: bool = False) -> None:
        super().__init__(message)
        self.transient = transient


class SowRefusal(ReplicationError):
    """A message a SOW topic cannot take (no key, a delete that names nothing, a body that is not of its
    message type or cannot be merged); its text is the reason the message is stored with in ``rejected/``."""
