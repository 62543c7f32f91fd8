"""A round's trace and its replay: a node's local steps (dropout, carried hidden state, AdamW's moments from earlier
rounds, a reset mid-round) recorded as the node records them, sent over the wire, and replayed by a validator's
Replayer to the same update; updates that training did not produce (ALIE's shift, a scaled one, one from another
start) fail the judgement; malformed traces are refused with the field named."""

import dataclasses
import struct

import pytest
import torch

from cotrain.averaging.attacks import make_attack
from cotrain.data.streams import StreamBatches
from cotrain.optim import build_optimizer
from cotrain.tasks import build_task
from cotrain.verification.replay import START_SLACK, Replayer, judge, not_replayable
from cotrain.verification.trace import TraceError, TraceRecorder, encode_trace

from tiny_swarm import tiny_config

STEPS = 12


@pytest.fixture(scope="module")
def run(corpus_file):
    """A node's round 3 of the tiny run with dropout and two layers: rounds 1 and 2 only fill the optimizer's
    moments and the carried state, then the round is traced; -> (cfg, read, global params, contribution, trace)."""
    cfg = tiny_config(corpus_file, model={"num_layers": 2, "dropout": 0.2})
    data = corpus_file.read_bytes()
    read = lambda offset, length: data[offset:offset + length]  # noqa: E731
    split = (0, len(data) * 9 // 10)
    task = build_task(cfg)
    torch.manual_seed(3)
    model = task.build_model(None)
    optimizer = build_optimizer(model, cfg.optimizer)
    batches = StreamBatches(read, 0, split[1] // 8, cfg.data.batch_size, cfg.data.seq_len, split=split)
    recorder, state = TraceRecorder(), None
    for round_number in (1, 2, 3):
        start = torch.cat([p.detach().reshape(-1).clone() for p in model.parameters()])
        for step in range(STEPS):
            x, y, _ = batches.next_batch()
            if round_number == 3 and step == 5:
                state = None  # a new unit mid-round: the carried state is dropped
            recorder.before_step(round_number, step, list(model.parameters()), optimizer, state, 0.01 + 0.001 * step,
                                 batches.last_ranges())
            for group in optimizer.param_groups:
                group["lr"] = 0.01 + 0.001 * step
            loss, state, _ = task.step(model, (x, y), state, torch.device("cpu"))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(list(model.parameters()), cfg.optimizer.grad_clip)
            optimizer.step()
            state = model.detach_state(state)
    end = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    trace = recorder.take(3)
    assert recorder.take(2) is None and trace is not None and len(trace.steps) == STEPS
    return cfg, read, start, start - end, trace


def test_an_honest_round_replays_to_its_contribution_through_the_wire(run):
    cfg, read, global_params, contribution, trace = run
    assert not_replayable(cfg) == ""
    replayer = Replayer(cfg, read)
    data = memoryview(encode_trace(trace))
    assert len(data) <= replayer.max_trace_bytes(len(trace.steps))
    received = replayer.decode(data, 0)
    assert received.device == "cpu" and received.steps == trace.steps
    assert replayer.decode(memoryview(encode_trace(dataclasses.replace(trace, device="other"))), 0).device == "other"
    verdict = judge(contribution, global_params, received, replayer.replay(received), START_SLACK["none"])
    assert verdict.passed, verdict.reason
    assert verdict.cosine > 0.9999 and abs(verdict.norm_ratio - 1) < 1e-3, verdict


@pytest.mark.parametrize("attack", ["alie", "scale", "random", "sign_flip"])
def test_an_update_training_did_not_produce_fails(run, attack):
    cfg, read, global_params, contribution, trace = run
    claimed = make_attack(attack, seed=5)(contribution.clone())
    replayed = Replayer(cfg, read).replay(trace)
    verdict = judge(claimed, global_params, trace, replayed, START_SLACK["none"])
    assert not verdict.passed, verdict


def test_a_round_that_claims_to_begin_elsewhere_fails(run):
    """A member choosing the start could have honest steps end where it wants: the start is bound to the global
    parameters, up to what its codec leaves unsent."""
    cfg, read, global_params, contribution, trace = run
    replayed = Replayer(cfg, read).replay(trace)
    moved = global_params + 0.1 * replayed  # the trace's start is the node's; the global parameters elsewhere
    verdict = judge(contribution + 0.1 * replayed, moved, trace, replayed, START_SLACK["int8"])
    assert not verdict.passed and "began" in verdict.reason, verdict
    assert judge(contribution + 0.01 * replayed, moved - 0.09 * replayed, trace, replayed, START_SLACK["int8"]).passed


def test_rows_outside_the_split_or_of_the_wrong_length_are_refused(run):
    cfg, read, _, _, trace = run
    replayer = Replayer(cfg, read)
    wrong = [(a, b - 1) for a, b in trace.steps[0].rows]
    bad = type(trace)(trace.start, trace.optimizer, trace.carried, trace.rng,
                      (type(trace.steps[0])(0.01, True, tuple(wrong)),))
    with pytest.raises(TraceError, match=r"steps\[0\]\.rows"):
        replayer.replay(bad)


def test_malformed_traces_are_refused_with_the_field_named(run):
    cfg, read, _, _, trace = run
    replayer = Replayer(cfg, read)
    data = encode_trace(trace)
    with pytest.raises(TraceError, match="magic"):
        replayer.decode(memoryview(b"XXXX" + data[4:]), 0)
    with pytest.raises(TraceError, match="trailing"):
        replayer.decode(memoryview(data + b"\0"), 0)
    with pytest.raises(TraceError, match="truncated"):
        replayer.decode(memoryview(data[:-3]), 0)
    with pytest.raises(TraceError, match="start"):  # another model's size
        replayer.decode(memoryview(data[:4] + struct.pack("<Q", 10) + data[12:]), 0)
    nan_start = bytearray(data)
    nan_start[12:16] = struct.pack("<f", float("nan"))
    with pytest.raises(TraceError, match="non-finite"):
        replayer.decode(memoryview(bytes(nan_start)), 0)


def test_runs_whose_rounds_cannot_be_replayed_say_why(corpus_file):
    assert "overlap" in not_replayable(tiny_config(corpus_file, averaging={"overlap": True}))
    assert "compression" in not_replayable(tiny_config(corpus_file, compression={"kind": "topk"}))
    assert "optimizer" in not_replayable(tiny_config(corpus_file, optimizer={"kind": "lamb"}))
