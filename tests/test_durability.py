"""Which rows wait for which destination, and when publishers and upstreams are acknowledged (no services)."""

from __future__ import annotations

from replication.durability import Durability
from replication.ingest import Classified
from replication.links import Link, runs_of
from replication.storage import StorageLayout, read_json


def committed(publishers=None, links=None) -> Classified:
    result = Classified.empty([])
    result.publishers = publishers or {}
    result.links = links or {}
    return result


def test_runs_of_groups_consecutive_seqs():
    assert runs_of([3, 4, 5, 8, 10, 11]) == [(3, 5), (8, 8), (10, 11)]
    assert runs_of([]) == []


def test_a_link_holds_only_rows_it_sent_and_not_yet_acknowledged(tmp_path):
    link = Link(tmp_path / "l.json", "b", "sync")
    assert link.holds(1, 1), "undecided rows wait"
    link.on_sent([(1, 3), (6, 6)], through=8)  # 4, 5, 7, 8 filtered out
    assert link.holds(1, 3) and link.holds(6, 6)
    assert not link.holds(4, 5) and not link.holds(7, 8)
    link.on_ack(3)
    assert not link.holds(1, 3) and link.holds(6, 6) and link.acked_seq == 5
    link.on_ack(6)
    assert link.acked_seq == 8
    reloaded = Link(tmp_path / "l.json", "b", "sync")
    assert reloaded.acked_seq == 8 and reloaded.snapshot().sent_seq == 8


def test_persisted_acks_wait_for_sync_destination_and_keep_publisher_order(tmp_path):
    layout = StorageLayout(tmp_path)
    link = Link(layout.link_file("b"), "b", "sync")
    dur = Durability(None, layout=layout, committed_seq=0, publishers={}, links={},
                     holds=lambda first, last: link.holds(first, last))
    dur.on_commit(2, committed({"p": 2}))          # seqs 1-2, sent to b
    dur.on_commit(3, committed({"q": 1}, {"up": 7}))  # seq 3, received from "up", not sent to b
    dur.on_commit(4, committed({"p": 3}))          # seq 4, sent to b
    link.on_sent([(1, 2), (4, 4)], through=4)
    dur.release()
    assert dur.persisted == {"q": 1}, "seq 3 is not held by b; p waits for b"
    assert read_json(layout.ack_file("up"))["seq"] == 7, "the upstream is acknowledged too"
    link.on_ack(2)
    dur.release()
    assert dur.persisted == {"q": 1, "p": 2}
    link.on_ack(4)
    dur.release()
    assert dur.persisted == {"q": 1, "p": 3} and dur.durable_seq == 4


def test_two_way_sync_pair_does_not_wait_on_itself(tmp_path):
    """A row received from the partner is not sent back, so only the partner's ack of our own rows matters."""
    layout = StorageLayout(tmp_path)
    to_partner = Link(layout.link_file("partner"), "partner", "sync")
    dur = Durability(None, layout=layout, committed_seq=0, publishers={}, links={},
                     holds=lambda f, l: to_partner.holds(f, l))
    dur.on_commit(1, committed({"mine": 1}))
    dur.on_commit(2, committed({"theirs": 1}, {"partner": 1}))
    to_partner.on_sent([(1, 1)], through=2)  # seq 2 came from the partner: filtered by the loop rule
    dur.release()
    assert dur.persisted == {"theirs": 1}
    assert read_json(layout.ack_file("partner"))["seq"] == 1, "the partner's row is acknowledged at once"


def test_restart_keeps_what_was_durable_and_waits_for_the_rest(tmp_path):
    layout = StorageLayout(tmp_path)
    dur = Durability(None, layout=layout, committed_seq=0, publishers={}, links={})
    dur.on_commit(5, committed({"p": 5}))
    assert dur.persisted == {"p": 5}
    held = Durability(None, layout=layout, committed_seq=9, publishers={"p": 9}, links={},
                      holds=lambda f, l: True)
    held.announce()
    assert held.persisted == {"p": 5}, "after a restart, persisted positions come back; new ones still wait"
