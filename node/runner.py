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

from cotrain.averaging import Admission, RoundAverager, build_strategy, load_record_key
from cotrain.averaging.admission import AdmissionError, public_key_from_bytes
from cotrain.client import CoordinatorClient, CoordinatorUnavailable
from cotrain.config import RunConfig
from cotrain.models import count_parameters
from cotrain.moe.hosted import connect_trainer
from cotrain.moe.mixture import TooFewExperts
from cotrain.outage import Repeats
from cotrain.optim import build_optimizer
from cotrain.optim.schedule import Schedule, lr_factor
from cotrain.tasks import build_task
from cotrain.v1 import coordinator_pb2 as pb

from cotrain.averaging.attacks import OTHER_DATA, other_data
from cotrain.verification.evidence import EvidenceKeeper
from cotrain.verification.replay import not_replayable
from cotrain.node.data_plane import start_data_plane
from cotrain.node.identity import NodeIdentity
from cotrain.node.heartbeat import heartbeat_loop
from cotrain.node.options import NodeOptions
from cotrain.node.precision_step import StepPrecision
from cotrain.node.report import Metrics, node_metrics, status_figures
from cotrain.node.resume import save_last, warm_start
from cotrain.node.status_file import StatusFile
from cotrain.node.step_record import StepRecord
from cotrain.node.terminal import TerminalStatus
from cotrain.node.unit_reader import UnitReader
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
        self.evidence: Optional[EvidenceKeeper] = None
        self.admission: Optional[Admission] = None
        self.experts = None  # moe.experts = "hosted": the clients of the run's expert hosts (TrainerExperts)
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
        dht, client_mode, reply = start_data_plane(self.client, opts, response.initial_peers, record_key)
        self.reachability = reply.reachability
        self.admission.set_credential(reply.credential)
        self.admission.apply_revocations(reply.revocations)
        heartbeat = threading.Thread(target=self._heartbeat_loop, args=(response.heartbeat_interval_s,),
                                     name="heartbeat", daemon=True)
        if cfg.hosts_experts:
            self.experts = connect_trainer(dht, response.run.run_id, cfg, self.admission, model,
                                           lambda: self.client.experts(give_up_after=2.0), self.stop)
        opt_cfg = cfg.optimizer
        optimizer = build_optimizer(model, opt_cfg)
        # verification.enabled: each round's evidence, kept for the coordinator's validator
        self.evidence = (EvidenceKeeper(record_key, response.run.run_id, str(dht.peer_id),
                                        traced=cfg.verification.replay_rate > 0 and not not_replayable(cfg))
                         if cfg.verification.enabled else None)
        try:
            self.averaging = build_strategy(model, optimizer, dht, response.run.run_id, cfg, peer_id=str(dht.peer_id),
                                            admission=self.admission, client_mode=client_mode,
                                            upload_bps=opts.max_upload_mbps * 1e6, record_key=record_key,
                                            attack=opts.attack, overclaim=opts.claim_multiple,
                                            evidence=self.evidence)
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
            warm_start(self.averaging, self.client, response.run.run_id, opts.state_dir, opts.state_download_timeout)
            self._train(task, model, optimizer, cfg, device, response.run.train_bytes)
        finally:
            self.stop.set()
            if heartbeat.is_alive():
                heartbeat.join(timeout=5)
            try:
                if self.averaging is not None:
                    save_last(self.averaging, opts.state_dir, cfg)
                    # the averager before the DHT; it lets groupmates fetch our last pieces first, so the figures
                    # we leave with count every byte we sent
                    self.averaging.shutdown()
            finally:
                try:
                    self.client.leave(self.stop_reason or "done",
                                      self.node_metrics() if self.averaging is not None else None)
                except Exception as e:
                    logger.warning("could not tell the coordinator we leave: %s", e)
                if self.experts is not None:
                    self.experts.shutdown()
                dht.shutdown()
                self.client.close()

    def _train(self, task, model, optimizer, cfg: RunConfig, device, train_bytes: int) -> None:
        """Train on the coordinator's work units until told to stop; ``train_bytes``: the training split's size."""
        opt_cfg = cfg.optimizer
        schedule = Schedule.from_config(cfg)
        averaging = self.averaging
        precision = StepPrecision.for_run(cfg, device)  # and logs it with its reason
        logger.info("%s", lower_thread_priority(TRAINING_NICE))  # every thread the node needs runs already

        reader = UnitReader(task, self.client, self.stop, train_bytes)
        unit = self._next_unit()
        if unit is None:
            return  # stopped while waiting, or the coordinator went away before handing out any unit
        batches, unit_samples = reader.batches(unit), 0
        waiting: Optional[pb.WorkUnit] = None  # a unit granted whose bytes did not come yet: tried again next
        self.metrics.epoch = unit.epoch
        state = None
        started, last_log, last_status = time.monotonic(), time.monotonic(), 0.0
        last_trim = -math.inf
        status_round = -1  # the round of the last status.json
        status_file = StatusFile(self.options.state_dir / "status.json", self._status) if self.options.state_dir \
            else None
        record = StepRecord(self.options.step_record) if self.options.step_record else None
        tracer = self.evidence.recorder if self.evidence is not None else None
        params = list(model.parameters())
        self.metrics.started = started
        status = TerminalStatus()
        idle = IdleMonitor(OtherProcessesLoad()) if self.options.only_when_idle else None
        last_idle_check = 0.0
        too_few = Repeats(logger, every_s=30.0)
        while not self.stop.is_set():
            if batches.done:  # the unit is trained once: report it, take the next
                self.work.report(unit, unit_samples)
                following, waiting = waiting or self._next_unit(), None
                if following is None and self.stop.is_set():
                    break
                if following is not None:
                    try:  # granted just before the coordinator went away, its bytes may not come yet
                        batches = reader.batches(following, 1.0 if self.work.away_since else self.work.ask_timeout)
                    except CoordinatorUnavailable:
                        waiting, following = following, None
                if following is None:
                    logger.warning("no new work unit from the coordinator; training unit %d/%d again meanwhile",
                                   unit.epoch, unit.index)
                    batches = reader.batches(unit)  # kept: nothing to read
                unit, unit_samples, state = following or unit, 0, None
                self.metrics.epoch = unit.epoch
            if idle is not None and time.monotonic() - last_idle_check >= 5.0:
                last_idle_check = time.monotonic()
                self._pause_while_busy(idle, status)
                if self.stop.is_set():
                    break
            batch, reset_state = batches.next()
            if self.options.attack == OTHER_DATA:  # a bench's attacker: it trains on other data than its units'
                batch = other_data(batch)
            if self.evidence is not None and hasattr(batches, "last_ranges"):  # what a validator scores it on
                self.evidence.note_read(batches.last_ranges())
            if reset_state:
                state = None
            if self.stop.is_set():
                break
            compute_started = time.monotonic()
            # the run's schedule at the swarm's progress, not this node's steps: every member of the round takes
            # the same lr at the same local step, however fast it runs and whenever it joined (RoundClock)
            position = averaging.at  # this thread is the only one that moves it
            at = position.clock.samples_at(position.steps)
            lr = opt_cfg.lr * lr_factor(schedule, at)
            for group in optimizer.param_groups:
                group["lr"] = lr
            if tracer is not None:  # a validator's replay of the round (verification.replay_rate)
                tracer.before_step(position.round, position.steps, params, optimizer, state, lr, batches.last_ranges())
            if record is not None:
                record.step(position.round, position.steps, at, lr)
            try:
                with precision.autocast():
                    loss, state, samples = task.step(model, batch, state, device)
            except TooFewExperts as e:  # moe.experts = "hosted": the step waits for the experts' hosts
                too_few.info("too few experts", "step skipped: %s", e)  # one line every 30 s at most
                with self.metrics.lock:
                    self.metrics.skipped_steps += 1
                self.stop.wait(1.0)
                continue
            optimizer.zero_grad(set_to_none=True)
            # the step's one wait for the device (fp16 adds its overflow check): whether the loss is finite decides
            # the update. No other wait: the backward and optimizer step run on while the next batch is read
            value = loss.item()
            if not math.isfinite(value):
                logger.warning("step %d: loss is %s; update dropped", self.metrics.step, value)
            elif not precision.backward_and_step(loss, optimizer, averaging.local_step):
                logger.info("step %d: fp16 gradients overflowed; update dropped, loss scale now %g",
                            self.metrics.step, precision.scale())
            state = model.detach_state(state)
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

    def _status(self) -> dict:
        return status_figures(self.node_metrics(), self.metrics, self.averaging)

    def node_metrics(self) -> pb.NodeMetrics:
        return node_metrics(self.metrics, self.averaging, self.work.units_done, self.admission,
                            self.experts.calls_failed() if self.experts is not None else 0)

    def _heartbeat_loop(self, interval: float) -> None:
        def revocations_changed() -> None:
            if self.averaging is not None:
                self.averaging.board.sync_validator()

        heartbeat_loop(interval, stop=self.stop, metrics=self.metrics, report=self.node_metrics, client=self.client,
                       admission=self.admission, on_revocations=revocations_changed, request_stop=self.request_stop,
                       max_memory=self.options.max_memory, evidence=self.evidence)
