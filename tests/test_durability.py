"""Which rows wait for which destination, and when publishers and upstreams are acknowledged (no services)."""

from __future__ import annotations

import numpy as np

from replication.actions import DowngradeController, DowngradePolicy
from replication.destination.link import Link
from replication.durability import Durability
from replication.ingest.classify import Classified
from replication.storage.control import read_json
from replication.storage.layout import StorageLayout
from replication.txlog.runs import run_bounds, runs_by_code, runs_of, stable_order


def committed(publishers=None, links=None, *, rows=None, link_rows=None, link_seqs=None, duplicates=None) -> Classified:
    """A committed batch's result; ``rows``/``link_rows``: the local seqs of each key (default: the whole batch);
    ``link_seqs``: upstream -> [(its seq, our seq), ...] of rows received; ``duplicates``: upstream -> its seqs
    of copies dropped as duplicates."""
    result = Classified.empty([])
    result.publishers = publishers or {}
    result.links = links or {}
    result.publisher_rows = {key: run_bounds(seqs) for key, seqs in (rows or {}).items()}
    result.link_rows = {key: run_bounds(seqs) for key, seqs in (link_rows or {}).items()}
    result.link_seqs = {key: (np.array([u for u, _ in pairs], np.int64), np.array([s for _, s in pairs], np.int64))
                        for key, pairs in (link_seqs or {}).items()}
    result.link_duplicates = {key: np.array(ups, np.int64) for key, ups in (duplicates or {}).items()}
    return result


def tracked(tmp_path, destination: str, **kwargs) -> tuple[StorageLayout, Link, Durability]:
    """A Durability whose rows wait for one sync destination."""
    layout = StorageLayout(tmp_path)
    link = Link(layout.link_file(destination), destination, "sync")
    kwargs = {"committed_seq": 0, "publishers": {}, "upstreams": {}, **kwargs}
    return layout, link, Durability(None, layout=layout, destinations={destination: link}, **kwargs)


def ack_of(layout: StorageLayout, upstream: str) -> tuple[int, list] | None:
    """What ``<upstream>`` reads in our ack file for it: (prefix, runs above it)."""
    payload = read_json(layout.ack_file(upstream))
    return (payload["seq"], payload["runs"]) if payload else None


def test_runs_of_groups_consecutive_seqs():
    assert runs_of([3, 4, 5, 8, 10, 11]) == [(3, 5), (8, 8), (10, 11)]
    assert runs_of([]) == []


def test_stable_order_groups_codes_keeping_arrival_order_at_every_code_width():
    rng = np.random.default_rng(7)
    for low, high in ((-1, 4), (-(1 << 15), 1 << 15), (0, 1 << 20), (-(1 << 40), 1 << 40)):
        codes = rng.integers(low, high, 5_000, dtype=np.int64)
        codes[:50] = codes[0]  # (repeats: their order is the arrival order)
        assert np.array_equal(stable_order(codes), np.argsort(codes, kind="stable")), (low, high)
    assert stable_order(np.array([], dtype=np.int64)).size == 0
    for edge in ((1 << 15) - 1, 1 << 15, -(1 << 15), -(1 << 15) - 1):  # (either side of the 16-bit sort)
        codes = np.array([edge, 0, edge, -1, 0], dtype=np.int64)
        assert np.array_equal(stable_order(codes), np.argsort(codes, kind="stable")), edge
    runs = runs_by_code(np.array([70_000, -1, 2, 70_000, 2]), np.array([1, 2, 3, 4, 5]))  # (-1: no key)
    assert {code: (firsts.tolist(), lasts.tolist()) for code, (firsts, lasts) in runs.items()} == {
        70_000: ([1, 4], [1, 4]), 2: ([3, 5], [3, 5])}


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
    # the link file records a send at once, an acknowledgement once saved (after the release it caused)
    assert Link(tmp_path / "l.json", "b", "sync").acked_seq == 0
    link.save()
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
    dur = Durability(None, layout=layout, committed_seq=0, publishers={}, upstreams={})
    dur.on_commit(5, committed({"p": 5}))
    assert dur.persisted == {"p": 5}
    waiting = Link(tmp_path / "b.json", "b", "sync")  # has decided nothing yet: holds every row
    held = Durability(None, layout=layout, committed_seq=9, publishers={"p": 9}, upstreams={},
                      destinations={"b": waiting})
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
                                      upstreams={"partner": 9}, rows_since=rows_since)
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
                                      upstreams={"partner": 5}, rows_since=unreadable)
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


def test_the_ack_watch_reads_the_ack_while_rows_wait_for_it_and_an_idle_link_once_a_second(tmp_path):
    from replication.destination.manager import IDLE_ACK_READ_S, ack_read_due, watch_pace

    link = Link(tmp_path / "l.json", "b", "sync")
    assert not link.awaiting_ack(), "nothing sent"
    link.on_sent([], through=5)  # a batch filtered out entirely: nothing to wait for
    assert not link.awaiting_ack()
    link.on_sent([(6, 9)], through=9)
    assert link.awaiting_ack()
    assert ack_read_due(link.awaiting_ack(), now=100.0, last_read=99.99), "every turn while rows wait"
    # turns come faster while rows wait on a disk (the persisted ack's last hop), never on a billed object store
    assert watch_pace(True, on_disk=True) < watch_pace(False, on_disk=True) <= 0.05
    assert watch_pace(True, on_disk=False) == watch_pace(False, on_disk=False) == 0.1
    link.on_ack(9)
    assert not link.awaiting_ack() and link.acked_seq == 9
    assert not ack_read_due(link.awaiting_ack(), now=100.0, last_read=99.5)
    assert ack_read_due(link.awaiting_ack(), now=100.0, last_read=100.0 - IDLE_ACK_READ_S)


def test_a_link_takes_acknowledged_runs_above_the_prefix(tmp_path):
    link = Link(tmp_path / "l.json", "b", "sync")
    link.on_sent([(1, 10)], through=10)
    link.on_ack(2, [(4, 5), (8, 8)])
    assert link.snapshot().unacked == ((3, 3), (6, 7), (9, 10))
    assert link.acked_seq == 2 and not link.holds(4, 5) and link.holds(3, 3)
    link.on_ack(2, [(4, 5), (8, 8)])  # the same file read again changes nothing
    assert link.snapshot().unacked == ((3, 3), (6, 7), (9, 10))
    link.on_ack(7, [(9, 10)])
    assert link.snapshot().unacked == () and link.acked_seq == 10
    link.save()
    assert list(Link(tmp_path / "l.json", "b", "sync").held_mask(np.arange(1, 12))) == [False] * 10 + [True]


def test_an_upstream_row_waiting_for_our_sync_destination_does_not_hold_back_the_rows_after_it(tmp_path):
    """The ring A -> B -> C -> A: B's row from A that waits for C must not hold back the acknowledgement of
    B's later rows from A that do not go to C. With only a prefix, each instance's acks wait on the next
    one's round the ring (see replication.durability)."""
    layout, to_c, dur = tracked(tmp_path, "c")
    # batch: upstream seqs 10, 11, 12 of A became our rows 1, 2, 3; only row 1 goes to C
    dur.on_commit(3, committed({"p": 1, "q": 1, "r": 1}, {"a": 12}, rows={"p": [1], "q": [2], "r": [3]},
                               link_seqs={"a": [(10, 1), (11, 2), (12, 3)]}))
    to_c.on_sent([(1, 1)], through=3)
    dur.release()
    assert ack_of(layout, "a") == (9, [[11, 12]]), "10 waits for C; 11 and 12 are durable here"
    to_c.on_ack(1)
    dur.release()
    assert ack_of(layout, "a") == (12, [])


def test_a_duplicate_is_acknowledged_once_the_original_is_handed_to_our_sync_destinations(tmp_path):
    """A copy from ``a`` of a message stored here earlier (it came another way, row 1) waits until row 1 is
    written to our sync destination's inbox, not until that destination acknowledges it."""
    layout, to_c, dur = tracked(tmp_path, "c")
    dur.on_commit(1, committed({"p": 1}, rows={"p": [1]}))
    dur.on_commit(1, committed({}, {"a": 20}, link_seqs={"a": []}, duplicates={"a": [20]}))
    dur.release()
    assert ack_of(layout, "a") == (19, []), "20 waits: row 1 is not yet handed to c"
    to_c.on_sent([(1, 1)], through=1)
    dur.release()
    assert ack_of(layout, "a") == (20, [])
    assert dur.persisted == {}, "the publisher of row 1 still waits for c's acknowledgement"


def test_ages_count_the_rows_a_link_still_waits_for_even_once_downgraded(tmp_path):
    clock = [1000.0]
    layout = StorageLayout(tmp_path)
    to_b = Link(layout.link_file("b"), "b", "sync")
    to_c = Link(layout.link_file("c"), "c", "async")
    dur = Durability(None, layout=layout, committed_seq=0, publishers={}, upstreams={},
                     destinations={"b": to_b, "c": to_c}, now=lambda: clock[0])
    dur.on_commit(2, committed({"p": 2}))
    clock[0] = 1010.0
    dur.on_commit(4, committed({"p": 4}))
    to_b.on_sent([(1, 4)], through=4)
    to_c.on_sent([(1, 4)], through=4)
    to_c.on_ack(2)
    clock[0] = 1030.0
    assert (dur.link_age(to_b), dur.link_age(to_c)) == (30.0, 20.0), "async links have an age too"
    to_b.set(downgraded=True)
    dur.release()
    assert dur.persisted == {"p": 4} and dur.durable_seq == 4, "downgraded: its rows no longer hold acks"
    assert dur.link_age(to_b) == 30.0, "but they keep their age: the link is still behind"
    to_b.on_ack(4)
    to_c.on_ack(4)
    dur.release()
    assert (dur.link_age(to_b), dur.link_age(to_c)) == (0.0, 0.0)


def controller(tmp_path, *, sync_links=("b",), minimum_sync=0, grace_period=0.0):
    clock = [1000.0]
    layout = StorageLayout(tmp_path)
    links = {name: Link(layout.link_file(name), name, "sync") for name in sync_links}
    dur = Durability(None, layout=layout, committed_seq=0, publishers={}, upstreams={}, destinations=links,
                     now=lambda: clock[0])
    policy = DowngradePolicy(every=1.0, downgrade_age=30.0, upgrade_age=10.0, minimum_sync=minimum_sync,
                             grace_period=grace_period)
    return clock, links, dur, DowngradeController(policy, links, dur, started=clock[0])


def test_a_downgraded_destination_is_upgraded_only_once_connected_and_caught_up(tmp_path):
    clock, links, dur, ctl = controller(tmp_path)
    b = links["b"]
    b.set(state="connected")
    dur.on_commit(1, committed({"p": 1}))
    b.on_sent([(1, 1)], through=1)
    clock[0] += 31
    assert ctl.tick(clock[0]) and b.downgraded
    b.set(state="waiting")  # b is down; more rows come and are acknowledged to publishers at once
    for seq in range(2, 6):
        clock[0] += 15
        dur.on_commit(seq, committed({"p": seq}))
        assert not ctl.tick(clock[0]) and b.downgraded, "still behind: no upgrade (no flapping)"
    assert dur.persisted == {"p": 5}
    clock[0] += 15
    b.set(state="connected")
    b.on_sent([(2, 5)], through=5)
    b.on_ack(4)
    assert not ctl.tick(clock[0]) and b.downgraded, "row 5 is 15 s old: not within the upgrade Age yet"
    b.on_ack(5)
    assert ctl.tick(clock[0]) and not b.downgraded


def test_minimum_sync_destinations_and_grace_period_keep_a_late_link_sync(tmp_path):
    clock, links, dur, ctl = controller(tmp_path, sync_links=("b", "c"), minimum_sync=1, grace_period=60.0)
    dur.on_commit(1, committed({"p": 1}))
    clock[0] += 45
    assert not ctl.tick(clock[0]), "within the grace period after start nothing is downgraded"
    clock[0] += 20
    assert ctl.tick(clock[0])
    assert sorted(name for name, link in links.items() if link.downgraded) == ["b"], \
        "one of the two goes async; the other stays: MinimumSyncDestinations is 1"
    assert not ctl.tick(clock[0] + 100) and not links["c"].downgraded


def test_after_a_restart_an_upstream_is_acknowledged_row_by_row_again(tmp_path):
    """Which upstream seq each stored row had comes back from the inbox: a restarted member of a sync ring
    acknowledges the rows that are durable without waiting for the one that is not."""
    import pyarrow as pa

    def rows_since(after, through):
        return pa.table({"seq": [1, 2], "publisher": ["p", "q"], "publisher_seq": [5, 6],
                         "received_from": ["up", "up"]})

    def received_since(upstream, after, through):
        assert (upstream, after, through) == ("up", 0, 12)
        return pa.table({"publisher": ["p", "q", "r"], "publisher_seq": [5, 6, 1], "upstream_seq": [10, 11, 12]})

    layout, to_c, dur = tracked(tmp_path, "c", committed_seq=2, publishers={"p": 5, "q": 6}, upstreams={"up": 12},
                                rows_since=rows_since, received_since=received_since)
    to_c.on_sent([(1, 1)], through=1)  # row 1 goes to c; row 2 is not decided yet
    dur.announce()
    assert ack_of(layout, "up") == (9, []), "10 and 11 wait for c; 12 (not stored: a duplicate) for row 2"
    to_c.on_sent([], through=2)  # row 2 is not for c
    dur.release()
    assert ack_of(layout, "up") == (9, [[11, 12]]), "row 1 (upstream seq 10) alone still waits"
    to_c.on_ack(1)
    dur.release()
    assert ack_of(layout, "up") == (12, [])

