"""Experts of a decentralized mixture served over the data plane: an :class:`ExpertHost` holds some of a grid's
experts and trains them on the gradients its callers send back; :class:`RemoteExperts` is a trainer's view of them,
the :class:`cotrain.moe.mixture.Experts` of its mixture layer.

Both talk over hivemind's libp2p daemon, which the node's DHT started (each a client of its own of that daemon, on
an asyncio loop of its own, as the exchange is: no second daemon, no extra port). Every call carries the caller's
credential and the host serves only members of the run, the peer libp2p authenticated (the same
:class:`~cotrain.averaging.admission.Admission` as the exchange's): a stranger can neither use the experts nor train
them. A call is hostile until checked: an unknown expert, a shape that is not ``(rows, chunk, dim)``, more than
:data:`MAX_STEPS` time steps, values that do not fill the shape or are not finite, are refused with the field named.

A forward is computed without keeping anything; a backward computes the expert's forward again with the gradient
kept (Learning@home's hosts do the same: a host keeps no state between a trainer's two calls) and hands the
inputs' gradient back, and the host steps the expert's optimizer every ``update_every`` backward calls. A call that
gets no answer within ``timeout_s`` is left out (the mixture renormalizes over the answers that came,
:func:`cotrain.moe.gating.mix`), and its expert is not asked again for ``down_s``.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Mapping, Optional, Sequence

import numpy as np
import torch
from hivemind.dht import DHT
from hivemind.p2p import P2P, P2PContext, PeerID
from torch import nn

from cotrain.averaging.admission import Admission
from cotrain.averaging.exchange import daemon_listen_maddr
from cotrain.averaging.fetching import PEER_ERRORS
from cotrain.moe.expert_state import Restored, encode_expert, load_optimizer_state
from cotrain.v1 import coordinator_pb2 as cpb
from cotrain.v1 import swarm_pb2 as pb

logger = logging.getLogger(__name__)

#: time steps (rows x chunk) one call carries at most: a trainer's batch of 64 rows of 256 steps, several times over
MAX_STEPS = 1 << 16
#: the most bytes of values one call carries (its inputs, and a backward's gradients too): hivemind's daemon takes
#: messages of 4 MiB at most, so a trainer asks for the rows of a large batch in pieces. A backward piece is a step of
#: the expert's optimizer on its host (as a call of another trainer is)
PIECE_BYTES = 3 << 20


def expert_namespace(run_id: str) -> str:
    """Where a run's expert hosts serve on the data plane (their handler's prefix)."""
    return f"{run_id}_experts"


class CallError(ValueError):
    """A call that is malformed; the message names the field."""


def encode_values(t: torch.Tensor) -> bytes:
    return t.detach().to(torch.float32).cpu().contiguous().numpy().astype("<f4", copy=False).tobytes()


def decode_values(data: bytes, shape: Sequence[int], field: str) -> torch.Tensor:
    """Float32 values of ``shape`` from a peer's bytes; CallError naming ``field`` when they do not fit."""
    if len(data) != 4 * math.prod(shape):
        raise CallError(f"{field}: {len(data)} bytes, {4 * math.prod(shape)} for shape {list(shape)}")
    values = torch.from_numpy(np.frombuffer(data, dtype="<f4").astype(np.float32)).view(*shape)
    if not bool(torch.isfinite(values).all()):
        raise CallError(f"{field}: non-finite values")
    return values


class _OnDaemon:
    """An asyncio loop on a thread of its own, and a client of the DHT's libp2p daemon made on it."""

    def __init__(self, dht: DHT, name: str):
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=name, daemon=True)
        self._thread.start()
        self.p2p: P2P = self.run(self._replica(dht), timeout=60)
        self.peer_id: PeerID = self.p2p.peer_id

    async def _replica(self, dht: DHT) -> P2P:
        return await P2P.replicate(dht.run_coroutine(daemon_listen_maddr))

    def run(self, coro, timeout: Optional[float] = None):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def close(self, before=None) -> None:
        """Close the replica (after ``before``, a coroutine function) and stop the loop; once."""
        if not self._thread.is_alive():
            return

        async def stop():
            try:
                if before is not None:
                    await before()
                await self.p2p.shutdown()  # a replica: the DHT's daemon lives on
            except PEER_ERRORS as e:
                logger.debug("closing the p2p replica: %r", e)

        try:
            self.run(stop(), timeout=5)
        except Exception as e:  # noqa: BLE001 - the loop is stopped below either way
            logger.warning("closing the p2p replica did not finish cleanly: %r", e)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)


class ExpertHost(_OnDaemon):
    """Serves ``experts`` (uid -> module taking ``(rows, chunk, dim)``) to the members ``admission`` admits, under
    ``namespace``; each expert trains with AdamW at ``lr`` on what its callers send back."""

    def __init__(self, dht: DHT, namespace: str, admission: Admission, experts: Mapping[str, nn.Module], dim: int,
                 lr: float = 1e-3, update_every: int = 1):
        self.handler_name = f"{namespace}.expert"
        self.admission, self.dim, self.update_every, self.lr = admission, dim, max(1, update_every), lr
        self._lock = threading.Lock()  # the experts held change while calls are served (assign)
        self.experts: dict[str, nn.Module] = {}
        self.optimizers: dict[str, torch.optim.Optimizer] = {}
        self._pending: dict[str, int] = {}  # backward calls since an expert's last step
        self._served: dict[str, list[int]] = {}  # uid -> [forward, backward] calls it answered
        self._updates: dict[str, int] = {}  # uid -> optimizer steps taken
        self._started_from: dict[str, int] = {}  # uid -> its steps when this host took it
        self._compute = ThreadPoolExecutor(1, thread_name_prefix="experts")  # one call computes at a time
        self.assign(list(experts), experts.__getitem__)
        self.refused = 0
        super().__init__(dht, f"experts-{namespace}")
        self.run(self.p2p.add_protobuf_handler(self.handler_name, self._serve, pb.ExpertCall), timeout=30)

    def assign(self, uids: Sequence[str], make) -> list[str]:
        """Hold the experts ``uids`` from now on: those new made with ``make(uid)`` (a module, or a
        :class:`~cotrain.moe.expert_state.Restored` checkpoint with its optimizer's state), the others dropped.
        -> the uids dropped."""
        with self._lock:
            dropped = [uid for uid in self.experts if uid not in uids]
            for uid in dropped:
                del self.experts[uid], self.optimizers[uid], self._pending[uid], self._updates[uid]
                del self._started_from[uid]
            new = [uid for uid in uids if uid not in self.experts]
        made = {uid: make(uid) for uid in new}  # a checkpoint's download: not under the lock calls take
        with self._lock:
            for uid, thing in made.items():
                restored = thing if isinstance(thing, Restored) else None
                module = restored.module if restored is not None else thing
                optimizer = torch.optim.AdamW(module.parameters(), lr=self.lr)
                if restored is not None:
                    load_optimizer_state(optimizer, restored)
                self.experts[uid], self.optimizers[uid] = module, optimizer
                self._pending[uid] = 0
                self._updates[uid] = self._started_from[uid] = restored.updates if restored is not None else 0
        return dropped

    def updates(self) -> dict[str, int]:
        """uid -> the optimizer steps each expert held has taken (restored from its checkpoint, then here)."""
        with self._lock:
            return dict(self._updates)

    def checkpoint(self, uid: str, timeout: float = 60.0) -> Optional[bytes]:
        """``uid``'s weights and optimizer state as checkpoint bytes (None when no longer held), taken between two
        calls (on the thread that computes them, so never halfway through a step)."""
        def encode() -> Optional[bytes]:
            with self._lock:
                module, optimizer = self.experts.get(uid), self.optimizers.get(uid)
            return None if module is None else encode_expert(uid, module, optimizer)

        return self._compute.submit(encode).result(timeout)

    def holds(self) -> list[str]:
        with self._lock:
            return list(self.experts)

    def served(self) -> list[cpb.ExpertLoad]:
        """What each expert held did here: calls answered since this host started, its optimizer's steps, and the
        steps it had when this host took it."""
        with self._lock:
            return [cpb.ExpertLoad(uid=uid, forward=forward, backward=backward, updates=self._updates[uid],
                                   started_from=self._started_from[uid])
                    for uid in self.experts for forward, backward in [self._served.get(uid, (0, 0))]]

    @property
    def calls(self) -> dict[str, int]:
        """Calls answered since this host started, by kind (every expert's, those given up included)."""
        with self._lock:
            return {"forward": sum(f for f, _ in self._served.values()),
                    "backward": sum(b for _, b in self._served.values())}

    def _inputs(self, call: pb.ExpertCall) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        if call.uid not in self.experts:
            raise CallError(f"uid: {call.uid[:64]!r} is not an expert of this host")
        shape = list(call.shape)
        if len(shape) != 3 or shape[2] != self.dim or not 1 <= shape[0] * shape[1] <= MAX_STEPS:
            raise CallError(f"shape: {shape[:4]}, expected (rows, chunk, {self.dim}) of at most {MAX_STEPS} steps")
        x = decode_values(call.inputs, shape, "inputs")
        grad = decode_values(call.grad_outputs, shape, "grad_outputs") if call.backward else None
        return x, grad

    async def _serve(self, call: pb.ExpertCall, context: P2PContext) -> pb.ExpertAnswer:
        verdict = self.admission.check(call.credential, str(context.remote_id), "an expert call")
        if not verdict.ok:
            self.refused += 1
            return pb.ExpertAnswer(refused=verdict.reason)
        try:
            x, grad = self._inputs(call)
        except CallError as e:
            self.refused += 1
            return pb.ExpertAnswer(refused=str(e))
        out = await asyncio.get_running_loop().run_in_executor(self._compute, self._answer, call.uid, x, grad)
        if out is None:
            return pb.ExpertAnswer(refused=f"uid: {call.uid[:64]!r} is no longer held by this host")
        return pb.ExpertAnswer(values=encode_values(out))

    def _answer(self, uid: str, x: torch.Tensor, grad: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
        with self._lock:
            expert, optimizer = self.experts.get(uid), self.optimizers.get(uid)
            if expert is not None:
                self._served.setdefault(uid, [0, 0])[grad is not None] += 1
        if expert is None:  # given up since the call was checked
            return None
        if grad is None:
            with torch.no_grad():
                return expert(x)
        x.requires_grad_(True)
        expert(x).backward(grad)
        with self._lock:
            due = uid in self._pending and self._pending[uid] + 1 >= self.update_every
            if uid in self._pending:
                self._pending[uid] = 0 if due else self._pending[uid] + 1
        if due:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            with self._lock:
                if uid in self._updates:
                    self._updates[uid] += 1
        return x.grad

    def shutdown(self) -> None:
        self.close(before=lambda: self.p2p.remove_protobuf_handler(self.handler_name))
        self._compute.shutdown(wait=False, cancel_futures=True)


class _Call(torch.autograd.Function):
    """An expert's answer, computed on its host, as a node of this process's graph: its backward asks the host."""

    @staticmethod
    def forward(ctx, x, y, client, expert):
        ctx.save_for_backward(x)
        ctx.client, ctx.expert = client, expert
        return y.clone()

    @staticmethod
    def backward(ctx, grad_y):
        (x,) = ctx.saved_tensors
        return ctx.client.backward(ctx.expert, x, grad_y), None, None, None


class RemoteExperts(_OnDaemon):
    """The experts of a grid on their hosts, for a mixture layer of this process: ``hosts`` maps an expert's index
    in the grid to its uid and the peer that hosts it. ``admission`` presents this peer's credential."""

    def __init__(self, dht: DHT, namespace: str, admission: Admission, hosts: Mapping[int, tuple[str, PeerID]],
                 timeout_s: float = 5.0, down_s: float = 30.0):
        self.handler_name = f"{namespace}.expert"
        self.admission, self.hosts = admission, dict(hosts)
        self.timeout_s, self.down_s = timeout_s, down_s
        self._down_until: dict[int, float] = {}
        self.failed = {"forward": 0, "backward": 0}
        self.refusals: dict[int, str] = {}  # expert -> the last reason its host refused a call
        super().__init__(dht, f"experts-client-{namespace}")

    def set_hosts(self, hosts: Mapping[int, tuple[str, PeerID]]) -> None:
        """Where the experts live from now on (the coordinator moved some): an expert on another host than before
        may be asked at once, whatever its last host did."""
        hosts = dict(hosts)
        for expert, where in hosts.items():
            if self.hosts.get(expert) != where:
                self._down_until.pop(expert, None)
        self.hosts = hosts  # one assignment: a call reads either map whole

    def available(self) -> list[int]:
        now, hosts = time.monotonic(), self.hosts
        return sorted(e for e in hosts if self._down_until.get(e, 0.0) <= now)

    async def _call(self, expert: int, x: torch.Tensor, grad: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
        """The expert's answer for all of ``x``'s rows, asked for in pieces of :data:`PIECE_BYTES` at most (the
        daemon's messages are bounded), side by side; None when any piece failed."""
        where = self.hosts.get(expert)
        kind = "backward" if grad is not None else "forward"
        if where is None:  # its host left between the routing and the call
            self.failed[kind] += 1
            return None
        uid, peer = where
        rows = max(1, PIECE_BYTES // (4 * math.prod(x.shape[1:]) * (2 if grad is not None else 1)))
        pieces = [(x[at:at + rows], grad[at:at + rows] if grad is not None else None)
                  for at in range(0, x.shape[0], rows)]
        try:
            answers = await asyncio.wait_for(asyncio.gather(
                *[self._piece(uid, peer, expert, px, pg) for px, pg in pieces]), self.timeout_s)
            return torch.cat(answers).to(x.dtype)
        except (asyncio.TimeoutError, CallError, *PEER_ERRORS) as e:
            self.failed[kind] += 1
            self._down_until[expert] = time.monotonic() + self.down_s
            logger.debug("expert %s on ...%s: %s failed: %r", uid, str(peer)[-8:], kind, e)
            return None

    async def _piece(self, uid: str, peer: PeerID, expert: int, x: torch.Tensor,
                     grad: Optional[torch.Tensor]) -> torch.Tensor:
        call = pb.ExpertCall(credential=self.admission.credential(), uid=uid, backward=grad is not None,
                             shape=list(x.shape), inputs=encode_values(x),
                             grad_outputs=encode_values(grad) if grad is not None else b"")
        answer = await self.p2p.call_protobuf_handler(peer, self.handler_name, call, pb.ExpertAnswer)
        if answer.refused:
            self.refusals[expert] = answer.refused[:200]
            raise CallError(answer.refused[:200])
        return decode_values(answer.values, x.shape, "values")

    def __call__(self, requests: dict[int, torch.Tensor]) -> dict[int, Optional[torch.Tensor]]:
        order = list(requests)

        async def every():
            return await asyncio.gather(*[self._call(e, requests[e].detach(), None) for e in order])

        answers = self.run(every(), timeout=self.timeout_s + 10.0)
        return {e: None if y is None else _Call.apply(requests[e], y, self, e) for e, y in zip(order, answers)}

    def backward(self, expert: int, x: torch.Tensor, grad_y: torch.Tensor) -> torch.Tensor:
        """The gradient of ``x`` through ``expert``, from its host (which trains the expert on it); zeros when the
        host does not answer (its part of this step's gradient is lost, as its answer would have been)."""
        grad = self.run(self._call(expert, x.detach(), grad_y.detach()), timeout=self.timeout_s + 10.0)
        return torch.zeros_like(x) if grad is None else grad

    def shutdown(self) -> None:
        self.close()
