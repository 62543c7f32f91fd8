"""One peer of bench/peers.py's hivemind rows: DiLoCo on hivemind's DecentralizedAverager, or hivemind.Optimizer.

    python bench/hivemind_peer.py --mode diloco|optimizer --config run.toml --rank R --world-size N --steps S \
        --out FOLDER [--eval-every K] [--H 50] [--outer-lr 0.7] [--outer-momentum 0.9] [--target-batch-size 96]

Each peer trains what bench/peers.py's other rows train (its :class:`peers.Worker`: cotrain's model and initial
weights, the R-th contiguous N-th of the training split in 32 streams, AdamW with the run's cosine schedule over
the row's samples (every peer's together), clip 1.0, one torch thread) and has a DHT of its own: peer 0 starts one
and writes its addresses to ``FOLDER/initial_peers.json``, the others join through them. Every peer waits for the
others before its first step, and for the others again after its last one before it shuts down, so that no peer
leaves a round that a slower one still needs.

- ``diloco``: every H local steps the pseudo-gradient (the round's global parameters minus the local ones) is
  averaged by a ``DecentralizedAverager`` (fp16 compression, groups of up to N, weight: the round's samples), and
  every peer applies the average to the global parameters with an outer ``SGD(lr, momentum, nesterov=True)``
  (0.7 / 0.9 by default, as BASELINES.md) and continues from them; the inner AdamW keeps its state across rounds. A
  round whose averaging fails (no group, a timeout) applies the peer's own pseudo-gradient. hivemind's all-reduce
  has no time limit of its own: ``allreduce_timeout`` bounds it, and the step's result is waited for with a timeout
  after which it is cancelled, so a round cannot hang the run.
- ``optimizer``: ``hivemind.Optimizer`` with ``target_batch_size`` (96), ``batch_size_per_step`` 32, fp16 gradient
  compression, ``matchmaking_time`` and its averagers' ``request_timeout`` from the flags (3.0 and 2.0: its docs say
  3-5 s for small local runs), and its documented defaults otherwise (synchronous: gradients accumulated to the
  target batch then averaged; parameters averaged every epoch, uncompressed; lagging peers download the state;
  ``averaging_timeout`` 60 s). A peer stops after ``--steps`` local steps and the end of the epoch in progress then
  (so that it takes part in that global step: at most ``--extra-steps`` more, a few samples past the budget), or
  once the swarm has taken the global steps (epochs of the target batch) that the budget makes, as cotrain's nodes
  stop at --max-steps or --max-rounds; the samples taken are reported. The inner optimizer is the run's AdamW
  clipping the averaged gradient to 1.0 before its step (as hivemind's ALBERT example clips inside its optimizer),
  and the cosine schedule runs over the epochs (one per 96 samples: the swarm's samples at epoch E are E x 96).
  The gradient averager gets its ``request_timeout`` through ``grad_averager_factory``: hivemind 1.1.12 hands
  ``averager_opts`` to the state averager only.

Bytes: every ``AveragingData`` message (the all-reduce's parts and averaged parts) and ``DownloadData`` message (state
served to a lagging peer) that this peer's averager processes hand to the libp2p daemon is counted, as protobuf
bytes (``P2P.send_protobuf`` is wrapped before the averagers fork; the counters live in shared memory).

hivemind 1.1.12 on this machine: averagers and optimizers are created on the main thread and SIGINT's handler is put
back afterwards; processes fork (hivemind's averagers would otherwise pickle their arguments); the averager or
optimizer is shut down before the DHT; its 8-bit codecs fail under numpy 2, so fp16 is used. At the end of a
hivemind.Optimizer row, a peer still in an epoch when the others have left looks for a group until
``averaging_timeout`` (60 s, its default) before it takes its step alone (hence the end of the epoch above).
The DHT process may log a FileNotFoundError from multiprocessing's resource sharer while the optimizer shuts down;
it is harmless (the peer exits 0).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import signal
import sys
import time
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

mp.set_start_method("fork", force=True)

import torch  # noqa: E402
from hivemind.p2p import P2P  # noqa: E402
from hivemind.proto import averaging_pb2  # noqa: E402

from peers import Worker, worker_parser  # noqa: E402

# ---- bytes handed to libp2p by this peer's averagers (forked processes: shared counters) ---------------------------
ALLREDUCE_SENT = mp.Value("q", 0)
STATE_SENT = mp.Value("q", 0)
_send_protobuf = P2P.send_protobuf


async def _counted_send_protobuf(protobuf, writer) -> None:
    counter = (ALLREDUCE_SENT if isinstance(protobuf, averaging_pb2.AveragingData)
               else STATE_SENT if isinstance(protobuf, averaging_pb2.DownloadData) else None)
    if counter is not None:
        with counter.get_lock():
            counter.value += protobuf.ByteSize()
    await _send_protobuf(protobuf, writer)


P2P.send_protobuf = staticmethod(_counted_send_protobuf)


class ClippedAdamW(torch.optim.AdamW):
    """AdamW that clips the (averaged) gradient's norm to ``max_norm`` before each step."""

    def __init__(self, params, max_norm: float, **kwargs):
        super().__init__(params, **kwargs)
        self.max_norm = max_norm

    @torch.no_grad()
    def step(self, closure=None):
        torch.nn.utils.clip_grad_norm_([p for g in self.param_groups for p in g["params"]], self.max_norm)
        return super().step(closure)


def schedule_factor(epoch: int, schedule, samples_per_epoch: int) -> float:
    """hivemind.Optimizer's LambdaLR factor at ``epoch``: the run's schedule at the samples the swarm has taken by
    then (``samples_per_epoch``, the target batch, each epoch)."""
    from cotrain.optim.schedule import lr_factor

    return lr_factor(schedule, epoch * samples_per_epoch)


def start_peer_dht(w: Worker):
    """Peer 0 starts the first DHT peer and writes its addresses; the others join through them."""
    from cotrain.averaging.dht import start_dht, visible_maddrs

    path = w.out / "initial_peers.json"
    if w.rank == 0:
        dht = start_dht([], host="127.0.0.1")
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(visible_maddrs(dht)))
        tmp.replace(path)
        return dht
    deadline = time.time() + 120
    while not path.exists():
        if time.time() > deadline:
            raise RuntimeError(f"peer 0 wrote no {path} within 120 s")
        time.sleep(0.1)
    return start_dht(json.loads(path.read_text()), host="127.0.0.1")


def on_main_thread(make):
    """hivemind replaces SIGINT's handler when it starts its processes: put the previous one back."""
    previous = signal.getsignal(signal.SIGINT)
    try:
        return make()
    finally:
        signal.signal(signal.SIGINT, previous)


def run_diloco(w: Worker, dht, args) -> dict:
    from hivemind import DecentralizedAverager
    from hivemind.compression import Float16Compression

    from cotrain.optim import build_optimizer

    params = list(w.model.parameters())
    global_params = [p.detach().clone() for p in params]
    outer = torch.optim.SGD(global_params, lr=args.outer_lr, momentum=args.outer_momentum, nesterov=True)
    inner = build_optimizer(w.model, w.cfg.optimizer)
    averager = on_main_thread(lambda: DecentralizedAverager(
        [torch.zeros_like(p) for p in params], dht, start=True, prefix="peers_diloco",
        target_group_size=args.world_size, min_group_size=2, min_matchmaking_time=args.matchmaking_time,
        request_timeout=args.request_timeout, allreduce_timeout=args.allreduce_timeout,
        compression=Float16Compression()))
    rounds = dict(ok=0, failed=0, group_sizes=[])
    try:
        w.barrier("start")
        for step in range(1, args.steps + 1):
            loss = w.local_step(w.model, inner, step - 1)
            if step % args.H == 0 or step == args.steps:
                average_round(w, averager, params, global_params, outer, args, rounds, step)
            w.after_step(step, loss)
        t_end = time.time()
        w.barrier("done", timeout=120)
    finally:
        averager.shutdown()
    return dict(t_end=t_end, rounds_ok=rounds["ok"], rounds_failed=rounds["failed"],
                group_sizes=rounds["group_sizes"])


def average_round(w: Worker, averager, params, global_params, outer, args, rounds: dict, step: int) -> None:
    """Average the pseudo-gradients (global - local) and take the outer step; the model continues from the new
    global parameters."""
    with torch.no_grad():
        deltas = [g - p.detach() for g, p in zip(global_params, params)]
        with averager.get_tensors() as tensors:
            for t, d in zip(tensors, deltas):
                t.copy_(d)
    control = averager.step(weight=float(args.H * w.cfg.data.batch_size), timeout=args.round_timeout, wait=False)
    try:
        gathered = control.result(timeout=args.round_timeout + args.allreduce_timeout + 10)
    except Exception as e:  # noqa: BLE001 - no group, a timeout, a peer that left: this round is local
        print(f"step {step}: averaging failed ({type(e).__name__}: {e}); own pseudo-gradient applied", flush=True)
        control.cancel()
        gathered = None
    if gathered:
        with averager.get_tensors() as tensors:
            averaged = [t.clone() for t in tensors]
        rounds["ok"] += 1
        rounds["group_sizes"].append(len(gathered))
    else:
        averaged = deltas
        rounds["failed"] += 1
    with torch.no_grad():
        for g, a in zip(global_params, averaged):
            g.grad = a.to(g.dtype)
        outer.step()
        outer.zero_grad(set_to_none=True)
        for p, g in zip(params, global_params):
            p.copy_(g)


def run_optimizer(w: Worker, dht, args) -> dict:
    import hivemind
    from hivemind.compression import Float16Compression
    from hivemind.optim.grad_averager import GradientAverager

    opt_cfg = w.cfg.optimizer
    downloads = [0]
    opt = on_main_thread(lambda: hivemind.Optimizer(
        dht=dht, run_id="peers_optimizer", target_batch_size=args.target_batch_size,
        batch_size_per_step=w.cfg.data.batch_size,
        optimizer=partial(ClippedAdamW, max_norm=opt_cfg.grad_clip, lr=opt_cfg.lr, betas=tuple(opt_cfg.betas),
                          weight_decay=opt_cfg.weight_decay),
        params=w.model.parameters(),
        scheduler=partial(torch.optim.lr_scheduler.LambdaLR, lr_lambda=partial(
            schedule_factor, schedule=w.schedule, samples_per_epoch=args.target_batch_size)),
        matchmaking_time=args.matchmaking_time, grad_compression=Float16Compression(),
        # hivemind 1.1.12 hands averager_opts to the state averager only: the gradient averager's request_timeout
        # (default 3.0, not below matchmaking_time) comes through its factory
        averager_opts=dict(request_timeout=args.request_timeout),
        grad_averager_factory=partial(GradientAverager, request_timeout=args.request_timeout), verbose=False))
    load_state = opt.load_state_from_peers

    def counted_load_state(*a, **kw):
        downloads[0] += 1
        return load_state(*a, **kw)

    opt.load_state_from_peers = counted_load_state
    # the budget: each peer's share of local steps, as cotrain's nodes have --max-steps. A peer that has taken its
    # share goes on until the global step (epoch) in progress is done, so that it takes part in that step's
    # all-reduce: a peer that left at once made the others look for it until averaging_timeout (60 s) in their
    # last epoch. It also stops once the swarm has taken the epochs the budget makes (a cotrain node's --max-rounds)
    epochs = args.steps * args.world_size * w.cfg.data.batch_size // args.target_batch_size
    step, share_epoch = 0, -1
    try:
        w.barrier("start")
        while opt.local_epoch < epochs:
            epoch_before = opt.local_epoch
            batch = w.next_batch()
            with w.computing():
                loss = w.loss(w.model, batch)
                loss.backward()
            opt.step()
            opt.zero_grad()
            step += 1
            if step == args.steps:
                share_epoch = epoch_before
            last = opt.local_epoch >= epochs or (step >= args.steps and (
                opt.local_epoch > share_epoch or step >= args.steps + args.extra_steps))
            w.after_step(step, loss.item(), last=last)
            if last:
                break
        t_end = time.time()
        epoch = opt.local_epoch
        # every peer's last parameters: the bench evaluates those of the peer with the most epochs, which peer 0,
        # when it ended out of sync, is not
        final_path = w.out / f"final-{w.rank}.pt"
        torch.save({n: p.detach().clone() for n, p in w.model.named_parameters()}, final_path)
    finally:
        opt.shutdown()
    w.barrier("done", timeout=120)
    return dict(t_end=t_end, steps=step, epochs=epoch, state_downloads=downloads[0], final_path=str(final_path),
                final_step=step)


def main() -> int:
    parser = worker_parser(__doc__)
    parser.add_argument("--mode", choices=("diloco", "optimizer"), required=True)
    parser.add_argument("--H", type=int, default=50, help="diloco: local steps per round")
    parser.add_argument("--outer-lr", type=float, default=0.7)
    parser.add_argument("--outer-momentum", type=float, default=0.9)
    parser.add_argument("--target-batch-size", type=int, default=96, help="optimizer: samples per global step")
    parser.add_argument("--extra-steps", type=int, default=10,
                        help="optimizer: local steps past --steps at most, to finish the epoch in progress")
    parser.add_argument("--matchmaking-time", type=float, default=3.0)
    parser.add_argument("--request-timeout", type=float, default=2.0)
    parser.add_argument("--allreduce-timeout", type=float, default=60.0, help="diloco: bound of one all-reduce")
    parser.add_argument("--round-timeout", type=float, default=30.0, help="diloco: seconds to find a group")
    args = parser.parse_args()
    if args.request_timeout >= args.matchmaking_time:
        parser.error("--request-timeout must be below --matchmaking-time")
    w = Worker(args)
    dht = start_peer_dht(w)
    try:
        result = (run_diloco if args.mode == "diloco" else run_optimizer)(w, dht, args)
    finally:
        dht.shutdown()
    t_end, steps = result.pop("t_end"), result.pop("steps", args.steps)
    w.finish(t_end, steps, bytes_sent=ALLREDUCE_SENT.value, state_bytes_sent=STATE_SENT.value, **result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
