"""``cotrain node join``: a volunteer's node from join to leave.

join (gRPC) -> build the run's model -> start a DHT peer and the DiLoCo averager (main thread) -> download the
swarm's current state (warm start) -> train on the assigned data, averaging each round -> heartbeat all along ->
on Ctrl-C, SIGTERM or a DRAIN command: Leave, shut the averager down before the DHT, exit 0.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import math
import os
import signal
import threading
import time
from typing import Optional

import torch

from cotrain.averaging import Admission, RoundAverager, build_strategy, load_record_key, start_dht, visible_maddrs
from cotrain.averaging.admission import AdmissionError, public_key_from_bytes
from cotrain.checkpoint import (CheckpointError, decode_checkpoint, load_checkpoint, named_state,
                                save_checkpoint)
from cotrain.client import CoordinatorClient, CoordinatorUnavailable
from cotrain.config import RunConfig
from cotrain.models import count_parameters
from cotrain.optim import build_optimizer
from cotrain.optim.schedule import Schedule, lr_factor
from cotrain.protocol import DIAL_OUT_ONLY
from cotrain.tasks import build_task
from cotrain.v1 import coordinator_pb2 as pb

from cotrain.node.identity import NodeIdentity
from cotrain.node.heartbeat import heartbeat_loop
from cotrain.node.options import NodeOptions
from cotrain.node.report import Metrics, node_metrics, status_figures
from cotrain.node.status_file import StatusFile
from cotrain.node.step_record import StepRecord
from cotrain.node.terminal import TerminalStatus, download_progress
from cotrain.node.work import WorkQueue
from cotrain.memory import release_freed_memory
from cotrain.node.limits import (IdleMonitor, OtherProcessesLoad, format_cpu_list, lower_thread_priority, pin_cpus,
                                 read_cpu_max, torch_threads)

logger = logging.getLogger(__name__)

#: the node hands its freed heap back to the kernel at a new round, at most this often (seconds): a call costs the
#: training thread 5-8 ms and the next step 10-40 ms of page faults, 0.4% of a 2 s round at H=10, and the heap
#: fills again over minutes, not within a round (cotrain.memory.release_freed_memory)
TRIM_EVERY_S = 30.0

#: how much nicer the training thread is than the node's networking (its DHT process and libp2p daemon, the
#: progress board, the exchange, the averaging thread): when the CPUs are busy, the node's own steps must not starve
#: the messages its peers wait for. 16 nodes on 2 cores, every thread at one priority, lost their board reads to
#: timeouts: nodes saw themselves alone and averaged with nobody (bench/scale.py). An idle CPU runs it as fast
TRAINING_NICE = 10



def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


class Node:
    def __init__(self, options: NodeOptions):
        self.options = options
        self.stop = threading.Event()
        self.stop_reason = ""
        self.client = CoordinatorClient(options.coordinator, options.insecure, options.ca)
        self.metrics = Metrics()
        self.work = WorkQueue(self.client, self.stop)
        self.paused = False
        self.averaging: Optional[RoundAverager] = None
        self.admission: Optional[Admission] = None
        self.identity = NodeIdentity(options.state_dir, options.coordinator)

    # ---- signals -------------------------------------------------------------------------------------------------
    def _install_signal_handlers(self) -> None:
        def handler(signum, _frame):
            self.request_stop(f"received {signal.Signals(signum).name}")

        signal.signal(signal.SIGINT, handler)
        signal.signal(signal.SIGTERM, handler)

    def request_stop(self, reason: str) -> None:
        if not self.stop.is_set():
            self.stop_reason = reason
            logger.info("stopping: %s", reason)
        self.stop.set()

    # ---- main ----------------------------------------------------------------------------------------------------
    def run(self) -> None:
        self._install_signal_handlers()
        opts = self.options
        response = self.client.join(opts.token, opts.name, node_id=self.identity.saved_node_id())
        self.identity.save_node_id(response.node_id)
        cfg = RunConfig.from_toml(response.run.config_toml, origin="run config from the coordinator")
        logger.info("joined run %s as %s (node %s); %d initial peers", response.run.run_id, opts.name,
                    response.node_id[:8], len(response.initial_peers))
        pinned = bool(opts.max_cpus or opts.cpus)
        cpus = pin_cpus(opts.max_cpus, opts.cpus) if pinned else sorted(os.sched_getaffinity(0))
        if pinned:
            logger.info("limited to CPUs %s", format_cpu_list(cpus))
        # torch's default counts the machine's cores, not the CPUs this node may use (several nodes on one machine,
        # a container's quota): threads beyond those only take turns
        threads, why = torch_threads(cpus, read_cpu_max(), opts.threads, pinned)
        torch.set_num_threads(threads)
        with contextlib.suppress(RuntimeError):  # only before any inter-op work ran in this process
            torch.set_num_interop_threads(threads)
        logger.info("%d torch thread(s): %s", threads, why)
        # saturated recurrent gates produce denormal floats, which x86 CPUs process many times slower
        torch.set_flush_denormal(True)
        device = pick_device(cfg.device)
        task = build_task(cfg)
        model = task.build_model(list(response.run.byte_counts)).to(device)
        logger.info("model %s with %d parameters on %s", cfg.model.kind, count_parameters(model), device)

        if opts.state_dir:
            opts.state_dir.mkdir(parents=True, exist_ok=True)
        try:
            self.admission = Admission(response.run.run_id, public_key_from_bytes(response.coordinator_public_key),
                                       enabled=cfg.coordinator.data_plane_auth)
        except AdmissionError as e:
            raise SystemExit(f"the coordinator's JoinResponse: {e}") from None
        self.identity.keep_coordinator_key(response.coordinator_public_key)
        record_key = load_record_key(opts.state_dir / "records.key" if opts.state_dir else None)
        # hivemind forks its DHT (and averager) process from this one: what exists now is shared with it until either
        # writes to it, and a collection walking every object writes to every page holding one. Frozen objects are
        # never walked (nor freed: what exists now lives as long as the node anyway)
        gc.collect()
        gc.freeze()
        dht, client_mode = self._start_data_plane(response, record_key)
        heartbeat = threading.Thread(target=self._heartbeat_loop, args=(response.heartbeat_interval_s,),
                                     name="heartbeat", daemon=True)
        opt_cfg = cfg.optimizer
        optimizer = build_optimizer(model, opt_cfg)
        try:
            self.averaging = build_strategy(model, optimizer, dht, response.run.run_id, cfg, peer_id=str(dht.peer_id),
                                            admission=self.admission, client_mode=client_mode,
                                            upload_bps=opts.max_upload_mbps * 1e6, record_key=record_key,
                                            attack=opts.attack, overclaim=opts.claim_multiple)
            if opts.attack:
                logger.warning("BYZANTINE: this node sends %s-corrupted updates (--attack)", opts.attack)
            if opts.claim_multiple > 1:
                logger.warning("LIAR: this node claims %gx the samples it trains on (--claim-multiple)",
                               opts.claim_multiple)
            self._install_signal_handlers()  # hivemind may have replaced them
            heartbeat.start()  # from here on: it renews this node's credential, which waiting must not outlive
            if opts.wait_peers > 1:
                found = self.averaging.wait_for_peers(opts.wait_peers, opts.wait_peers_timeout, self.stop)
                logger.info("%d of %d peers present; starting", found, opts.wait_peers)
            self._warm_start(response.run.run_id)
            self._train(task, model, optimizer, cfg, device, response.run.train_bytes)
        finally:
            self.stop.set()
            if heartbeat.is_alive():
                heartbeat.join(timeout=5)
            try:
                if self.averaging is not None:
                    self._save_last(cfg)
                    # the averager before the DHT; it lets groupmates fetch our last pieces first, so the figures
                    # we leave with count every byte we sent
                    self.averaging.shutdown()
            finally:
                try:
                    self.client.leave(self.stop_reason or "done",
                                      self.node_metrics() if self.averaging is not None else None)
                except Exception as e:
                    logger.warning("could not tell the coordinator we leave: %s", e)
                dht.shutdown()
                self.client.close()

    def _start_data_plane(self, response: pb.JoinResponse, record_key):
        """Start the DHT peer and register it: the coordinator dials it and issues this node's credential. A node
        the coordinator cannot dial (behind NAT) restarts its DHT peer in client mode, so that its peers do not
        waste their rounds dialling an address nobody can reach. -> (DHT, client mode)."""
        opts = self.options
        identity = str(opts.state_dir / "dht.key") if opts.state_dir else None
        record_public = record_key.get_public_key().to_bytes()
        client_mode = opts.client_mode
        while True:
            dht = start_dht(response.initial_peers, host=opts.dht_host, port=opts.dht_port, client_mode=client_mode,
                            identity_path=identity, announce=opts.dht_announce)
            try:
                reply = self.client.register_peer(str(dht.peer_id), visible_maddrs(dht), record_public, client_mode)
            except BaseException:
                dht.shutdown()
                raise
            if reply.reachability == DIAL_OUT_ONLY and not client_mode and not opts.assume_public:
                logger.warning("%s; restarting the DHT peer in client mode", reply.reason)
                dht.shutdown()
                client_mode = True
                continue
            break
        self.reachability = reply.reachability
        logger.info("DHT peer %s is %s: %s", str(dht.peer_id)[-8:], reply.reachability, reply.reason)
        self.admission.set_credential(reply.credential)
        self.admission.apply_revocations(reply.revocations)
        return dht, client_mode

    def _warm_start(self, run_id: str) -> None:
        """Never random weights in a run that has progress: the state of the peer with the most progress, else
        the newer of the coordinator's latest checkpoint and this node's own last state, else the run's initial
        weights (a new run)."""
        averaging = self.averaging
        with download_progress("state from peers") as progress:
            if averaging.load_state_from_peers(timeout=self.options.state_download_timeout, on_progress=progress):
                logger.info("warm start: downloaded the swarm's state at round %d from a peer", averaging.round)
                return
        candidates = []
        with download_progress("checkpoint from the coordinator") as progress:
            data = self.client.get_checkpoint(on_progress=progress)
        if data is not None:
            try:
                candidates.append(("the coordinator's checkpoint", decode_checkpoint(data, "the coordinator's checkpoint")))
            except CheckpointError as e:
                logger.warning("%s", e)
        own = self.options.state_dir / "last.safetensors" if self.options.state_dir else None
        if own is not None and own.exists():
            try:
                candidates.append(("this node's last state", load_checkpoint(own)))
            except CheckpointError as e:
                logger.warning("%s", e)
        candidates = [(name, c) for name, c in candidates if c.metadata.get("run_id") == run_id]
        if candidates:
            name, best = max(candidates, key=lambda item: item[1].round)
            averaging.load_checkpoint(best)
            logger.info("warm start: no peer answered; resumed from %s at round %d", name, averaging.round)
        else:
            logger.info("no peer and no checkpoint has state yet: starting from the run's initial weights")

    def _train(self, task, model, optimizer, cfg: RunConfig, device, train_bytes: int) -> None:
        """Train on the coordinator's work units until told to stop; ``train_bytes``: the training split's size."""
        opt_cfg = cfg.optimizer
        schedule = Schedule.from_config(cfg)
        averaging = self.averaging
        logger.info("%s", lower_thread_priority(TRAINING_NICE))  # every thread the node needs runs already

        cache: dict = {}

        split = (0, int(train_bytes))

        def unit_data(unit: pb.WorkUnit, patience: float = 600.0):
            """The unit's training data: the bytes of its streams (spread over the training split), fetched once and
            kept while it is the node's unit (a unit is small: coordinator.unit_bytes), so that training it again
            while the coordinator is away needs nothing from the coordinator. World models collect their own data:
            no read. Raises CoordinatorUnavailable when the coordinator does not answer within ``patience`` seconds
            (the unit kept before stays)."""
            if task.needs_corpus and cache.get("key") != (unit.start, unit.end):
                pieces = [(s, self.client.read("train", s, e - s, stop=self.stop, give_up_after=patience))
                          for s, e in task.unit_ranges(unit.start, unit.end, split)]
                cache.update(key=(unit.start, unit.end), pieces=pieces)

            def read(offset: int, length: int) -> bytes:
                for start, data in cache["pieces"]:  # the batches never read across two streams
                    if start <= offset < start + len(data):
                        return data[offset - start: offset - start + length]
                return b""

            return task.train_data(read, unit.start, unit.end, unit.seed, split=split)

        unit = self._next_unit()
        if unit is None:
            return  # stopped while waiting, or the coordinator went away before handing out any unit
        batches, unit_samples = unit_data(unit), 0
        waiting: Optional[pb.WorkUnit] = None  # a unit granted whose bytes did not come yet: tried again next
        self.metrics.epoch = unit.epoch
        state = None
        started, last_log, last_status = time.monotonic(), time.monotonic(), 0.0
        last_trim = -math.inf
        status_round = -1  # the round of the last status.json
        status_file = StatusFile(self.options.state_dir / "status.json", self._status) if self.options.state_dir \
            else None
        record = StepRecord(self.options.step_record) if self.options.step_record else None
        self.metrics.started = started
        status = TerminalStatus()
        idle = IdleMonitor(OtherProcessesLoad()) if self.options.only_when_idle else None
        last_idle_check = 0.0
        while not self.stop.is_set():
            if batches.done:  # the unit is trained once: report it, take the next
                self.work.report(unit, unit_samples)
                following, waiting = waiting or self._next_unit(), None
                if following is None and self.stop.is_set():
                    break
                if following is not None:
                    try:  # granted just before the coordinator went away, its bytes may not come yet
                        batches = unit_data(following, 1.0 if self.work.away_since else self.work.ask_timeout)
                    except CoordinatorUnavailable:
                        waiting, following = following, None
                if following is None:
                    logger.warning("no new work unit from the coordinator; training unit %d/%d again meanwhile",
                                   unit.epoch, unit.index)
                    batches = unit_data(unit)  # kept: nothing to read
                unit, unit_samples, state = following or unit, 0, None
                self.metrics.epoch = unit.epoch
            if idle is not None and time.monotonic() - last_idle_check >= 5.0:
                last_idle_check = time.monotonic()
                self._pause_while_busy(idle, status)
                if self.stop.is_set():
                    break
            batch, reset_state = batches.next()
            if reset_state:
                state = None
            if self.stop.is_set():
                break
            compute_started = time.monotonic()
            # the run's schedule at the swarm's progress, not this node's steps: every member of the round takes
            # the same lr at the same local step, however fast it runs and whenever it joined (RoundClock)
            at = averaging.clock.samples_at(averaging.steps_in_round)
            lr = opt_cfg.lr * lr_factor(schedule, at)
            for group in optimizer.param_groups:
                group["lr"] = lr
            if record is not None:
                record.step(averaging.round, averaging.steps_in_round, at, lr)
            loss, state, samples = task.step(model, batch, state, device)
            optimizer.zero_grad(set_to_none=True)
            value = loss.item()
            if math.isfinite(value):
                loss.backward()
                averaging.local_step()
            else:
                logger.warning("step %d: loss is %s; update dropped", self.metrics.step, value)
            state = model.detach_state(state)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            if self.options.step_delay:  # a straggler for benches and tests: counted as compute, like a slow CPU
                self.stop.wait(self.options.step_delay)
            unit_samples += samples
            self.metrics.update(value, samples, time.monotonic() - compute_started, lr, at)
            averaging.after_local_step(samples)
            if record is not None:
                record.after_step(averaging)
            now = time.monotonic()
            if now - last_status >= 1.0:
                last_status = now
                status.update(f"step {self.metrics.step}  round {averaging.round}  loss {self.metrics.loss:.3f}  "
                              f"{self.metrics.samples_per_s:.1f} samples/s  group {averaging.stats.last_group_size}  "
                              f"sent {averaging.exchange.bytes_sent / 1e6:.1f} MB")
            if averaging.round != status_round and now - last_trim >= TRIM_EVERY_S:
                last_trim = now
                release_freed_memory()  # what the rounds' exchanges and states left freed in the heap
            if averaging.round != status_round or now - last_log >= self.options.log_every_s:
                status_round = averaging.round
                if status_file is not None:
                    status_file.due()
            if now - last_log >= self.options.log_every_s:
                last_log = now
                s = averaging.stats
                logger.info("step %d round %d loss %.3f %.1f samples/s group %d (%s)", self.metrics.step,
                            averaging.round, self.metrics.loss, self.metrics.samples_per_s, s.last_group_size,
                            s.last_reason)
            if self.options.max_rounds and averaging.round >= self.options.max_rounds:
                self.request_stop(f"reached --max-rounds {self.options.max_rounds}")
            if self.options.max_steps and self.metrics.step >= self.options.max_steps:
                self.request_stop(f"reached --max-steps {self.options.max_steps}")
            if self.options.duration and now - started >= self.options.duration:
                self.request_stop(f"ran for --duration {self.options.duration:g}s")
        status.stop()
        if status_file is not None:
            status_file.close()  # and the figures it leaves with
        if record is not None:
            record.close()

    def _next_unit(self) -> Optional[pb.WorkUnit]:
        """The next work unit, the node shown as paused on the progress board while it has to wait for one (every
        unit of the epoch may be held by others): a node that takes no steps must not be planned into a group or
        waited for. 16 nodes on a small corpus (bench/scale.py) had nodes waiting for a unit for a minute while
        their planned groupmates met again and again without them. Only a wait pauses: a record published during
        a mere exchange of messages would leave the node out of its peers' plans for an interval."""
        averaging = self.averaging
        if averaging is None:
            return self.work.next_unit()
        with contextlib.ExitStack() as waiting:  # paused from the wait's start to the unit
            return self.work.next_unit(on_wait=lambda: waiting.enter_context(averaging.paused()))

    def _pause_while_busy(self, idle: "IdleMonitor", status: "TerminalStatus") -> None:
        """--only-when-idle: while the machine is in use, stop training (peers do not wait for a paused node),
        keep heartbeating, and go on when it has been idle for a while."""
        decision = idle.check()
        if not decision.pause:
            return
        logger.info("%s", decision.reason)
        self.paused = True
        with self.averaging.paused():
            while decision.pause and not self.stop.is_set():
                status.update(f"paused: {decision.reason}")
                self.stop.wait(5.0)
                decision = idle.check()
        self.paused = False
        logger.info("%s", decision.reason)

    def _save_last(self, cfg: RunConfig) -> None:
        """Keep the node's copy of the shared model (``STATE_DIR/last.safetensors``) for a later resume."""
        if not self.options.state_dir:
            return
        a = self.averaging
        metadata, tensors = a.get_state()
        names = a.param_names
        s = a.stats.snapshot()
        save_checkpoint(self.options.state_dir / "last.safetensors", named_state(names, tensors),
                        dict(metadata, config_toml=cfg.to_toml(), rounds=list(s.history), time=time.time(),
                             states_averaged=s.states_averaged, resyncs=s.resyncs, groups_kept=s.groups_kept,
                             board_reads=s.board_reads, board_reads_skipped=s.board_reads_skipped,
                             rounds_hosted=s.rounds_hosted))

    def _status(self) -> dict:
        return status_figures(self.node_metrics(), self.metrics, self.averaging)

    def node_metrics(self) -> pb.NodeMetrics:
        return node_metrics(self.metrics, self.averaging, self.work.units_done, self.admission)

    def _heartbeat_loop(self, interval: float) -> None:
        def revocations_changed() -> None:
            if self.averaging is not None:
                self.averaging.board.sync_validator()

        heartbeat_loop(interval, stop=self.stop, metrics=self.metrics, report=self.node_metrics, client=self.client,
                       admission=self.admission, on_revocations=revocations_changed, request_stop=self.request_stop,
                       max_memory=self.options.max_memory)
