"""Which rows wait for which destination, and when publishers and upstreams are acknowledged (no services)."""

from __future__ import annotations

from replication.destination.link import Link
from replication.durability import Durability
from replication.ingest.classify import Classified
from replication.storage.control import read_json
from replication.storage.layout import StorageLayout
from replication.txlog import run_bounds, runs_of


def committed(publishers=None, links=None, *, rows=None, link_rows=None) -> Classified:
    """A committed batch's result; ``rows``/``link_rows``: the local seqs of each key (default: the whole batch)."""
    result = Classified.empty([])
    result.publishers = publishers or {}
    result.links = links or {}
    result.publisher_rows = {key: run_bounds(seqs) for key, seqs in (rows or {}).items()}
    result.link_rows = {key: run_bounds(seqs) for key, seqs in (link_rows or {}).items()}
    return result


def tracked(tmp_path, destination: str, **kwargs) -> tuple[StorageLayout, Link, Durability]:
    """A Durability whose rows wait for one sync destination."""
    layout = StorageLayout(tmp_path)
    link = Link(layout.link_file(destination), destination, "sync")
    kwargs = {"committed_seq": 0, "publishers": {}, "links": {}, **kwargs}
    return layout, link, Durability(None, layout=layout, holds=link.holds_any, **kwargs)


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
    layout, link, dur = tracked(tmp_path, "b")
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
    layout, to_partner, dur = tracked(tmp_path, "partner")
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
                      holds=lambda runs: True)
    held.announce()
    assert held.persisted == {"p": 5}, "after a restart, persisted positions come back; new ones still wait"


def test_a_sync_pair_acknowledges_the_partner_while_its_own_rows_in_the_same_batch_still_wait(tmp_path):
    """Per row, not per batch: one batch holding our row (sent to the partner) and the partner's row
    (never sent back) acknowledges the partner at once. Per batch, each side's ack would wait on the other's."""
    layout, to_partner, dur = tracked(tmp_path, "partner")
    dur.on_commit(2, committed({"mine": 1, "theirs": 1}, {"partner": 40},
                               rows={"mine": [1], "theirs": [2]}, link_rows={"partner": [2]}))
    to_partner.on_sent([(1, 1)], through=2)
    dur.release()
    assert read_json(layout.ack_file("partner"))["seq"] == 40, "the partner's row is not held by the partner"
    assert dur.persisted == {"theirs": 1} and dur.durable_seq == 0
    to_partner.on_ack(1)
    dur.release()
    assert dur.persisted == {"theirs": 1, "mine": 1} and dur.durable_seq == 2


def test_a_publisher_position_waits_for_every_row_of_it_and_positions_stay_in_order(tmp_path):
    layout, link, dur = tracked(tmp_path, "b")
    dur.on_commit(3, committed({"p": 2, "q": 1}, rows={"p": [1, 3], "q": [2]}))
    dur.on_commit(4, committed({"p": 3}, rows={"p": [4]}))
    link.on_sent([(3, 4)], through=4)  # 1 and 2 filtered out
    dur.release()
    assert dur.persisted == {"q": 1}, "p's seq 2 is row 3, still unacknowledged; p's seq 3 waits behind it"
    link.on_ack(3)
    dur.release()
    assert dur.persisted == {"q": 1, "p": 2}
    link.on_ack(4)
    dur.release()
    assert dur.persisted == {"q": 1, "p": 3}


def test_after_a_restart_rows_are_matched_to_their_keys_again(tmp_path):
    """Both halves of a sync pair restarting with rows not yet durable must not wait on each other."""
    import pyarrow as pa

    def rows_since(after, through):
        assert (after, through) == (0, 4)
        return pa.table({"seq": [1, 2, 3, 4], "publisher": ["mine", "theirs", "mine", "theirs"],
                         "received_from": [None, "partner", None, "partner"]})

    layout, to_partner, dur = tracked(tmp_path, "partner", committed_seq=4, publishers={"mine": 2, "theirs": 2},
                                      links={"partner": 9}, rows_since=rows_since)
    to_partner.on_sent([(1, 1), (3, 3)], through=4)  # rows 2 and 4 came from the partner
    dur.announce()
    assert dur.persisted == {"theirs": 2}
    assert read_json(layout.ack_file("partner"))["seq"] == 9
    to_partner.on_ack(3)
    dur.release()
    assert dur.persisted == {"theirs": 2, "mine": 2} and dur.durable_seq == 4


def test_after_a_restart_without_the_rows_every_key_waits_for_the_whole_range(tmp_path):
    def unreadable(after, through):
        raise FileNotFoundError("vacuumed")

    layout, to_partner, dur = tracked(tmp_path, "partner", committed_seq=2, publishers={"mine": 1, "theirs": 1},
                                      links={"partner": 5}, rows_since=unreadable)
    to_partner.on_sent([(1, 1)], through=2)
    dur.announce()
    assert dur.persisted == {} and read_json(layout.ack_file("partner")) is None
    to_partner.on_ack(1)
    dur.release()
    assert dur.persisted == {"mine": 1, "theirs": 1} and read_json(layout.ack_file("partner"))["seq"] == 5


def test_a_link_answers_for_many_runs_at_once_as_it_does_for_each(tmp_path):
    import itertools

    import numpy as np

    link = Link(tmp_path / "l.json", "b", "sync")
    link.on_sent([(2, 4), (7, 7), (9, 12)], through=12)
    rows = list(range(1, 15))  # 13 and 14 are not decided yet
    for ack in (0, 3, 7, 10):
        link.on_ack(ack)
        for size in (1, 2, 3):
            for chosen in itertools.combinations(rows, size):
                expected = any(link.holds(s, s) for s in chosen)
                assert link.holds_any(run_bounds(np.array(chosen))) == expected, (ack, chosen)


def test_durable_json_records_the_watermark_whenever_it_moves(tmp_path):
    """fully_durable replays read durable_seq from durable.json: it must move even when no ack is released
    (here: rows that carry no publisher's or upstream's position)."""
    layout, link, dur = tracked(tmp_path, "b")
    dur.on_commit(3, committed())
    link.on_sent([(1, 3)], through=3)
    dur.release()
    assert (read_json(layout.durable_json) or {}).get("durable_seq", 0) == 0, "rows 1-3 wait for b"
    link.on_ack(3)
    dur.release()
    assert dur.durable_seq == 3 and read_json(layout.durable_json)["durable_seq"] == 3
