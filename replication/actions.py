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

The downgrade and the upgrade may be written in one ``<Action>`` or in two,
each with its own ``<Every>`` (as AMPS users often do: a frequent downgrade
check, a slower upgrade); each runs on its own schedule. One instance has at
most one of each (the config refuses a second, which would only compete).

An operator's downgrade (``replication downgrade``, :func:`apply_manual_downgrades`)
is never undone by the upgrade action: only ``replication upgrade`` ends it.

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
    from replication.storage.layout import StorageLayout

log = logging.getLogger(__name__)

ON_SCHEDULE = "amps-action-on-schedule"
DO_DOWNGRADE = "amps-action-do-downgrade-replication"
DO_UPGRADE = "amps-action-do-upgrade-replication"
#: Link states in which a destination is connected (a downgraded one is upgraded only then).
CONNECTED_STATES = ("connected", "failed over")


@dataclass(frozen=True)
class DowngradePolicy:
    every: float
    """Seconds between downgrade checks (and upgrade checks, unless ``upgrade_every``)."""
    downgrade_age: float | None
    upgrade_age: float | None
    minimum_sync: int = 0
    grace_period: float = 0.0
    upgrade_every: float | None = None
    """Seconds between upgrade checks, when the upgrade is an action of its own."""

    @property
    def upgrade_interval(self) -> float:
        return self.upgrade_every if self.upgrade_every is not None else self.every


def policy_of(cfg: InstanceConfig) -> DowngradePolicy | None:
    """The downgrade/upgrade policy of a config (from every scheduled action), or None when it has none."""
    downgrade = upgrade = None
    for action in cfg.actions:
        if action.on.module != ON_SCHEDULE:
            continue
        every = action.on.every or 1.0
        for step in action.do:
            if step.module == DO_DOWNGRADE and downgrade is None:
                downgrade = (every, step)
            elif step.module == DO_UPGRADE and upgrade is None:
                upgrade = (every, step)
    if downgrade is None and upgrade is None:
        return None
    return DowngradePolicy(
        every=downgrade[0] if downgrade else upgrade[0] if upgrade else 1.0,
        downgrade_age=downgrade[1].age if downgrade else None,
        upgrade_age=upgrade[1].age if upgrade else None,
        minimum_sync=cfg.minimum_sync_destinations,
        grace_period=(downgrade[1].grace_period or 0.0) if downgrade else 0.0,
        upgrade_every=upgrade[0] if upgrade else None,
    )


def apply_manual_downgrades(links: dict[str, Link], layout: StorageLayout) -> bool:
    """Make each link match the operator's downgrade files (present: async until upgraded; removed: sync
    again, where the automatic action may downgrade it anew); True when a link changed."""
    changed = False
    for name, link in links.items():
        if not link.sync:
            continue
        asked = layout.manual_downgrade_file(name).is_file()  # (on S3, exists() would also list it as a folder)
        if asked and not (link.manual and link.downgraded):
            link.set(downgraded=True, manual=True)
            log.warning("destination %s downgraded to async by an operator (replication downgrade); it stays "
                        "async until replication upgrade", name)
            changed = True
        elif not asked and link.manual:
            link.set(downgraded=False, manual=False)
            log.warning("destination %s upgraded back to sync by an operator (replication upgrade)", name)
            changed = True
    return changed


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
        start = time.monotonic()
        next_down, next_up = start + self.policy.every, start + self.policy.upgrade_interval
        while not self._stop.wait(max(0.0, min(next_down, next_up) - time.monotonic())):
            at = time.monotonic()
            down, up = at >= next_down, at >= next_up
            if down:
                next_down += self.policy.every * max(1, int((at - next_down) // self.policy.every) + 1)
            if up:
                next_up += self.policy.upgrade_interval * max(
                    1, int((at - next_up) // self.policy.upgrade_interval) + 1)
            if self.tick(downgrade=down, upgrade=up):
                self.durability.release()

    def tick(self, now: float | None = None, *, downgrade: bool = True, upgrade: bool = True) -> bool:
        """One evaluation of the downgrade action, the upgrade action or both; True when a destination
        changed mode."""
        now = now if now is not None else time.time()
        changed = False
        in_grace = now - self.started < self.policy.grace_period
        for name, link in self.links.items():
            if not link.sync:
                continue
            age = self.durability.link_age(link, now)
            if not link.downgraded:
                if not downgrade or self.policy.downgrade_age is None or age <= self.policy.downgrade_age or in_grace:
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
            elif (upgrade and self.policy.upgrade_age is not None and age < self.policy.upgrade_age
                  and link.snapshot().state in CONNECTED_STATES):
                if not link.upgrade_unless_manual():
                    continue
                log.warning("destination %s upgraded back to sync: oldest unacknowledged message is %.1fs old",
                            name, age)
                changed = True
        return changed
