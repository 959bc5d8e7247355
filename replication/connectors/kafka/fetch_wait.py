"""A Kafka fetch wait that grows while the broker answers "no records" for data it has.

A fetch returns once it has a record or once its wait (``fetch_max_wait_ms``)
runs out. Short waits keep latency low at the end of a log: some brokers notice
new data during a long-polling fetch only at intervals of its wait. But a
broker may also stop assembling a response when the wait runs out and answer
with no records although the partition holds data past the fetch offset:
the embedded broker (tansu) lists every stored batch of the partition on each
fetch, so the time it needs grows with the partition and with a busy machine.
A consumer with a fixed short wait then reads nothing, for ever, however often
it reconnects.

:class:`FetchWait` doubles a consumer's wait each time no records came for
twice the current wait while data is known to be there (the caller says so,
or the partition's high watermark from the last fetch response is past the
consumer's position), up to :data:`MAX_FETCH_WAIT_MS`, and halves it again
each time a poll with records leaves the consumer caught up: it settles near
what the broker needs and returns to the short wait when the broker is quick
again. On a broker that always answers with the data it has, the wait never
grows.
"""

from __future__ import annotations

import logging
import time
from typing import Any

log = logging.getLogger(__name__)

#: The longest wait a consumer is given (it stays below the range consumers' 10 s request timeout).
MAX_FETCH_WAIT_MS = 2_000
#: Never grow sooner than this after the last records or the last growth.
_GROW_AFTER_S = 0.05


class FetchWait:
    """The fetch wait of one consumer (``consumer``), adapted after each ``poll()``.

    ``base_ms`` is the wait while the broker keeps up. Set :attr:`consumer` to
    a replacement consumer after a reconnect; :attr:`ms` is the wait to create
    it with. Changing a live consumer's wait uses kafka-python internals; where
    those differ, the wait still grows here and reaches the next consumer made
    with :attr:`ms`.
    """

    def __init__(self, consumer: Any, base_ms: int) -> None:
        self.base_ms = base_ms
        self.ms = base_ms
        self.consumer = consumer
        self._since = time.monotonic()

    def begin(self) -> None:
        """A new read starts: the time without records counts from now, not from the end of the last read."""
        self._since = time.monotonic()

    def after_poll(self, got_records: bool, *, data_known: bool = False) -> None:
        """Adapt after a poll; ``data_known``: the caller knows records exist past every position it still reads."""
        now = time.monotonic()
        if got_records:
            self._since = now
            if self.ms > self.base_ms and self._caught_up():
                self._apply(max(self.base_ms, self.ms // 2))
            return
        if not (data_known or self._data_waiting()):
            self._since = now
            return
        if self.ms < MAX_FETCH_WAIT_MS and now - self._since >= max(2 * self.ms / 1000, _GROW_AFTER_S):
            self._since = now
            self._apply(min(2 * self.ms, MAX_FETCH_WAIT_MS))
            if self.ms == MAX_FETCH_WAIT_MS:
                log.info("the broker answers fetches with no records although it has data; fetch wait now %d ms",
                         self.ms)

    def _apply(self, ms: int) -> None:
        self.ms = ms
        fetcher = getattr(self.consumer, "_fetcher", None)
        config = getattr(fetcher, "config", None)
        if isinstance(config, dict) and "fetch_max_wait_ms" in config:
            config["fetch_max_wait_ms"] = ms  # read each time a fetch request is built

    def _positions(self) -> list[tuple[int | None, int | None]]:
        """(position, high watermark) of each assigned partition, from what the consumer already knows."""
        consumer = self.consumer
        out = []
        for tp in consumer.assignment():
            position = getattr(getattr(partition_state(consumer, tp), "position", None), "offset", None)
            out.append((position, consumer.highwater(tp)))
        return out

    def _data_waiting(self) -> bool:
        return any(p is not None and hw is not None and hw > p for p, hw in self._positions())

    def _caught_up(self) -> bool:
        return all(p is not None and hw is not None and p >= hw for p, hw in self._positions())


def partition_state(consumer: Any, tp: Any) -> Any:
    """kafka-python's fetch state of an assigned partition (position, paused, ...), or None where it differs."""
    return getattr(getattr(consumer, "_subscription", None), "assignment", {}).get(tp)
