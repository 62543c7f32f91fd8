"""The exchange between two real peers (hivemind DHTs and libp2p daemons on 127.0.0.1, in one process): small pieces
go as one request and one answer, large ones and states as streams, and both ways refuse a requester that is not a
member. Two peers of one process and no coordinator: part of the edit loop (``make test-fast``), which covers the
exchange's both sides with them."""

import threading
import time

import pytest

from cotrain.averaging import Admission, Exchange, start_dht
from cotrain.averaging.admission import new_private_key
from cotrain.averaging.exchange import UNARY_MAX_BYTES



@pytest.fixture(scope="module")
def dhts(tmp_path_factory):
    keys = tmp_path_factory.mktemp("keys")
    a = start_dht(identity_path=str(keys / "a.key"))
    b = start_dht([str(m) for m in a.get_visible_maddrs()], identity_path=str(keys / "b.key"))
    try:
        yield a, b
    finally:
        b.shutdown()
        a.shutdown()


@pytest.fixture(scope="module")
def pair(dhts):
    """Two peers that admit everyone, and two more exchanges on the same two DHTs: one that admits nobody without a
    credential of a coordinator (whose key nobody here holds), and a stranger with none. Two exchanges on one DHT
    each hold a connection of their own to its daemon (hivemind's replica is one per process, bound to one loop)."""
    a, b = dhts
    open_to_all = Admission("exchange", None, enabled=False)
    guarded = Admission("exchange", new_private_key().public_key(), enabled=True)
    out = [Exchange(a, "open", open_to_all), Exchange(b, "open", open_to_all),
           Exchange(a, "guarded", open_to_all), Exchange(b, "guarded", guarded)]
    try:
        yield out
    finally:
        for e in out:
            e.shutdown(linger_s=0)


def test_a_piece_larger_than_the_fetch_expects_is_not_taken_in(pair):
    """A member announcing more bytes than a part can hold (to fill the fetcher's memory) gets none of them read: the
    fetch says the piece is not there, and counts it."""
    fetcher, server, _, _ = pair
    small, large = b"s" * 1000, b"l" * (3 * UNARY_MAX_BYTES)
    server.publish("t11", "t11/small", small)
    server.publish("t11", "t11/large", large)
    before, received = fetcher.oversized_pieces, fetcher.bytes_received
    for large_hint in (False, True):  # asked in one request first (the answer says: a stream), or streamed at once
        assert fetcher.fetch_many([(server.peer_id, "t11/small"), (server.peer_id, "t11/large")], wait_s=5,
                                  large=large_hint, max_bytes=999) == [None, None]
    assert fetcher.oversized_pieces - before >= 4
    assert fetcher.bytes_received == received
    assert fetcher.fetch_many([(server.peer_id, "t11/small"), (server.peer_id, "t11/large")], wait_s=5,
                              max_bytes=len(large)) == [small, large]


def test_a_small_piece_is_one_request_and_a_large_one_a_stream(pair):
    fetcher, server, _, _ = pair
    small, large, empty = b"s" * 1000, bytes(range(256)) * (UNARY_MAX_BYTES // 256 + 5), b""
    server.publish("t1", "t1/small", small)
    server.publish("t1", "t1/large", large)
    server.publish("t1", "t1/empty", empty)
    before, received = dict(server.served), fetcher.bytes_received
    got = fetcher.fetch_many([(server.peer_id, "t1/small"), (server.peer_id, "t1/large"),
                              (server.peer_id, "t1/empty")], wait_s=5)
    assert got == [small, large, empty]
    assert server.served["unary"] - before["unary"] == 2  # the small piece and the empty one
    assert server.served["stream"] - before["stream"] == 1  # the large one
    assert fetcher.bytes_received - received == len(small) + len(large)


def test_a_request_for_a_piece_not_yet_published_waits_for_it(pair):
    fetcher, server, _, _ = pair
    timer = threading.Timer(0.5, server.publish, args=("t2", "t2/late", b"late"))
    timer.start()
    try:
        assert fetcher.fetch_many([(server.peer_id, "t2/late")], wait_s=10) == [b"late"]
        assert fetcher.fetch_many([(server.peer_id, "t2/never")], wait_s=0.3) == [None]
    finally:
        timer.cancel()


def test_states_stream_with_progress(pair):
    fetcher, server, _, _ = pair
    state = b"z" * 600_000
    server.provide("state", lambda: state)
    seen = []
    before = dict(server.served)
    got = fetcher.fetch(server.peer_id, "state", wait_s=0, timeout=30, state=True,
                        on_progress=lambda n, total: seen.append((n, total)))
    assert got == state and seen[-1] == (len(state), len(state)) and len(seen) >= 2
    assert server.served == before  # a state is counted apart from the all-reduce's pieces
    assert fetcher.state_bytes_received >= len(state)


def test_a_stranger_is_refused_both_ways(pair):
    _, _, stranger, members_only = pair
    members_only.publish("t3", "t3/small", b"s" * 100)
    members_only.publish("t3", "t3/large", b"l" * (UNARY_MAX_BYTES + 1))
    refused = members_only.admission.refused
    got = stranger.fetch_many([(members_only.peer_id, "t3/small"), (members_only.peer_id, "t3/large")], wait_s=2)
    assert got == [None, None]
    assert members_only.admission.refused - refused >= 2
    assert stranger.refusals_received >= 2
    assert members_only.served == {"unary": 0, "stream": 0} and members_only.bytes_sent == 0


def test_a_leaving_peer_waits_for_the_reads_its_pieces_await_not_for_a_timer(pair):
    """Pieces published with ``readers`` keep a shutting-down peer serving until that many whole reads were made
    (in one answer or to a stream's end); pieces without (a meeting's) keep it for nothing."""
    fetcher, server, _, _ = pair
    large = b"L" * (UNARY_MAX_BYTES * 2)
    server.publish("t4", "t4/small", b"s" * 10, readers=2)
    server.publish("t4", "t4/large", large, readers=1)
    server.publish("t4", "t4/meeting", b"m")
    assert server.reads_awaited == 3
    assert fetcher.fetch_many([(server.peer_id, "t4/small"), (server.peer_id, "t4/meeting")], wait_s=5) == [
        b"s" * 10, b"m"]
    assert server.reads_awaited == 2
    assert fetcher.fetch_many([(server.peer_id, "t4/large"), (server.peer_id, "t4/small")], wait_s=5) == [
        large, b"s" * 10]
    assert server.reads_awaited == 0
    server.publish("t4", "t4/small", b"again", readers=1)  # republished: its new readers count
    assert server.reads_awaited == 1
    for tag in ("t5", "t6", "t7", "t8"):  # a tag dropped from the outbox is read by nobody any more
        server.publish(tag, f"{tag}/x", b"x")
    assert server.reads_awaited == 0


def test_a_leaving_peer_waits_for_the_reads_due_however_long_ago_it_published(dhts):
    """A groupmate whose own part of the all-reduce came last (a straggler under load) asks for this peer's reduced
    part only after: a peer shutting down long after it published still gives that read its time (it used to count
    ``linger_s`` from the publication, left at once, and the groupmate's round failed)."""
    open_to_all = Admission("exchange", None, enabled=False)
    reader, leaver = Exchange(dhts[0], "late", open_to_all), Exchange(dhts[1], "late", open_to_all)
    try:
        leaver.publish("t", "t/part", b"p" * 100, readers=1)
        time.sleep(3.5)  # longer ago than the linger below
        leaving = threading.Thread(target=leaver.shutdown, kwargs={"linger_s": 3.0})
        leaving.start()
        leaving.join(0.5)
        assert leaving.is_alive()  # still serving: a read is due
        assert reader.fetch_many([(leaver.peer_id, "t/part")], wait_s=5) == [b"p" * 100]
        leaving.join(30)
        assert not leaving.is_alive()
    finally:
        reader.shutdown(linger_s=0)


def test_a_peer_knows_who_asked_for_a_piece(pair):
    """A meeting's host hears at once that a peer waits for its meeting, published or not: the request is the news
    (a groupmate waiting for it, or a peer whose view made it its host, walking in)."""
    fetcher, server, _, _ = pair
    assert fetcher.fetch_many([(server.peer_id, "t9/meeting")], wait_s=0.2) == [None]
    assert server.askers("t9/meeting", within_s=30) == {str(fetcher.peer_id)}
    assert server.askers("t9/other", within_s=30) == set()
    server.publish("t10", "t10/meeting", b"m")
    assert fetcher.fetch_many([(server.peer_id, "t10/meeting")], wait_s=1) == [b"m"]
    assert server.askers("t10/meeting", within_s=30) == {str(fetcher.peer_id)}
    assert server.askers("t10/meeting", within_s=0) == set()  # older than asked for


def _wait_for_deposit(server, key: str, timeout: float = 10.0) -> dict:
    deadline, seen = time.monotonic() + timeout, -1
    while time.monotonic() < deadline:
        seen = server.wait_deposits(seen, deadline - time.monotonic())
        if server.deposits(key):
            return server.deposits(key)
    return {}


def test_a_join_leaves_its_deposit_while_it_waits_and_is_answered_by_the_next_piece(pair):
    """A meeting's member joins its host: its meeting waits with the request, where the host reads it, and the answer
    is what the host publishes next (its roster), not what was there before the join came (an earlier meeting's)."""
    fetcher, server, _, _ = pair
    server.max_deposit_bytes = 1000
    server.publish("j1", "j1/meeting", b"an earlier roster", settled=False)
    sent, received = fetcher.bytes_sent, server.bytes_received
    answer = {}
    joining = threading.Thread(target=lambda: answer.setdefault(
        "got", fetcher.join(server.peer_id, "j1/meeting", b"my meeting", wait_s=20)))
    joining.start()
    try:
        assert _wait_for_deposit(server, "j1/meeting") == {str(fetcher.peer_id): b"my meeting"}
        assert server.askers("j1/meeting", within_s=30) == {str(fetcher.peer_id)}
        server.publish("j1", "j1/meeting", b"the roster", readers=1)
    finally:
        joining.join(30)
    assert answer["got"] == b"the roster"
    assert server.deposits("j1/meeting") == {} and server.reads_awaited == 0  # it left with its request
    assert fetcher.bytes_sent - sent == server.bytes_received - received == len(b"my meeting")
    # a settled piece (a meeting that went) answers a join that comes after it, at once
    assert fetcher.join(server.peer_id, "j1/meeting", b"late", wait_s=20) == b"the roster"


def test_a_deposit_larger_than_the_server_takes_is_refused_and_not_kept(pair):
    fetcher, server, _, _ = pair
    server.max_deposit_bytes = 100
    server.publish("j2", "j2/meeting", b"roster")
    refused = server.deposits_refused
    assert fetcher.join(server.peer_id, "j2/meeting", b"x" * 101, wait_s=5) is None
    assert server.deposits_refused == refused + 1 and server.deposits("j2/meeting") == {}
    assert fetcher.join(server.peer_id, "j2/meeting", b"x" * 100, wait_s=5) == b"roster"


def test_a_host_that_leaves_right_after_its_last_roster_answers_the_joins_waiting(dhts):
    """The last round of a host whose node stops at once: the joins that wait get the roster and the result riding
    on it, in one answer however large (a stream would be a second request, to a host that may be gone)."""
    open_to_all = Admission("exchange", None, enabled=False)
    member, host = Exchange(dhts[0], "last", open_to_all), Exchange(dhts[1], "last", open_to_all)
    host.max_deposit_bytes = 1 << 20
    roster = bytes(range(256)) * (3 * UNARY_MAX_BYTES // 256)  # a hosted result larger than one unary piece
    answer = {}
    joining = threading.Thread(target=lambda: answer.setdefault(
        "got", member.join(host.peer_id, "r9/meeting", b"m" * 200_000, wait_s=30)))
    joining.start()
    try:
        assert len(_wait_for_deposit(host, "r9/meeting")[str(member.peer_id)]) == 200_000
        host.publish("r9", "r9/meeting", roster, readers=1)
        host.shutdown()
        joining.join(30)
        assert answer["got"] == roster
    finally:
        member.shutdown(linger_s=0)
