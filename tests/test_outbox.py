"""What an exchange holds for its peers (cotrain.averaging.outbox), without the network: the pieces it serves by
round, who asked for them, and the pieces peers left with their requests, each bounded."""

import threading

from cotrain.averaging.outbox import (ASK_MEMORY_S, MAX_ASKED_KEYS, MAX_DEPOSITS_PER_PEER, Askers, DepositBox,
                                      Outbox)


def test_old_rounds_pieces_go_with_their_tag_withdrawn_ones_too():
    """A meeting that did not fill withdraws its piece; once its round's tag is dropped nothing of it is kept."""
    box = Outbox(keep_tags=3)
    box.publish("w-0", "w-0/meeting", b"x")
    box.withdraw("w-0/meeting")
    box.publish("w-0", "w-0/part", b"y", readers=1)
    assert box.piece("w-0/meeting") is None and box.version("w-0/meeting") == 1  # withdrawn: its version stays
    assert box.reads_awaited == 1
    for i in range(1, 4):
        box.publish(f"w-{i}", f"w-{i}/part", b"z")
    assert not [k for k in box.keys() if k.startswith("w-0/")]
    assert box.reads_awaited == 0 and box.piece("w-3/part") == b"z"


def test_a_piece_answers_a_request_after_a_version_only_when_newer_or_settled():
    box = Outbox(keep_tags=4)
    box.publish("r", "r/meeting", b"roster 1", settled=False)
    seen = box.version("r/meeting")
    assert box.piece("r/meeting") == b"roster 1"  # any piece
    assert box.piece("r/meeting", after=seen) is None  # a join that came after it waits for the next
    box.publish("r", "r/meeting", b"roster 2")
    assert box.piece("r/meeting", after=seen) == b"roster 2"
    assert box.piece("r/meeting", after=box.version("r/meeting")) == b"roster 2"  # settled: answers later joins too


def test_reads_awaited_count_down_and_republishing_resets_them():
    box = Outbox(keep_tags=4)
    box.publish("t", "t/a", b"a", readers=2)
    box.publish("t", "t/m", b"m")
    box.was_read("t/a")
    box.was_read("t/m")  # a piece nobody had to read
    assert box.reads_awaited == 1
    box.was_read("t/a")
    box.was_read("t/a")
    assert box.reads_awaited == 0
    box.publish("t", "t/a", b"again", readers=1)
    assert box.reads_awaited == 1


def test_askers_are_remembered_for_a_while_and_bounded():
    now = [1000.0]
    asked = Askers(clock=lambda: now[0])
    asked.note("k/meeting", "p1")
    now[0] += 5.0
    asked.note("k/meeting", "p2")
    assert asked.within("k/meeting", within_s=10.0) == {"p1", "p2"}
    assert asked.within("k/meeting", within_s=1.0) == {"p2"}
    assert asked.within("k/other", within_s=10.0) == set()
    now[0] += ASK_MEMORY_S
    asked.note("k/meeting", "p3")  # the old asks are forgotten as the key is noted again
    assert asked.within("k/meeting", within_s=10 * ASK_MEMORY_S) == {"p3"}
    for i in range(MAX_ASKED_KEYS + 10):
        asked.note(f"n{i}/meeting", "p")
    assert asked.within("k/meeting", within_s=10 * ASK_MEMORY_S) == set()  # the oldest keys went
    assert asked.within(f"n{MAX_ASKED_KEYS + 9}/meeting", within_s=1.0) == {"p"}


def test_deposits_are_bounded_replaced_by_a_peers_newer_one_and_dropped_with_their_request():
    box = DepositBox()
    assert not box.file("k", "p", b"x")  # max_bytes 0: none taken
    box.max_bytes = 10
    assert box.refused == 1
    assert not box.file("k", "p", b"x" * 11) and box.refused == 2
    first, second = b"first", b"second"
    assert box.file("k", "p", first) and box.file("k", "p", second)
    assert box.get("k") == {"p": second}
    box.drop("k", "p", first)  # the older request ended: the newer deposit stays
    assert box.get("k") == {"p": second}
    box.drop("k", "p", second)
    assert box.get("k") == {}
    for i in range(MAX_DEPOSITS_PER_PEER):
        assert box.file(f"k{i}", "greedy", b"d")
    assert not box.file("one too many", "greedy", b"d")


def test_waiting_for_a_deposit_wakes_when_one_is_filed():
    box = DepositBox()
    box.max_bytes = 10
    seen = box.wait(-1, 0.0)
    filer = threading.Timer(0.05, lambda: box.file("k", "p", b"d"))
    filer.start()
    try:
        assert box.wait(seen, timeout=30.0) == seen + 1
    finally:
        filer.join()
    assert box.wait(seen + 1, timeout=0.0) == seen + 1  # nothing new: at once
