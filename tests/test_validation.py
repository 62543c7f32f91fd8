"""The coordinator's validator on a real (tiny) model and corpus: an honest contribution passes, a free rider's,
a scaled one's and noise fail, evidence not signed by the node's record key fails before any scoring; repeated
failures suspend the node; a node is asked for a round's evidence at most once; evidence other than what the node's
reducers took in fails; a round replayed from its trace passes when honest and fails when shifted (ALIE), which the
loss score lets through."""

import dataclasses
import random
import types

import pytest
import torch
from torch.nn import functional as F
from hivemind.utils.crypto import RSAPrivateKey

from cotrain.coordinator.validation import BOUND, Candidate, Validator, spread_windows
from cotrain.coordinator.workunits import plan_ranges
from cotrain.data import Corpus
from cotrain.averaging.attacks import make_attack
from cotrain.models import build_model
from cotrain.optim import build_optimizer
from cotrain.verification.evidence import EvidenceKeeper
from cotrain.verification.trace import TraceRecorder
from cotrain.verification.witness import MAX_PARTS_SEEN, PartSeen, part_digest, part_statement

from tiny_swarm import tiny_config

RUN, PEER = "run-1-0123abcd", "QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N"


@pytest.fixture(scope="module")
def setting(corpus_file):
    # replays are drawn only where a test asks for them (replay_rate 1.0)
    cfg = tiny_config(corpus_file, verification={"enabled": True, "sample_rate": 1.0, "replay_rate": 0.0})
    corpus = Corpus.from_source(str(corpus_file), 0, cfg.data.val_fraction)
    ranges = plan_ranges(corpus.train.start, corpus.train.end, 16384, 1024)
    torch.manual_seed(0)
    model = build_model(cfg)
    opt = build_optimizer(model, cfg.optimizer)
    params = list(model.parameters())

    def train(unit, steps, recorder=None):
        for step in range(steps):
            offsets = [unit[0] + (unit[1] - unit[0] - 33) * k // 8 + step * 33 % 512 for k in range(8)]
            if recorder is not None:  # the node's record of its round (the state is not carried here)
                recorder.before_step(3, step, params, opt, None, cfg.optimizer.lr, [(o, o + 33) for o in offsets])
            rows = [torch.frombuffer(bytearray(corpus.read(o, 33)), dtype=torch.uint8) for o in offsets]
            batch = torch.stack(rows).long()
            logits, _ = model(batch[:, :-1], None)
            loss = F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, cfg.optimizer.grad_clip)
            opt.step()

    for unit in ranges[2:8]:  # the swarm's rounds so far, on other units
        train(unit, 40)
    start = [p.detach().clone() for p in model.parameters()]
    recorder = TraceRecorder()
    train(ranges[0], 30, recorder)  # an honest node's round: 30 steps on its own unit, the first one
    honest = torch.cat([(s - p.detach()).reshape(-1) for s, p in zip(start, model.parameters())])
    return cfg, corpus, ranges, start, honest, recorder


@pytest.fixture(scope="module")
def key():
    return RSAPrivateKey()


def validator(setting, rng_seed=0, replay_rate=0.0):
    cfg, corpus, ranges = setting[:3]
    cfg = cfg.model_copy(update={"verification": cfg.verification.model_copy(update={"replay_rate": replay_rate})})
    return Validator(cfg, RUN, corpus, own_units=lambda node_id: [[ranges[0]]], all_units=[[r] for r in ranges],
                     rng=random.Random(rng_seed), now=lambda: 1000.0)


def evidence(key, setting, contribution, round_number=3, reads=(), traced=False):
    keeper = EvidenceKeeper(key, RUN, PEER, traced=traced)
    if traced:
        keeper.recorder = setting[5]
    keeper.note_read(reads)
    keeper.keep(round_number, "hash", setting[3], contribution)
    return keeper.encoded(round_number)


def who(key, node_id="node-a"):
    return Candidate(node_id, "swarm", PEER, key.get_public_key().to_bytes())


def test_an_honest_contribution_passes(setting, key):
    check = validator(setting).check(who(key), 3, evidence(key, setting, setting[4]))
    assert check.passed, check.reason


@pytest.mark.parametrize("attack, failed", [
    ("zeros", "zero"),
    ("scale", "no_gain"),
    ("sign_flip", "no_gain"),
    ("noise", "no_gain"),
])
def test_attacks_fail_the_loss_score(setting, key, attack, failed):
    honest = setting[4]
    g = torch.Generator().manual_seed(1)
    contribution = {"zeros": torch.zeros_like(honest), "scale": honest * 10, "sign_flip": -honest,
                    "noise": torch.randn(honest.shape, generator=g) * honest.norm() / honest.numel() ** 0.5 * 10}[attack]
    check = validator(setting).check(who(key), 3, evidence(key, setting, contribution))
    assert not check.passed and check.failed in (failed, "blows_up"), check
    assert check.weight == 1.0


def test_a_replayed_round_passes_when_honest_and_fails_when_shifted_as_the_loss_score_does_not(setting, key):
    honest = setting[4]
    shifted = make_attack("alie", seed=3)(honest.clone())
    assert validator(setting).check(who(key), 3, evidence(key, setting, shifted)).passed  # the loss score: a gain
    check = validator(setting, replay_rate=1.0).check(who(key), 3, evidence(key, setting, honest, traced=True))
    assert check.passed and "replayed 30 steps" in check.reason, check
    check = validator(setting, replay_rate=1.0).check(who(key), 3, evidence(key, setting, shifted, traced=True))
    assert not check.passed and check.failed == "replay" and check.weight == 1.0, check
    # a replay drawn for evidence without a trace fails: a node of a replayable run always records one
    check = validator(setting, replay_rate=1.0).check(who(key), 3, evidence(key, setting, honest))
    assert not check.passed and check.failed == "replay", check


def test_a_gpu_nodes_round_with_dropout_that_does_not_replay_here_is_inconclusive(setting, key):
    """Dropout on a GPU draws from the GPU's generator: a CPU's replay of such a round cannot tell, and a mismatch
    weighs nothing (without dropout a GPU's round replays to rounding, and is judged)."""
    cfg, corpus, ranges = setting[:3]
    gpu_trace = dataclasses.replace(setting[5].take(3), device="other")
    keeper = EvidenceKeeper(key, RUN, PEER, traced=True)
    keeper.recorder = types.SimpleNamespace(take=lambda round_number: gpu_trace)
    keeper.keep(3, "hash", setting[3], make_attack("alie", seed=3)(setting[4].clone()))
    shifted = keeper.encoded(3)
    with_dropout = cfg.model_copy(update={"model": cfg.model.model_copy(update={"dropout": 0.1}),
                                          "verification": cfg.verification.model_copy(update={"replay_rate": 1.0})})
    v = Validator(with_dropout, RUN, corpus, own_units=lambda node_id: [[ranges[0]]], all_units=[[r] for r in ranges],
                  rng=random.Random(0), now=lambda: 1000.0)
    check = v.check(who(key), 3, shifted)
    assert not check.passed and check.failed == "replayed_elsewhere" and check.weight == 0.0, check
    check = validator(setting, replay_rate=1.0).check(who(key), 3, shifted)  # no dropout: judged
    assert check.failed == "replay" and check.weight == 1.0, check


def test_a_nodes_first_check_replays_and_so_does_each_after_a_failed_one(setting, key):
    v = validator(setting, replay_rate=1e-9)  # no replay by the draw
    honest = evidence(key, setting, setting[4], traced=True)
    first = v.check(who(key), 3, honest)
    v.record(who(key), first)
    second = v.check(who(key), 3, honest)
    v.record(who(key), second)
    assert first.replayed and first.passed and second.passed and not second.replayed
    assert v.verdicts()["node-a"].replayed == 1
    failed = v.check(who(key), 3, evidence(key, setting, setting[4] * 10, traced=True))
    v.record(who(key), failed)
    assert not failed.passed and failed.weight == 1.0 and not failed.replayed
    assert v.wants("node-a", 10) == 10  # on probation again: asked every round
    probation = setting[0].verification.probation_checks
    for _ in range(probation):  # every check on probation replays
        check = v.check(who(key), 3, honest)
        v.record(who(key), check)
        assert check.passed and check.replayed, check
    assert not v.check(who(key), 3, honest).replayed  # probation over: back to the draw
    assert v.verdicts()["node-a"].replayed == 1 + probation


def test_the_bytes_a_node_read_are_scored_and_must_lie_in_its_units(setting, key):
    own = setting[2][0]
    read = [(own[0] + 1000, own[0] + 3000)]
    assert validator(setting).check(who(key), 3, evidence(key, setting, setting[4], reads=read)).passed
    elsewhere = setting[2][5]
    check = validator(setting).check(who(key), 3, evidence(key, setting, setting[4],
                                                           reads=[(elsewhere[0], elsewhere[0] + 500)]))
    assert not check.passed and check.failed == "reads" and "no work unit" in check.reason


def test_evidence_signed_by_another_key_fails_before_scoring(setting, key):
    other = RSAPrivateKey()
    check = validator(setting).check(who(key), 3, evidence(other, setting, setting[4]))
    assert not check.passed and check.failed == "commitment" and "signature" in check.reason


def test_evidence_of_another_round_or_garbage_fails(setting, key):
    v = validator(setting)
    assert v.check(who(key), 4, evidence(key, setting, setting[4], round_number=3)).failed == "malformed"
    garbage = v.check(who(key), 3, b"\x00" * 100)
    assert not garbage.passed and garbage.failed == "malformed" and "evidence." in garbage.reason


def test_repeated_failures_suspend_the_node_and_only_it(setting, key):
    v = validator(setting)
    zeros = evidence(key, setting, torch.zeros_like(setting[4]))
    for r in range(3):
        v.record(who(key), v.check(who(key), 3, zeros))
    v.record(who(key, "node-b"), v.check(who(key, "node-b"), 3, evidence(key, setting, setting[4])))
    assert v.suspended() == {"node-a"}
    verdicts = v.verdicts()
    assert verdicts["node-a"].suspended and verdicts["node-a"].fails == 3 and "weight 3" in verdicts["node-a"].reason
    assert not verdicts["node-b"].suspended and verdicts["node-b"].fails == 0
    assert v.wants("node-a", 10) == 0  # a suspended node is asked for nothing
    assert v.weight("node-b") == 1.0 and v.weight("node-z") == 1.0  # passed, or never checked


def test_a_failed_check_lowers_the_weight_a_credential_carries(setting, key):
    v = validator(setting)
    v.record(who(key), v.check(who(key), 3, evidence(key, setting, torch.zeros_like(setting[4]))))
    assert v.weight("node-a") == pytest.approx(2 / 3)  # the prior of 2 passes against one failure


def test_a_new_node_is_checked_every_round_then_at_the_sample_rate(setting, key, corpus_file):
    cfg, corpus, ranges = setting[:3]
    cfg = cfg.model_copy(update={"verification": cfg.verification.model_copy(
        update={"sample_rate": 0.01, "probation_checks": 2})})
    v = Validator(cfg, RUN, corpus, own_units=lambda node_id: [[ranges[0]]], all_units=[[r] for r in ranges],
                  rng=random.Random(0), now=lambda: 1000.0)
    honest = evidence(key, setting, setting[4])
    for r in (1, 2):  # on probation: asked every round
        assert v.wants("node-a", r) == r
        v.record(who(key), v.check(who(key), 3, honest))
    assert sum(v.wants("node-a", r) > 0 for r in range(3, 103)) < 10  # then about 1 in 100


def test_a_round_is_asked_for_once_and_only_that_round_is_taken(setting, key):
    v = validator(setting)  # sample_rate 1: every offered round is drawn
    assert v.wants("node-a", 5) == 5 and v.requested("node-a") == 5
    assert v.wants("node-a", 5) == 0  # offered again: not drawn again
    assert v.wants("node-a", 4) == 0  # an older round
    assert v.offer(who(key), 5, b"x") == "" and v.requested("node-a") == 0


def test_the_queue_of_uploads_is_bounded_in_number_and_in_bytes(setting, key, monkeypatch):
    import cotrain.coordinator.validation as validation

    v = validator(setting)  # its thread is not started: nothing leaves the queue
    assert all(v.offer(who(key), r, b"x") == "" for r in range(validation.MAX_QUEUED))
    assert "busy" in v.offer(who(key), 99, b"x")
    monkeypatch.setattr(validation, "MAX_QUEUED_BYTES", 1000)
    v = validator(setting)
    assert v.offer(who(key), 1, b"x" * 600) == "" and "busy" in v.offer(who(key), 2, b"x" * 600)
    assert v.offer(who(key), 3, b"x" * 400) == ""  # what is refused holds no room
    assert v.refused == 1


def test_windows_spread_over_the_units_and_stay_inside():
    ranges = [(0, 1000), (5000, 5100)]
    offsets = spread_windows(ranges, 6, 33)
    assert len(offsets) == 6
    assert all(any(a <= o and o + 33 <= b for a, b in ranges) for o in offsets)
    assert len(set(offsets)) == 6
    assert spread_windows([(0, 10)], 4, 33) == []


def test_a_repeated_contribution_is_caught_by_its_commitment(setting, key):
    v = validator(setting)
    keeper = EvidenceKeeper(key, RUN, PEER)
    same = setting[4]
    keeper.keep(3, "h3", setting[3], same)
    keeper.keep(4, "h4", setting[3], same)  # a stale update: round 3's again
    assert v.take_commitments(who(key), keeper.commitments()) == ""
    assert v.verdicts()["node-a"].fails == 1 and "repeats its own of round 3" in v.verdicts()["node-a"].reason
    assert v.take_commitments(who(key), keeper.commitments()) == ""  # seen: nothing counted twice
    assert v.verdicts()["node-a"].fails == 1
    other = EvidenceKeeper(key, RUN, PEER)  # another node sending the same bytes in round 5 copied node-a's
    other.keep(5, "h5", setting[3], same)
    v.take_commitments(who(key, "node-b"), other.commitments())
    assert "repeats node node-a's of round 3" in v.verdicts()["node-b"].reason


def test_commitments_not_signed_by_the_node_or_malformed_are_refused(setting, key):
    v = validator(setting)
    keeper = EvidenceKeeper(RSAPrivateKey(), RUN, PEER)
    keeper.keep(3, "h", setting[3], setting[4])
    assert "signature" in v.take_commitments(who(key), keeper.commitments())
    assert "commitment" in v.take_commitments(who(key), [b"junk"])
    assert "at most" in v.take_commitments(who(key), [b"junk"] * 9)
    assert "node-a" not in v.verdicts()  # refused, not held against the node: its session is not its signature


def test_all_zero_contributions_are_left_to_the_loss_score(setting, key):
    v = validator(setting)
    keeper = EvidenceKeeper(key, RUN, PEER)
    for r in (3, 4):
        keeper.keep(r, "h", setting[3], torch.zeros_like(setting[4]))
    v.take_commitments(who(key), keeper.commitments())
    assert "node-a" not in v.verdicts()


def test_the_book_is_saved_and_a_restarted_coordinator_takes_it_back(setting, key):
    from cotrain.coordinator.server import load_book

    saved = []
    cfg, corpus, ranges = setting[:3]
    v = Validator(cfg, RUN, corpus, own_units=lambda node_id: [[ranges[0]]], all_units=[[r] for r in ranges],
                  rng=random.Random(0), now=lambda: 1000.0, save=saved.append)
    v.record(who(key), v.check(who(key), 3, evidence(key, setting, torch.zeros_like(setting[4]))))
    assert saved and saved[-1]["nodes"]["node-a"]["fails"] == 1.0
    import json
    back = load_book(json.dumps(saved[-1]))
    assert back.nodes["node-a"].fails == 1.0
    assert load_book("{not json") is None and load_book('{"nodes": 1}') is None and load_book(None) is None


# ---- the evidence bound to what the group took in (cotrain.verification.witness) ----------------------------------

def reducer(key_of_reducer, node_id="node-r", peer="QmReducerPeer000000000000000000000000000000000"):
    return Candidate(node_id, "swarm", peer, key_of_reducer.get_public_key().to_bytes())


def signed_part(key, round_number, start, end, whole, member=PEER):
    """A report of the part [start, end) of ``whole`` that ``member`` (whose record key is ``key``) signed and
    sent."""
    digest, contribution = part_digest(whole[start:end]), part_digest(whole)
    return PartSeen(round_number, member, start, end, digest,
                    key.sign(part_statement(RUN, round_number, member, start, end, digest, contribution)), contribution)


def test_evidence_that_matches_what_the_reducers_took_in_passes(setting, key):
    honest, v = setting[4], validator(setting)
    half = honest.numel() // 2
    for node, (a, b) in (("node-r", (0, half)), ("node-s", (half, honest.numel()))):
        refused = v.take_parts_seen(reducer(RSAPrivateKey(), node, f"Qm{node}"),
                                    [signed_part(key, 3, a, b, honest)])
        assert refused == ""
    check = v.check(who(key), 3, evidence(key, setting, honest))
    assert check.passed, check.reason


def test_a_node_that_signed_and_sent_its_group_another_contribution_fails(setting, key):
    honest, v = setting[4], validator(setting)
    sent = -10 * honest  # what the group took in, signed by the node; its evidence shows the honest one
    v.take_parts_seen(reducer(RSAPrivateKey()), [signed_part(key, 3, 0, honest.numel(), sent)])
    check = v.check(who(key), 3, evidence(key, setting, honest))
    assert not check.passed and check.failed == BOUND and check.weight == 1.0


def test_a_part_that_differs_from_the_contribution_it_names_fails(setting, key):
    honest, v = setting[4], validator(setting)
    half = honest.numel() // 2
    mixed = honest.clone()
    mixed[half:] *= -10  # signed as a part of the honest contribution, but other values
    digest, whole = part_digest(mixed[half:]), part_digest(honest)
    lie = PartSeen(3, PEER, half, honest.numel(), digest,
                   key.sign(part_statement(RUN, 3, PEER, half, honest.numel(), digest, whole)), whole)
    v.take_parts_seen(reducer(RSAPrivateKey()), [signed_part(key, 3, 0, half, honest), lie])
    check = v.check(who(key), 3, evidence(key, setting, honest))
    assert not check.passed and check.failed == BOUND


def test_a_failed_try_of_the_round_is_no_contradiction_beside_the_try_that_went_through(setting, key):
    honest, v = setting[4], validator(setting)
    earlier = 0.9 * honest  # the round's first try, with fewer steps; its group failed, the node tried again
    v.take_parts_seen(reducer(RSAPrivateKey(), "node-r", "QmR"), [signed_part(key, 3, 0, honest.numel(), earlier)])
    v.take_parts_seen(reducer(RSAPrivateKey(), "node-s", "QmS"), [signed_part(key, 3, 0, honest.numel(), honest)])
    check = v.check(who(key), 3, evidence(key, setting, honest))
    assert check.passed, check.reason
    # a report of another round binds nothing of this one
    other = validator(setting)
    other.take_parts_seen(reducer(RSAPrivateKey()), [signed_part(key, 4, 0, honest.numel(), -10 * honest)])
    assert other.check(who(key), 3, evidence(key, setting, honest)).passed


def test_a_reducer_cannot_frame_a_node_with_a_report_it_did_not_sign(setting, key):
    honest, v = setting[4], validator(setting)
    liar = RSAPrivateKey()
    forged = signed_part(liar, 3, 0, honest.numel(), -honest)  # signed with the reducer's own key, not the node's
    assert v.take_parts_seen(reducer(liar), [forged]) == ""  # well formed: taken, and checked against the node's key
    check = v.check(who(key), 3, evidence(key, setting, honest))
    assert check.passed, check.reason


def test_a_report_of_ones_own_contribution_is_no_witness(setting, key):
    honest, v = setting[4], validator(setting)
    v.take_parts_seen(who(key), [signed_part(key, 3, 0, honest.numel(), -honest)])
    assert v.parts_seen(PEER, 3) == []


SIG, D = bytes(344), bytes(32)


@pytest.mark.parametrize("part, field", [
    (PartSeen(0, PEER, 0, 10, bytes(32), SIG, D), "parts_seen.round"),
    (PartSeen(3, "", 0, 10, bytes(32), SIG, D), "parts_seen.member"),
    (PartSeen(3, "Q" * 500, 0, 10, bytes(32), SIG, D), "parts_seen.member"),
    (PartSeen(3, PEER, 10, 10, bytes(32), SIG, D), "parts_seen.start, end"),
    (PartSeen(3, PEER, 0, 2 ** 50, bytes(32), SIG, D), "parts_seen.start, end"),
    (PartSeen(3, PEER, 0, 10, bytes(31), SIG, D), "parts_seen.digest"),
    (PartSeen(3, PEER, 0, 10, bytes(32), b"", D), "parts_seen.signature"),
    (PartSeen(3, PEER, 0, 10, bytes(32), bytes(5000), D), "parts_seen.signature"),
    (PartSeen(3, PEER, 0, 10, bytes(32), SIG, bytes(3)), "parts_seen.contribution"),
])
def test_malformed_reports_are_refused_naming_the_field(setting, part, field):
    v = validator(setting)
    assert v.take_parts_seen(reducer(RSAPrivateKey()), [part]).startswith(field)
    assert v.parts_seen(part.member, part.round) == [] and v.refused == 1


def test_a_heartbeat_carries_a_bounded_number_of_reports(setting):
    v = validator(setting)
    parts = [PartSeen(3, f"QmMember{i}", 0, 10, bytes(32), SIG, D) for i in range(MAX_PARTS_SEEN + 5)]
    assert "at most" in v.take_parts_seen(reducer(RSAPrivateKey()), parts)
    assert sum(len(v.parts_seen(f"QmMember{i}", 3)) for i in range(MAX_PARTS_SEEN + 5)) == MAX_PARTS_SEEN
