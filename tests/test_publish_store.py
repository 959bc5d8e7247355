"""The publisher's store of unacknowledged messages: what survives a reopen (pure logic, a SQLite file)."""

from __future__ import annotations

from replication.client.publisher import PublishStore


def reopened(store: PublishStore, path) -> PublishStore:
    store.close()
    return PublishStore(path)


def test_the_highest_sequence_survives_a_reopen_whatever_was_discarded(tmp_path):
    path = tmp_path / "pub.store"
    store = PublishStore(path)
    assert store.last_seq() == 0
    for seq in range(1, 11):
        store.add(seq, "/orders", b'{"n": %d}' % seq, "json", "publish")
    store.discard_through(4)  # acknowledged
    store = reopened(store, path)
    assert store.last_seq() == 10, "the stored messages above the acknowledged ones"
    assert [row[0] for row in store.unacknowledged()] == list(range(5, 11))
    store.discard(10)  # the newest refused
    assert store.discard(10) is None, "already gone"
    store = reopened(store, path)
    assert store.last_seq() == 10, "a refused newest message's sequence is not used again"
    store.discard_through(9)  # everything acknowledged: the store is empty
    store = reopened(store, path)
    assert store.count() == 0
    assert store.last_seq() == 10
    store.add(11, "/orders", b"{}", "json", "publish", {"amps-sow-key": "k"})
    assert store.unacknowledged() == [(11, "/orders", "json", "publish", b"{}", {"amps-sow-key": "k"})]
    store.close()


def test_an_acknowledgement_above_every_stored_message_moves_the_highest_sequence(tmp_path):
    """The instance may acknowledge more than this store holds (a logon after the store was lost): the next
    message must be numbered above it."""
    store = PublishStore(tmp_path / "pub.store")
    store.add(1, "/orders", b"{}", "json", "publish")
    store.discard_through(50)
    assert (store.count(), store.last_seq()) == (0, 50)
    store.close()


def test_a_store_written_before_keeps_its_highest_sequence(tmp_path):
    """A store whose meta row was written with each message (earlier releases) opens with the same answer."""
    path = tmp_path / "pub.store"
    store = PublishStore(path)
    store._db.execute("INSERT OR REPLACE INTO meta VALUES ('last_seq', 7)")
    store.add(3, "/orders", b"{}", "json", "publish")
    store = reopened(store, path)
    assert store.last_seq() == 7
    store.close()
