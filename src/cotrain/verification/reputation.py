"""Reputation: what the checks of a node's (and a token's) contributions add up to, decayed over time.

A reputation holds the weight of passed and failed checks, each halved every ``half_life_s`` seconds, and the times
of recent failures. Its **score** is ``(passes + prior) / (passes + fails + prior)``: 1 for a node never checked
(today's behaviour: every member counts fully), lower with every failure, and back up slowly, as passes add up and
failures fade. The score is the node's **weight multiplier** in aggregation, 0 once the node is to be suspended.

A node is to be **suspended** (its credential revoked through the revocation list) after ``suspend_fails`` failures'
weight within ``fail_window_s`` (a burst: an attacker that fails every check), or when its score falls below
``floor`` over at least ``min_evidence`` checks' weight (a slow burn: one that fails most checks). Every decision comes
with its reason in words, for status, health and the dashboard.

A token's reputation gets every check of each of its nodes (:class:`Book`): a token whose nodes keep failing is
suspended with all of them, however many fresh nodes it starts. Everything takes the time as an argument (``now``,
seconds); nothing reads a clock. :func:`to_dict` and :func:`from_dict` keep a reputation in a plain dict for the
coordinator's store; :func:`from_dict` checks every field and bound and raises :class:`ReputationError` naming the
field.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Optional

#: a failure weighs half after 12 hours: a node that failed a burst of checks needs about a day of passes to count
#: fully again, and an old mistake does not follow a node for ever
HALF_LIFE_S = 12 * 3600.0
#: as if every node had passed 2 checks: never-checked nodes count fully, one failure takes a third of the weight
#: (2/3), two take half, so a single false positive costs little
PRIOR_PASSES = 2.0
#: 3 failures' weight within 6 hours suspends: at one check in ten contributions and rounds of minutes, an attacker
#: that fails every check is out within hours; an honest node with a 1% false-positive rate and ~10 checks in the
#: window hits it about once in 10^4 windows
SUSPEND_FAILS = 3.0
FAIL_WINDOW_S = 6 * 3600.0
#: a node failing more than half of its checks over time is suspended, once there is evidence of 5 checks' weight
SCORE_FLOOR = 0.5
MIN_EVIDENCE = 5.0

#: bounds on what one check and a loaded dict may hold
MAX_CHECK_WEIGHT = 10.0
MAX_EVIDENCE = 1e9
MAX_RECENT_FAILS = 64
MAX_REASON_CHARS = 200
MAX_KEY_CHARS = 128
MAX_ENTRIES = 1_000_000
FIELDS = ("passes", "fails", "at", "recent_fails", "reason")


class ReputationError(ValueError):
    """A dict that is not a valid reputation (or book); the message names the field."""


@dataclass(frozen=True)
class Policy:
    half_life_s: float = HALF_LIFE_S
    prior_passes: float = PRIOR_PASSES
    suspend_fails: float = SUSPEND_FAILS
    fail_window_s: float = FAIL_WINDOW_S
    floor: float = SCORE_FLOOR
    min_evidence: float = MIN_EVIDENCE

    def __post_init__(self):
        for name in ("half_life_s", "prior_passes", "suspend_fails", "fail_window_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"policy.{name}: expected a finite positive number, got {value}")
        if not 0.0 <= self.floor < 1.0:
            raise ValueError(f"policy.floor: expected a number in [0, 1), got {self.floor}")
        if not (math.isfinite(self.min_evidence) and self.min_evidence >= 0):
            raise ValueError(f"policy.min_evidence: expected a finite number >= 0, got {self.min_evidence}")


DEFAULT_POLICY = Policy()


@dataclass(frozen=True)
class Reputation:
    """Checks' weight as of time ``at`` (decayed to it), recent failures as (time, weight), the latest failure's
    reason."""
    passes: float = 0.0
    fails: float = 0.0
    at: float = 0.0
    recent_fails: tuple[tuple[float, float], ...] = ()
    reason: str = ""


@dataclass(frozen=True)
class Suspension:
    suspend: bool
    reason: str


# ---- decisions -------------------------------------------------------------------------------------------------------
def decayed(rep: Reputation, now: float, policy: Policy = DEFAULT_POLICY) -> Reputation:
    """``rep`` as of ``now``. A ``now`` before ``rep.at`` (a clock stepped back) counts as ``rep.at``."""
    dt = max(0.0, now - rep.at)
    if dt == 0.0:
        return rep
    factor = 0.5 ** (dt / policy.half_life_s)
    return replace(rep, passes=rep.passes * factor, fails=rep.fails * factor, at=now)


def recorded(rep: Reputation, *, passed: bool, weight: float, now: float, reason: str = "",
             policy: Policy = DEFAULT_POLICY) -> Reputation:
    """``rep`` with one more check of ``weight`` (0 < weight <= MAX_CHECK_WEIGHT: how much the validator's
    verdict proves) at ``now``; ``reason``: the check's, kept for a failure."""
    if not (math.isfinite(weight) and 0.0 < weight <= MAX_CHECK_WEIGHT):
        raise ValueError(f"weight: expected a number in (0, {MAX_CHECK_WEIGHT}], got {weight}")
    rep = decayed(rep, now, policy)
    if passed:
        return replace(rep, passes=min(MAX_EVIDENCE, rep.passes + weight))
    recent = tuple(f for f in rep.recent_fails if f[0] > rep.at - policy.fail_window_s) + ((rep.at, weight),)
    return replace(rep, fails=min(MAX_EVIDENCE, rep.fails + weight), recent_fails=recent[-MAX_RECENT_FAILS:],
                   reason=reason[:MAX_REASON_CHARS])


def score(rep: Reputation, now: float, policy: Policy = DEFAULT_POLICY) -> float:
    """In (0, 1]: 1 with no failures, lower with each."""
    rep = decayed(rep, now, policy)
    return (rep.passes + policy.prior_passes) / (rep.passes + rep.fails + policy.prior_passes)


def suspension(rep: Reputation, now: float, policy: Policy = DEFAULT_POLICY) -> Suspension:
    """Whether ``rep`` has earned a suspension by ``now``, and why (or why not), in words."""
    now = max(now, rep.at)
    s = score(rep, now, policy)
    burst = sum(w for t, w in rep.recent_fails if t > now - policy.fail_window_s)
    hours = policy.fail_window_s / 3600
    latest = f" (latest: {rep.reason})" if rep.reason else ""
    if burst >= policy.suspend_fails:
        return Suspension(True, f"failed checks of weight {burst:.3g} within {hours:.3g} h "
                                f"(suspends at {policy.suspend_fails:.3g}){latest}")
    rep = decayed(rep, now, policy)
    evidence = rep.passes + rep.fails
    if evidence >= policy.min_evidence and s < policy.floor:
        return Suspension(True, f"score {s:.2f} below {policy.floor:.2f} over checks of weight {evidence:.3g}{latest}")
    if rep.fails > 0:
        return Suspension(False, f"score {s:.2f}, failed checks of weight {rep.fails:.3g}{latest}")
    return Suspension(False, f"score {s:.2f}, no failed check")


def weight_multiplier(rep: Reputation, now: float, policy: Policy = DEFAULT_POLICY) -> float:
    """The factor in [0, 1] on this contributor's aggregation weight: its score, 0 once it is to be suspended."""
    return 0.0 if suspension(rep, now, policy).suspend else score(rep, now, policy)


# ---- plain dicts (the coordinator's store) ---------------------------------------------------------------------------
def to_dict(rep: Reputation) -> dict[str, Any]:
    return dict(passes=rep.passes, fails=rep.fails, at=rep.at, recent_fails=[list(f) for f in rep.recent_fails],
                reason=rep.reason)


def _number(value: Any, name: str, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ReputationError(f"{name}: expected a number, got {type(value).__name__}")
    if not (math.isfinite(value) and low <= value <= high):
        raise ReputationError(f"{name}: {value} (between {low:g} and {high:g})")
    return float(value)


def from_dict(data: Any, where: str = "reputation") -> Reputation:
    """The reputation in ``data`` (as :func:`to_dict` writes it); ReputationError naming the field otherwise."""
    if not isinstance(data, dict):
        raise ReputationError(f"{where}: expected a dict, got {type(data).__name__}")
    for key in data:
        if key not in FIELDS:
            raise ReputationError(f"{where}.{str(key)[:40]}: unknown field")
    for key in FIELDS:
        if key not in data:
            raise ReputationError(f"{where}.{key}: missing")
    at = _number(data["at"], f"{where}.at", 0.0, 1e12)
    recent = data["recent_fails"]
    if not isinstance(recent, list) or len(recent) > MAX_RECENT_FAILS:
        raise ReputationError(f"{where}.recent_fails: expected a list of at most {MAX_RECENT_FAILS} [time, weight]")
    fails = []
    for i, f in enumerate(recent):
        if not isinstance(f, (list, tuple)) or len(f) != 2:
            raise ReputationError(f"{where}.recent_fails[{i}]: expected [time, weight]")
        t = _number(f[0], f"{where}.recent_fails[{i}].time", fails[-1][0] if fails else 0.0, at)
        fails.append((t, _number(f[1], f"{where}.recent_fails[{i}].weight", 1e-12, MAX_CHECK_WEIGHT)))
    reason = data["reason"]
    if not isinstance(reason, str) or len(reason) > MAX_REASON_CHARS:
        raise ReputationError(f"{where}.reason: expected a string of at most {MAX_REASON_CHARS} characters")
    return Reputation(passes=_number(data["passes"], f"{where}.passes", 0.0, MAX_EVIDENCE),
                      fails=_number(data["fails"], f"{where}.fails", 0.0, MAX_EVIDENCE), at=at,
                      recent_fails=tuple(fails), reason=reason)


# ---- nodes and tokens ------------------------------------------------------------------------------------------------
@dataclass
class Book:
    """The reputations of nodes and of the tokens they joined with, keyed by node id and by the token's name (never
    its secret). ``token_policy``: tokens run many nodes, so an operator may give them more room (None: the nodes'
    policy)."""
    policy: Policy = DEFAULT_POLICY
    token_policy: Optional[Policy] = None
    nodes: dict[str, Reputation] = field(default_factory=dict)
    tokens: dict[str, Reputation] = field(default_factory=dict)

    @property
    def _token_policy(self) -> Policy:
        return self.token_policy or self.policy

    def record(self, node_id: str, token_id: str, *, passed: bool, weight: float, now: float,
               reason: str = "") -> None:
        """One check of a contribution of ``node_id`` (joined with ``token_id``), counted for both."""
        self.nodes[node_id] = recorded(self.nodes.get(node_id, Reputation(at=now)), passed=passed, weight=weight,
                                       now=now, reason=reason, policy=self.policy)
        self.tokens[token_id] = recorded(self.tokens.get(token_id, Reputation(at=now)), passed=passed,
                                         weight=weight, now=now, reason=reason, policy=self._token_policy)

    def weight(self, node_id: str, token_id: str, now: float) -> float:
        """The node's weight multiplier: the lower of its own and its token's."""
        return min(weight_multiplier(self.nodes.get(node_id, Reputation(at=now)), now, self.policy),
                   weight_multiplier(self.tokens.get(token_id, Reputation(at=now)), now, self._token_policy))

    def suspension(self, node_id: str, token_id: str, now: float) -> Suspension:
        """Whether the node is to be suspended, for its own checks or its token's; the reason names which."""
        node = suspension(self.nodes.get(node_id, Reputation(at=now)), now, self.policy)
        token = suspension(self.tokens.get(token_id, Reputation(at=now)), now, self._token_policy)
        if node.suspend:
            return Suspension(True, f"node {node_id[:8]}: {node.reason}")
        if token.suspend:
            return Suspension(True, f"token {token_id[:8]}: {token.reason}")
        return Suspension(False, f"node {node_id[:8]}: {node.reason}")

    def to_dict(self) -> dict[str, Any]:
        return dict(nodes={k: to_dict(v) for k, v in self.nodes.items()},
                    tokens={k: to_dict(v) for k, v in self.tokens.items()})

    @classmethod
    def from_dict(cls, data: Any, policy: Policy = DEFAULT_POLICY, token_policy: Optional[Policy] = None) -> Book:
        """The book in ``data``; ReputationError naming the field when any part is malformed or out of bounds."""
        if not isinstance(data, dict) or set(data) != {"nodes", "tokens"}:
            raise ReputationError("book: expected a dict with exactly 'nodes' and 'tokens'")
        parts = {}
        for part in ("nodes", "tokens"):
            entries = data[part]
            if not isinstance(entries, dict) or len(entries) > MAX_ENTRIES:
                raise ReputationError(f"book.{part}: expected a dict of at most {MAX_ENTRIES} entries")
            for key in entries:
                if not isinstance(key, str) or not 1 <= len(key) <= MAX_KEY_CHARS:
                    raise ReputationError(f"book.{part}: key {str(key)[:40]!r} is not 1 to {MAX_KEY_CHARS} characters")
            parts[part] = {k: from_dict(v, f"book.{part}[{k[:40]}]") for k, v in entries.items()}
        return cls(policy, token_policy, parts["nodes"], parts["tokens"])
