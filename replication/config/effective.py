"""The effective config as JSON: what ``_control/instance.json`` holds, read by upstreams for validation.

The encoding is generic over the dataclasses of :mod:`replication.config.model`,
so a field added there is carried without touching this module. Tuples become
lists, frozensets sorted lists, ``Source`` a ``{"file", "line"}`` object, a
parsed filter its text (parsed again when read), a secret (a Kafka password) the
text ``"<secret>"``: the file never holds one, and a config read back from it has
no usable secret (readers of ``instance.json`` validate links; they never connect
to that instance's Kafka). Reading and writing the file
is :mod:`replication.storage.control`'s job.

Example::

    from replication import config
    from replication.config import effective
    cfg = config.load("conf/amps-1.xml")
    assert effective.from_dict(effective.to_dict(cfg)) == cfg
"""

from __future__ import annotations

import dataclasses
import types
import typing
from functools import cache
from typing import Any, Literal, Union

from replication.config.model import InstanceConfig
from replication.connectors.kafka.security import Secret

#: What ``instance.json`` holds in place of a secret.
REDACTED = "<secret>"

__all__ = ["FORMAT", "from_dict", "to_dict"]

#: Version of the JSON layout; bump it when a reader of the old layout would misread the new one.
FORMAT = 1


def to_dict(cfg: InstanceConfig) -> dict[str, Any]:
    """Return ``cfg`` as a JSON-safe dict with ``"format": FORMAT``."""
    return {"format": FORMAT, **_encode(cfg)}


def from_dict(data: dict[str, Any]) -> InstanceConfig:
    """Rebuild an :class:`InstanceConfig` from :func:`to_dict` output.

    Raises ``ValueError`` on another format or a missing / mistyped field. Unknown
    keys are ignored so an older instance can still read what a newer one wrote.
    """
    if not isinstance(data, dict):
        raise ValueError(f"effective config: expected a JSON object, got {type(data).__name__}")
    fmt = data.get("format")
    if fmt != FORMAT:
        raise ValueError(f"effective config: format {fmt!r} is not supported (this version reads format {FORMAT})")
    body = {k: v for k, v in data.items() if k != "format"}
    return _decode(InstanceConfig, body, "instance")


# ---------------------------------------------------------------------------


def _encode(value: Any) -> Any:
    if isinstance(value, Secret):
        return REDACTED
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        # fields derived at construction (a parsed filter's expression) are not carried
        return {f.name: _encode(getattr(value, f.name)) for f in dataclasses.fields(value) if f.init}
    if isinstance(value, frozenset):
        return sorted(_encode(v) for v in value)
    if isinstance(value, (tuple, list)):
        return [_encode(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    raise TypeError(f"effective config: cannot encode {type(value).__name__}")


@cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _decode(tp: Any, value: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):  # a hint is a class, never an instance
        if not isinstance(value, dict):
            raise ValueError(f"effective config: {where} should be an object, got {value!r}")
        hints = _hints(tp)
        kwargs = {}
        for f in dataclasses.fields(tp):
            if not f.init:
                continue
            if f.name in value:
                kwargs[f.name] = _decode(hints[f.name], value[f.name], f"{where}.{f.name}")
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ValueError(f"effective config: {where}.{f.name} is missing")
        return tp(**kwargs)
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _decode(inner, value, where)
    if origin in (tuple, frozenset):
        if not isinstance(value, list):
            raise ValueError(f"effective config: {where} should be a list, got {value!r}")
        if origin is frozenset:
            return frozenset(_decode(args[0], v, f"{where}[]") for v in value)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_decode(args[0], v, f"{where}[{i}]") for i, v in enumerate(value))
        if len(args) != len(value):
            raise ValueError(f"effective config: {where} should have {len(args)} items, got {value!r}")
        return tuple(_decode(a, v, f"{where}[{i}]") for i, (a, v) in enumerate(zip(args, value)))
    if tp is Secret:
        return Secret("")  # never written (see the module docstring)
    if origin is Literal:
        tp = type(args[0])
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp in (str, int, float, bool) and type(value) is tp:
        return value
    raise ValueError(f"effective config: {where} should be {getattr(tp, '__name__', tp)}, got {value!r}")
