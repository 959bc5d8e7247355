"""A fabric: several instance configs read together, with each destination address resolved to an instance.

The offline tools (``replication validate``, ``trace``, ``topology``) see the
fabric through this module. A destination's ``<InetAddr>`` list is its
failover list; each address is matched against the storage root and inbox
address of every config given, so a destination named after a group (the
cascading mesh's ``LiveProdSubscriptions``) still leads to ``Live-A`` and
``Live-B``. An address that matches no config falls back to the destination
``<Name>`` when an instance has that name, and is otherwise *unknown*.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from replication.config.model import Destination, InstanceConfig
from replication.config.parser import parse_file
from replication.errors import ConfigError

__all__ = ["Fabric", "Link", "addresses_of", "normalize_address"]


def normalize_address(addr: str) -> str:
    """Comparable form of a storage location (``file://`` stripped, path normalised)."""
    addr = addr.strip()
    if addr.startswith("file://"):
        addr = addr[len("file://") :]
    if "://" in addr:
        return addr.rstrip("/")
    return os.path.normpath(addr)


def addresses_of(cfg: InstanceConfig) -> set[str]:
    """Every address by which upstreams may reach ``cfg``: its inbox address and storage root."""
    out = {normalize_address(cfg.storage)}
    if cfg.replication_transport is not None:
        out.add(normalize_address(cfg.replication_transport.inet_addr))
    return out


@dataclass(frozen=True)
class Link:
    """One address of one destination: a possible replication link."""

    upstream: str
    destination: Destination
    address: str
    priority: int
    """1 for the first ``<InetAddr>`` (the preferred one), 2 for the next…"""
    downstream: str | None
    """Instance at that address; None when no given config has it."""
    by_name: bool = False
    """True when the address matched no config and the destination name was used instead."""

    @property
    def label(self) -> str:
        return f"{self.upstream} -> {self.downstream or self.address} (destination {self.destination.name})"


class Fabric:
    """Configs by instance name, in the order given, plus address resolution."""

    def __init__(self, configs: Iterable[InstanceConfig], files: Sequence[str] | None = None):
        self.configs: dict[str, InstanceConfig] = {}
        self.files: dict[str, str] = {}
        for i, cfg in enumerate(configs):
            if cfg.name in self.configs:
                raise ConfigError(
                    f"two configs name their instance {cfg.name!r}"
                    + (f" ({self.files.get(cfg.name)} and {files[i]})" if files else "")
                    + ": every instance of a fabric needs its own <Name>",
                    file=files[i] if files else "",
                )
            self.configs[cfg.name] = cfg
            if files:
                self.files[cfg.name] = files[i]
        self._by_address: dict[str, str] = {}
        for cfg in self.configs.values():
            for addr in addresses_of(cfg):
                self._by_address.setdefault(addr, cfg.name)

    @classmethod
    def load(cls, paths: Sequence[str]) -> Fabric:
        """Parse every config file (:func:`replication.config.load`); a bad file raises :class:`ConfigError`."""
        return cls([parse_file(p) for p in paths], files=list(paths))

    def __contains__(self, name: object) -> bool:
        return name in self.configs

    def __getitem__(self, name: str) -> InstanceConfig:
        return self.configs[name]

    def __iter__(self):
        return iter(self.configs.values())

    def __len__(self) -> int:
        return len(self.configs)

    def resolve(self, address: str) -> str | None:
        """Name of the instance at ``address``, or None."""
        return self._by_address.get(normalize_address(address))

    def links(self, cfg: InstanceConfig, dest: Destination | None = None) -> list[Link]:
        """Every (destination, address) of ``cfg`` (or of one destination), in failover order."""
        out: list[Link] = []
        for d in (dest,) if dest is not None else cfg.destinations:
            addrs = d.inet_addrs or ("",)
            for i, addr in enumerate(addrs, start=1):
                name = self.resolve(addr) if addr else None
                by_name = False
                if name is None and d.name in self.configs and len(addrs) == 1:
                    name, by_name = d.name, True
                out.append(Link(cfg.name, d, addr, i, name, by_name))
        return out

    def all_links(self) -> list[Link]:
        return [link for cfg in self for link in self.links(cfg)]

    def connected(self, cfg: InstanceConfig, dest: Destination, down: Iterable[str] = ()) -> Link | None:
        """The link a destination uses: its first address whose instance is known and not down."""
        down = set(down)
        for link in self.links(cfg, dest):
            if link.downstream is not None and link.downstream not in down:
                return link
        return None

    def groups(self) -> dict[str, list[str]]:
        """Instance names by group, groups and members in config order."""
        out: dict[str, list[str]] = {}
        for cfg in self:
            out.setdefault(cfg.group or cfg.name, []).append(cfg.name)
        return out
