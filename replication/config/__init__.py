"""Instance configuration: AMPS-style XML (DESIGN §4) parsed once into frozen dataclasses.

:func:`load` is the entry point. The pieces: ``model`` (the dataclasses),
``xml_reader`` (secure, strict XML with errors that name file, line and fix),
``values`` (an element's text to a checked value: intervals, names, locations,
filters...), ``parser`` (the entry points and the schema of the root, which
elements become which dataclass) with ``sections`` (the schema of the
transports, transaction log, SOW, replication and bootstrap), ``effective``
(a parsed config as JSON, ``_control/instance.json``) and ``fabric`` (several
configs read together, destination addresses resolved to instances).

Example::

    from replication import config
    cfg = config.load("conf/amps-1.xml")
    cfg.destinations[0].sync_type   # 'sync'
"""

from __future__ import annotations

import os

from replication.config.model import InstanceConfig
from replication.config.parser import parse_file

__all__ = ["load"]


def load(path: str | os.PathLike[str]) -> InstanceConfig:
    """Parse and check one config file. Raises :class:`~replication.errors.ConfigError` naming file, line and fix."""
    return parse_file(path)
