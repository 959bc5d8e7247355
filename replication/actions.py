"""``<Actions>``: automatic downgrade and upgrade of sync destinations (DESIGN §5, AMPS's action modules).

On each tick of ``amps-action-on-schedule`` (``Every``):

- a sync destination whose oldest unacknowledged message is older than the
  downgrade ``Age`` is treated as async (acks waiting on it are released),
  unless that would leave fewer sync destinations than the instance's
  ``<Tuning><MinimumSyncDestinations>``, and not during the downgrade
  module's ``GracePeriod`` after start (time for the other instances to start
  and the links to connect);
- a downgraded destination is upgraded back once it is connected and its
  oldest unacknowledged message is younger than the upgrade ``Age``: it has
  caught up to within that age.

Ages are the link's own (:meth:`replication.durability.Durability.link_age`):
the rows a downgraded link has not acknowledged keep their ages, so a link
whose destination is still down stays downgraded instead of being upgraded
as soon as the rows stop counting.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from replication.config.model import InstanceConfig
    from replication.destination.link import Link
    from replication.durability import Durability

log = logging.getLogger(__name__)

ON_SCHEDULE = "amps-action-on-schedule"
DO_DOWNGRADE = "amps-action-do-downgrade-replication"
DO_UPGRADE = "amps-action-do-upgrade-replication"
#: Link states in which a destination is connected (a downgraded one is upgraded only then).
CONNECTED_STATES = ("connected", "failed over")


@dataclass(frozen=True)
class DowngradePolicy:
    every: float
    downgrade_age: float | None
    upgrade_age: float | None
    minimum_sync: int = 0
    grace_period: float = 0.0


def policy_of(cfg: InstanceConfig) -> DowngradePolicy | None:
    """The downgrade/upgrade policy of a config, or None when it has none."""
    for action in cfg.actions:
        if action.on.module != ON_SCHEDULE:
            continue
        downgrade = next((d for d in action.do if d.module == DO_DOWNGRADE), None)
        upgrade = next((d for d in action.do if d.module == DO_UPGRADE), None)
        if downgrade is None and upgrade is None:
            continue
        return DowngradePolicy(
            every=action.on.every or 1.0,
            downgrade_age=downgrade.age if downgrade else None,
            upgrade_age=upgrade.age if upgrade else None,
            minimum_sync=cfg.minimum_sync_destinations,
            grace_period=(downgrade.grace_period or 0.0) if downgrade else 0.0,
        )
    return None


class DowngradeController:
    """Applies a :class:`DowngradePolicy` to an instance's links on a driver thread."""

    def __init__(self, policy: DowngradePolicy, links: dict[str, Link], durability: Durability,
                 *, started: float | None = None) -> None:
        self.policy = policy
        self.links = links
        self.durability = durability
        self.started = started if started is not None else time.time()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="downgrade", daemon=True)
        self._kept_sync: set[str] = set()
        """Links left sync by MinimumSyncDestinations (said once in the log, not at every tick)."""

    @classmethod
    def from_config(cls, cfg, links, durability, *, started: float | None = None) -> DowngradeController | None:
        policy = policy_of(cfg)
        if policy is None or not any(link.sync for link in links.values()):
            return None
        return cls(policy, links, durability, started=started)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.wait(self.policy.every):
            if self.tick():
                self.durability.release()

    def tick(self, now: float | None = None) -> bool:
        """One evaluation; True when a destination changed mode."""
        now = now if now is not None else time.time()
        changed = False
        in_grace = now - self.started < self.policy.grace_period
        for name, link in self.links.items():
            if not link.sync:
                continue
            age = self.durability.link_age(link, now)
            if not link.downgraded:
                if self.policy.downgrade_age is None or age <= self.policy.downgrade_age or in_grace:
                    continue
                still_sync = sum(1 for other in self.links.values() if other.sync and not other.downgraded) - 1
                if still_sync < self.policy.minimum_sync:
                    if name in self._kept_sync:
                        continue
                    self._kept_sync.add(name)
                    log.warning("destination %s is %.1fs behind but stays sync: downgrading it would leave %d "
                                "sync destinations, fewer than MinimumSyncDestinations %d",
                                name, age, still_sync, self.policy.minimum_sync)
                    continue
                self._kept_sync.discard(name)
                link.set(downgraded=True)
                log.warning("destination %s downgraded to async: oldest unacknowledged message is %.1fs old",
                            name, age)
                changed = True
            elif (self.policy.upgrade_age is not None and age < self.policy.upgrade_age
                  and link.snapshot().state in CONNECTED_STATES):
                link.set(downgraded=False)
                log.warning("destination %s upgraded back to sync: oldest unacknowledged message is %.1fs old",
                            name, age)
                changed = True
        return changed
