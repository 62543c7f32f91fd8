"""Round bookkeeping over the DHT, and the pure decision of when a round ends.

Each node publishes a small progress record (round, local steps and samples in the round, phase) under one DHT key,
one subkey per peer, every ``progress_interval`` seconds; records expire after three intervals, so a dead node
stops counting within seconds. Every node reads its key's records and calls :func:`round_decision`, a pure function of
(now, own progress, peers' progress, rules) that returns what to do and why. The reason is logged and reported
in heartbeats, so an operator can read why a round waited or why a node resynchronised.

The board at scale (``averaging.board_shards``): with one key, every node reads every record every interval, and
every DHT peer that answers returns them all: O(N) bytes a node, O(N^2) for the swarm (16 nodes on 2 cores spent
seconds on a read). With S shards the board is S keys, and a peer at round r publishes and reads only the key
:func:`shard_of` (run, r, peer) names. Its key then holds the round's peers of its shard (its candidate groupmates:
groups are planned among them) and, since every other peer's shard is drawn afresh each round, a random sample of
about N/S peers of every round: enough to see a peer ahead (resync) or behind. A read stays about N/S records
however large the swarm grows; pick S near N / (2 x target_group_size).

Only members count: every record carries its publisher's credential (:mod:`cotrain.averaging.admission`), DHT peers
refuse to store a record whose credential does not name the publishing peer and its signing key, and readers drop
such records too (a peer that kept one in its own storage cannot steer the rounds with it).
"""

from __future__ import annotations

import enum
import functools
import hashlib
from dataclasses import asdict, dataclass
from typing import Collection, Iterable, Optional

import pydantic.v1 as pydantic
from hivemind.dht import DHT
from hivemind.dht.crypto import RSASignatureValidator
from hivemind.dht.schema import BytesWithPublicKey, SchemaValidator
from hivemind.utils import ValueWithExpiration, get_dht_time
from hivemind.utils.crypto import RSAPrivateKey

from cotrain.averaging.admission import (MAX_CREDENTIAL_BYTES, Admission, MembershipValidator, public_key_bytes,
                                         split_owner_subkey)
from cotrain.averaging.dht import SEARCH_BEAM


class Action(enum.Enum):
    TRAIN = "train"  # keep taking local steps
    AVERAGE = "average"  # end the round: average the pseudo-gradients with the peers at this round
    RESYNC = "resync"  # a peer is ahead: download the shared state before going on


class Phase(str, enum.Enum):
    """Where a peer is, as its board record says (a str: the record carries its value)."""

    TRAIN = "train"  # taking local steps
    AVERAGE = "average"  # its round ended: it is averaging (peers at its round end theirs too)
    PAUSED = "paused"  # takes no steps for now (its owner uses the machine, or it waits for work): not waited for
    LEFT = "left"  # gone: its record says so rather than expiring


@dataclass(frozen=True)
class PeerProgress:
    peer_id: str
    round: int
    steps: int  # local steps taken in this round
    samples: int  # samples trained on in this round
    phase: Phase = Phase.TRAIN
    mid_round: bool = False  # joined (or resynchronised) after this round began: not waited for
    time: float = 0.0  # DHT time of the record
    reducer: bool = True  # False: nobody can dial it (behind NAT); it reduces no part, and cannot be met by peers
                          # that cannot be dialled either
    #: DHT time it began this round (applied the last, or downloaded the state): on a sharded board the round's
    #: groups are cut in the order its peers came (cotrain.averaging.groups.plan_arrival_groups)
    since: float = 0.0
    #: the samples of the rounds it applied so far, its own (the swarm's count: cotrain.averaging.ledger)
    contributed: int = 0

    def __post_init__(self):
        object.__setattr__(self, "phase", Phase(self.phase))  # a str from a record or a test: ValueError if unknown

    def to_record(self) -> dict:
        record = asdict(self)
        record.pop("peer_id")
        record["phase"] = self.phase.value
        return record

    @classmethod
    def from_record(cls, peer_id: str, record: dict) -> Optional["PeerProgress"]:
        try:
            return cls(peer_id=peer_id, round=int(record["round"]), steps=int(record["steps"]),
                       samples=int(record["samples"]), phase=Phase(record.get("phase", "train")),
                       mid_round=bool(record.get("mid_round", False)), time=float(record["time"]),
                       reducer=bool(record.get("reducer", True)), since=float(record.get("since", 0.0)),
                       contributed=max(0, int(record.get("contributed", 0))))
        except (KeyError, TypeError, ValueError):
            return None  # a malformed record from a buggy or hostile peer is ignored


@dataclass(frozen=True)
class RoundRules:
    inner_steps: int  # H
    round_wait: float  # seconds to keep training past H while slower peers catch up
    stale_after: float  # a record older than this is a peer that is gone


@dataclass(frozen=True)
class Decision:
    action: Action
    reason: str


def shard_of(seed: str, round_number: int, peer_id: str, shards: int, rounds_per_deal: int = 1) -> int:
    """The board shard a peer publishes to and reads at a round: a hash of (seed, round // ``rounds_per_deal``,
    peer), so that every peer computes every other's, and the peers are dealt out afresh every ``rounds_per_deal``
    rounds (groups form within a shard, and mix across the swarm from deal to deal)."""
    if shards <= 1:
        return 0
    digest = hashlib.sha1(f"{seed}/{round_number // max(1, rounds_per_deal)}/{peer_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % shards


def shard_key(run_id: str, shard: int) -> str:
    """The DHT key of a shard; shard 0 is the board's one key when it is not sharded."""
    return f"{run_id}_progress" if shard == 0 else f"{run_id}_progress_{shard}"


def groups_split(sharded: bool, target_group_size: int, live_count: int) -> bool:
    """Whether a round's peers average in several groups (round_decision's ``split``): the board is sharded, or it
    shows more live peers (``live_count``, ourselves out) than ``target_group_size`` (0: one group)."""
    return sharded or (target_group_size > 0 and live_count + 1 > target_group_size)


def board_steady(sharded: bool, same_reads: int, live: Collection[str], me: str, last_group: Collection[str]) -> bool:
    """Whether the board has nothing new to tell ``me``: its last ``same_reads`` + 1 reads showed the same ``live``
    peers (three at least), and they are exactly ``me`` and the groupmates of its last round (``last_group``: every
    peer there averages with it). Not on a sharded board, where each round is read afresh (its shard is dealt anew)."""
    return (not sharded and same_reads >= 2 and len(last_group) >= 1
            and frozenset(live) == frozenset((me, *last_group)))


def live_peers(now: float, me: PeerProgress, peers: Iterable[PeerProgress], rules: RoundRules) -> list[PeerProgress]:
    return [p for p in peers
            if p.peer_id != me.peer_id and now - p.time <= rules.stale_after and p.phase != Phase.LEFT]


def round_peers(now: float, me: PeerProgress, peers: Iterable[PeerProgress], rules: RoundRules,
                last_group: Collection[str] = ()) -> list[str]:
    """The other peers of ``me``'s round as the board shows them, and the groupmates of the round it just averaged
    (``last_group``: they applied the same round, so they are here or coming, though the board shows them behind
    until their next record: rounds shorter than ``progress_interval`` leave records several rounds behind).
    Paused peers are left out: they will not come to the round's meeting."""
    return [p.peer_id for p in live_peers(now, me, peers, rules) if p.phase != Phase.PAUSED
            and (p.round == me.round or (p.round < me.round and p.peer_id in last_group))]


def round_decision(now: float, me: PeerProgress, peers: Iterable[PeerProgress], rules: RoundRules,
                   reached_h_at: Optional[float] = None, alone_waits: bool = False,
                   split: bool = False, group: Optional[Collection[str]] = None) -> Decision:
    """What a node should do after a local step.

    ``reached_h_at``: when this node took its H-th step of the round (None while it has not). ``alone_waits``:
    ``peers`` is one shard of a sharded board, so seeing nobody there is not being alone in the swarm: wait up to
    ``round_wait`` for the shard's peers before averaging alone (an empty shard is rare at N/S of several peers,
    and a read made as the round began can miss shardmates that got there a moment later).

    ``split``: the round's peers average in several groups (``target_group_size`` below the swarm), which finish
    at different times. A group one round ahead is then no reason to throw this round's steps away and download
    its state, as long as some peer of this round is still here to average with; and the peers one round behind
    finish their round with their own group rather than resync to ours, so they are not waited for. In the virtual
    swarm (``bench/scale.py --virtual``, sharded, 300 and 1000 peers) peers averaged 3.6x the contributions a
    minute with a fourteenth of the resyncs; on one key at 100 peers, a tenth fewer contributions and a third of
    the resyncs.

    ``group``: with ``split``, the peer ids of this peer's planned group of the round; only they are waited for. The
    other groups of its shard finish on their own: waiting for every shardmate, a group at 32 nodes waited out
    ``round_wait`` for peers it was never to average with, at every round that dealt the shards anew.
    """
    live = live_peers(now, me, peers, rules)
    ahead = [p for p in live if p.round > me.round]
    if split and ahead and max(p.round for p in ahead) == me.round + 1 and any(
            p.round == me.round and p.phase != Phase.PAUSED for p in live):
        ahead = []  # finish this round with the peers still at it
        live = [p for p in live if p.round <= me.round]
    if ahead:
        lead = max(ahead, key=lambda p: p.round)
        return Decision(Action.RESYNC, f"peer {lead.peer_id[-8:]} is at round {lead.round}, we are at {me.round}")
    same = [p for p in live if p.round == me.round]
    averaging = [p for p in same if p.phase == Phase.AVERAGE]
    if averaging and me.steps > 0:
        return Decision(Action.AVERAGE, f"peer {averaging[0].peer_id[-8:]} began averaging round {me.round}")
    if me.steps < rules.inner_steps:
        return Decision(Action.TRAIN, f"{me.steps}/{rules.inner_steps} local steps")
    waited = now - (reached_h_at if reached_h_at is not None else now)
    if not live and alone_waits and waited < rules.round_wait:
        return Decision(Action.TRAIN, f"nobody else in this round's shard of the board yet: waiting up to "
                                      f"{rules.round_wait:g}s")
    if not live:
        return Decision(Action.AVERAGE, f"reached {rules.inner_steps} steps alone in "
                                        f"{'its shard of the board' if alone_waits else 'the swarm'}")
    # peers behind us resynchronise to our round (and are then not waited for); peers here are waited for
    waiting_on = [p for p in live if p.phase != Phase.PAUSED and (not split or group is None or p.peer_id in group)
                  and ((p.round < me.round and not (split and p.round == me.round - 1))
                       or (p.round == me.round and not p.mid_round and p.steps < rules.inner_steps))]
    if not waiting_on:
        return Decision(Action.AVERAGE, f"all {len(same) + 1} peers at round {me.round} reached their steps")
    if waited >= rules.round_wait:
        return Decision(Action.AVERAGE, f"waited {waited:.0f}s for {len(waiting_on)} slower peer(s): averaging without")
    names = ", ".join(p.peer_id[-8:] for p in waiting_on[:3])
    return Decision(Action.TRAIN, f"waiting for {len(waiting_on)} slower peer(s) ({names}) to reach round's end")


class ProgressRecord(pydantic.BaseModel):
    """What one peer may publish about itself. Strict types: the DHT rejects a record that does not match exactly."""

    round: pydantic.conint(strict=True, ge=0)
    steps: pydantic.conint(strict=True, ge=0)
    samples: pydantic.conint(strict=True, ge=0)
    phase: pydantic.constr(strict=True, max_length=16)
    mid_round: pydantic.StrictBool
    time: pydantic.StrictFloat
    reducer: pydantic.StrictBool
    #: required: hivemind's schema check refuses a record that parsing would add a default to
    since: pydantic.StrictFloat
    #: required too: its samples in the rounds it applied (bounded again by every reader: averaging.ledger)
    contributed: pydantic.conint(strict=True, ge=0, le=1 << 53)
    #: the publisher's SignedCredential
    cred: pydantic.conbytes(strict=True, max_length=MAX_CREDENTIAL_BYTES)


class ProgressSchema(pydantic.BaseModel):
    #: one subkey per peer: its peer id followed by its RSA public key (``[owner:...]``), and only the holder of that
    #: key can write it (hivemind's signature validator): no peer can overwrite or forge another peer's progress
    progress: dict[BytesWithPublicKey, Optional[ProgressRecord]]


_SHARDED_SCHEMA = "ProgressSchema_"


def progress_schema(shards: int) -> type:
    """The schema of a board of ``shards`` keys: :class:`ProgressSchema`'s field once per shard key."""
    return ProgressSchema if shards <= 1 else __getattr__(f"{_SHARDED_SCHEMA}{shards}")


@functools.lru_cache(maxsize=None)
def _sharded_schema(shards: int) -> type:
    field = (dict[BytesWithPublicKey, Optional[ProgressRecord]], None)
    schema = pydantic.create_model(f"{_SHARDED_SCHEMA}{shards}", **{
        shard_key("x", s)[len("x_"):]: field for s in range(shards)})
    schema.__module__ = __name__
    return schema


def __getattr__(name: str):
    """``ProgressSchema_<S>``, made on first use: validators travel to hivemind's DHT process pickled, the schema
    class by its name, and that process (forked before the board was made) makes it again from the name."""
    if name.startswith(_SHARDED_SCHEMA) and name[len(_SHARDED_SCHEMA):].isdigit():
        shards = int(name[len(_SHARDED_SCHEMA):])
        if 1 < shards <= 4096:
            return _sharded_schema(shards)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class ProgressBoard:
    """Publishes this node's progress and reads everyone's, on the DHT key ``{run_id}_progress``; also carries the
    coordinator's signed revocation list (key ``{run_id}_revocations``, under the coordinator's own subkey).

    The board installs record validators on its DHT peer: a schema for the key (records of another shape are
    refused by every peer that would store them), hivemind's RSA signature validator, so each peer's record is
    signed with its own key, and the members' check (:class:`MembershipValidator`). Give each board in one process
    its own ``private_key`` (hivemind otherwise shares one key per process); the coordinator's board only reads
    progress and publishes revocations.
    """

    def __init__(self, dht: DHT, run_id: str, ttl: float, admission: Admission,
                 private_key: Optional[RSAPrivateKey] = None, shards: int = 1, shard_rounds: int = 1):
        self.dht, self.run_id, self.ttl, self.shards = dht, run_id, ttl, max(1, int(shards))
        self.shard_rounds = max(1, int(shard_rounds))
        self.keys = [shard_key(run_id, s) for s in range(self.shards)]
        self.key = self.keys[0]
        self.revocations_key = f"{run_id}_revocations"
        self.admission = admission
        self.signer = RSASignatureValidator(private_key or RSAPrivateKey())
        validators = [SchemaValidator(progress_schema(self.shards), prefix=run_id), self.signer]
        if admission.enabled:
            validators.append(self._membership_validator())
        dht.add_validators(validators)
        self._validator_version = admission.revocations_version

    @property
    def record_public_key(self) -> bytes:
        """The key this board signs with, as it stands in its subkeys and in this peer's credential."""
        return self.signer.local_public_key[len(b"[owner:"):-1]

    def _membership_validator(self) -> MembershipValidator:
        a = self.admission
        return MembershipValidator(self.run_id, self.keys, public_key_bytes(a.public_key), a.revoked,
                                   a.revocations_version)

    def subkey(self, peer_id: str) -> bytes:
        return peer_id.encode() + self.signer.local_public_key

    def shard(self, round_number: int, peer_id: str) -> int:
        return shard_of(self.run_id, round_number, peer_id, self.shards, self.shard_rounds)

    def publish(self, progress: PeerProgress, shard: Optional[int] = None):
        """Store this peer's record under the key of its shard at its round (or ``shard``'s); -> the store's future
        (True once a DHT node, this one included, kept it)."""
        record = progress.to_record()
        record["time"] = float(get_dht_time())
        record["cred"] = self.admission.credential()
        if shard is None:
            shard = self.shard(progress.round, progress.peer_id)
        return self.dht.store(self.keys[shard], subkey=self.subkey(progress.peer_id), value=record,
                              expiration_time=get_dht_time() + self.ttl, return_future=True, beam_size=SEARCH_BEAM)

    # ---- revocations ---------------------------------------------------------------------------------------------
    def publish_revocations(self, signed: bytes, ttl: float) -> None:
        """The coordinator's signed revocation list, under its own (RSA-protected) subkey."""
        self.dht.store(self.revocations_key, subkey=self.signer.local_public_key, value=signed,
                       expiration_time=get_dht_time() + ttl, return_future=True, beam_size=SEARCH_BEAM)

    def read_revocations(self, timeout: float = 5.0) -> bool:
        """Apply the newest valid revocation list on the DHT (every subkey is tried: anyone may write one, only the
        coordinator's signature counts); True when it changed this peer's view."""
        try:
            found = self.dht.get(self.revocations_key, latest=True, return_future=True,
                                 beam_size=SEARCH_BEAM).result(timeout=timeout)
        except TimeoutError:
            return False
        changed = False
        if found is not None and isinstance(found.value, dict):
            for item in found.value.values():
                if isinstance(item, ValueWithExpiration) and isinstance(item.value, bytes):
                    changed = self.admission.apply_revocations(item.value) or changed
        self.sync_validator()
        return changed

    def sync_validator(self) -> None:
        """Hand the DHT process the revocations this peer knows (its validator is a copy)."""
        if self.admission.enabled and self.admission.revocations_version > self._validator_version:
            self._validator_version = self.admission.revocations_version
            self.dht.add_validators([self._membership_validator()])

    def read_all(self, timeout: float = 5.0) -> Optional[list[PeerProgress]]:
        """Every shard's records (a peer's newest where it is in two: it moved on a round between two reads); None
        when no shard could be read in time. O(N): for the coordinator, and for counting the swarm at a start."""
        futures = [self.dht.get(key, latest=True, return_future=True, beam_size=SEARCH_BEAM) for key in self.keys]
        newest: dict[str, PeerProgress] = {}
        answered = False
        for shard, future in enumerate(futures):
            try:
                found = future.result(timeout=timeout)
            except TimeoutError:
                continue
            answered = True
            for p in self._records(found):
                if p.peer_id not in newest or p.time > newest[p.peer_id].time:
                    newest[p.peer_id] = p
        return list(newest.values()) if answered else None

    def read(self, timeout: float = 5.0, shard: int = 0) -> Optional[list[PeerProgress]]:
        """The latest records in ``shard``'s key (with one shard, everyone's); None when the DHT did not answer in
        time (not the same as nobody there: a caller should keep what it knew, records carry their own time and go
        stale by themselves)."""
        try:
            found = self.dht.get(self.keys[shard], latest=True, return_future=True,
                                 beam_size=SEARCH_BEAM).result(timeout=timeout)
        except TimeoutError:
            return None
        return self._records(found)

    def _records(self, found) -> list[PeerProgress]:
        if found is None or not isinstance(found.value, dict):
            return []
        out = []
        for subkey, item in found.value.items():
            owner = split_owner_subkey(subkey)
            if owner is None or not isinstance(item, ValueWithExpiration) or not isinstance(item.value, dict):
                continue
            peer_id, record_key = owner
            cred = item.value.get("cred")
            verdict = self.admission.check(cred if isinstance(cred, bytes) else b"", peer_id, "a progress record",
                                           record_public_key=record_key)
            if not verdict.ok:
                continue
            parsed = PeerProgress.from_record(peer_id, item.value)
            if parsed is not None:
                out.append(parsed)
        return out
