"""The coordinator's durable state: one SQLite file in the state dir.

Everything the coordinator acknowledges is committed before the answer leaves: tokens, members, work units,
checkpoints and evaluations. Heartbeat metrics are the exception: they are written behind, in one transaction every
``flush_every_s`` (a commit per heartbeat would cap a coordinator at a few thousand heartbeats per second), so a
crash loses at most that much of the latest metrics, which every node sends again with its next heartbeat. A
history row is kept at most every ``history_every_s`` per node for the curves. A restarted coordinator reads it all
back and carries on.

Each thread gets its own connection (SQLite connections are not shared across threads).
"""

from __future__ import annotations

import hashlib
import json
import logging
import secrets
import sqlite3
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple, Optional

from cotrain.outage import Outage

#: the store's file in the state dir
DB_NAME = "coordinator.sqlite"

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS tokens (
    name TEXT PRIMARY KEY, hash TEXT NOT NULL UNIQUE, created REAL NOT NULL, expires REAL, revoked INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS nodes (
    node_id TEXT PRIMARY KEY, name TEXT NOT NULL, token_name TEXT NOT NULL, session_hash TEXT NOT NULL,
    joined REAL NOT NULL, last_seen REAL NOT NULL, left INTEGER NOT NULL, capabilities TEXT NOT NULL,
    metrics TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS history (
    time REAL NOT NULL, node_id TEXT NOT NULL, metrics TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS history_time ON history (time);
CREATE TABLE IF NOT EXISTS checkpoints (
    round INTEGER NOT NULL, path TEXT NOT NULL, sha256 TEXT NOT NULL, created REAL NOT NULL,
    samples_total INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS units (
    epoch INTEGER NOT NULL, idx INTEGER NOT NULL, start INTEGER NOT NULL, end INTEGER NOT NULL, state TEXT NOT NULL,
    holder TEXT NOT NULL, deadline REAL NOT NULL, attempts INTEGER NOT NULL, PRIMARY KEY (epoch, idx)
);
CREATE TABLE IF NOT EXISTS peers (
    node_id TEXT PRIMARY KEY, peer_id TEXT NOT NULL, record_key BLOB NOT NULL, reachability TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS evals (
    time REAL NOT NULL, round INTEGER NOT NULL, val_loss REAL NOT NULL, val_bpc REAL NOT NULL, metrics TEXT NOT NULL
);
"""

TOKEN_PREFIX = "ct_"


class StateDirError(ValueError):
    """The state dir belongs to another run."""


class TokenExists(ValueError):
    """A token of this name exists already: names are unique, and a revoked token keeps its name."""

    def __init__(self, name: str):
        super().__init__(f"a token named {name!r} exists already (a revoked token keeps its name); pick another name")
        self.name = name


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


@dataclass
class NodeRecord:
    node_id: str
    name: str
    token_name: str
    session_hash: str
    joined: float
    last_seen: float
    left: bool = False
    capabilities: dict = field(default_factory=dict)
    metrics: dict = field(default_factory=dict)


class UnitRow(NamedTuple):
    """A stored work unit (the fields of :class:`cotrain.coordinator.workunits.Unit`)."""

    epoch: int
    index: int
    start: int
    end: int
    state: str
    holder: str
    deadline: float
    attempts: int


class CheckpointRow(NamedTuple):
    round: int
    path: str
    sha256: str
    created: float
    samples_total: int


class EvalRow(NamedTuple):
    time: float
    round: int
    val_loss: float
    val_bpc: float
    #: every figure the evaluator returned, val_loss and val_bpc included
    metrics: dict


class HistoryRow(NamedTuple):
    """One node's metrics at one time, for the curves."""

    time: float
    node_id: str
    metrics: dict


@dataclass(frozen=True)
class PeerRecord:
    """A member's data-plane identity, as it registered it: what its credentials are bound to."""

    peer_id: str
    record_key: bytes
    reachability: str


@dataclass(frozen=True)
class TokenRecord:
    name: str
    created: float
    expires: Optional[float]
    revoked: bool
    #: most nodes of this token online at once (None: no limit)
    max_nodes: Optional[int] = None

    def usable(self, now: float) -> tuple[bool, str]:
        if self.revoked:
            return False, f"token {self.name!r} was revoked"
        if self.expires is not None and now >= self.expires:
            return False, f"token {self.name!r} expired"
        return True, "ok"


_TOKEN_COLUMNS = "name, created, expires, revoked, max_nodes"


def _token(row: sqlite3.Row) -> TokenRecord:
    return TokenRecord(name=row["name"], created=row["created"], expires=row["expires"], revoked=bool(row["revoked"]),
                       max_nodes=row["max_nodes"])


class Store:
    def __init__(self, state_dir: Path, history_every_s: float = 5.0, flush_every_s: float = 0.25):
        self.state_dir = Path(state_dir)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.state_dir / DB_NAME
        self.history_every_s, self.flush_every_s = history_every_s, flush_every_s
        self._local = threading.local()
        self._last_history: dict[str, float] = {}
        # heartbeats written behind: node id -> (last_seen, metrics), and history rows, until the next flush
        self._pending_lock = threading.Lock()
        self._write_lock = threading.RLock()  # a flush and a full write of a member never interleave
        self._pending: dict[str, tuple[float, dict]] = {}
        self._pending_history: list[HistoryRow] = []
        self._flusher: Optional[threading.Thread] = None
        self._closing = threading.Event()
        with self._conn() as conn:
            conn.executescript(SCHEMA)
            columns = {row["name"] for row in conn.execute("PRAGMA table_info(tokens)")}
            if "max_nodes" not in columns:  # a state dir from before token limits
                conn.execute("ALTER TABLE tokens ADD COLUMN max_nodes INTEGER")

    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(self.path, timeout=30.0)
            conn.row_factory = sqlite3.Row  # rows are read by column name
            conn.execute("PRAGMA journal_mode=WAL")
            # WAL + NORMAL: a commit survives the process being killed (the log is written before the answer
            # leaves); only a power cut can lose the last commits. FULL would fsync every heartbeat.
            conn.execute("PRAGMA synchronous=NORMAL")
            self._local.conn = conn
        return conn

    def close(self) -> None:
        """Write what is pending and close this thread's connection."""
        self._closing.set()
        if self._flusher is not None:
            self._flusher.join(timeout=30)
            self._flusher = None
        self.flush()
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    # ---- meta ----------------------------------------------------------------------------------------------------
    def get_meta(self, key: str) -> Optional[str]:
        row = self._conn().execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return row["value"] if row else None

    def set_meta(self, key: str, value: str) -> None:
        with self._conn() as conn:
            conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, value))

    # ---- tokens --------------------------------------------------------------------------------------------------
    def create_token(self, name: str, expires: Optional[float] = None, max_nodes: Optional[int] = None) -> str:
        token = TOKEN_PREFIX + secrets.token_urlsafe(24)
        try:
            with self._conn() as conn:
                conn.execute("INSERT INTO tokens (name, hash, created, expires, revoked, max_nodes) "
                             "VALUES (?, ?, ?, ?, 0, ?)", (name, hash_secret(token), time.time(), expires, max_nodes))
        except sqlite3.IntegrityError:
            raise TokenExists(name) from None
        return token

    def revoke_token(self, name: str) -> bool:
        with self._conn() as conn:
            return conn.execute("UPDATE tokens SET revoked = 1 WHERE name = ?", (name,)).rowcount > 0

    def list_tokens(self) -> list[TokenRecord]:
        rows = self._conn().execute(f"SELECT {_TOKEN_COLUMNS} FROM tokens ORDER BY created").fetchall()
        return [_token(row) for row in rows]

    def find_token(self, token: str) -> Optional[TokenRecord]:
        row = self._conn().execute(f"SELECT {_TOKEN_COLUMNS} FROM tokens WHERE hash = ?",
                                   (hash_secret(token),)).fetchone()
        return _token(row) if row else None

    def revoked_token_names(self) -> set[str]:
        return {row["name"] for row in self._conn().execute("SELECT name FROM tokens WHERE revoked = 1")}

    # ---- members' data-plane identities --------------------------------------------------------------------------
    def save_peer(self, node_id: str, peer: PeerRecord) -> None:
        with self._write_lock, self._conn() as conn:
            conn.execute("INSERT OR REPLACE INTO peers (node_id, peer_id, record_key, reachability) VALUES (?, ?, ?, ?)",
                         (node_id, peer.peer_id, peer.record_key, peer.reachability))

    def load_peers(self) -> dict[str, PeerRecord]:
        rows = self._conn().execute("SELECT node_id, peer_id, record_key, reachability FROM peers").fetchall()
        return {r["node_id"]: PeerRecord(peer_id=r["peer_id"], record_key=bytes(r["record_key"]),
                                         reachability=r["reachability"]) for r in rows}

    # ---- nodes ---------------------------------------------------------------------------------------------------
    def save_node(self, node: NodeRecord) -> None:
        """Write a member in full, now (it supersedes any heartbeat of it still pending)."""
        with self._write_lock, self._conn() as conn:
            with self._pending_lock:
                self._pending.pop(node.node_id, None)
            conn.execute(
                "INSERT OR REPLACE INTO nodes (node_id, name, token_name, session_hash, joined, last_seen, left, "
                "capabilities, metrics) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (node.node_id, node.name, node.token_name, node.session_hash, node.joined, node.last_seen,
                 int(node.left), json.dumps(node.capabilities), json.dumps(node.metrics)))

    def forget_in_memory(self, node_id: str) -> None:
        """Drop what the store keeps in memory for ``node_id`` (a node the coordinator forgot); its rows stay."""
        with self._pending_lock:
            self._last_history.pop(node_id, None)

    def record_heartbeat(self, node: NodeRecord) -> None:
        """Remember a heartbeat's metrics; written with the next flush (at most ``flush_every_s`` later)."""
        with self._pending_lock:
            self._pending[node.node_id] = (node.last_seen, node.metrics)
            if node.last_seen - self._last_history.get(node.node_id, 0.0) >= self.history_every_s:
                self._last_history[node.node_id] = node.last_seen
                self._pending_history.append(HistoryRow(node.last_seen, node.node_id, node.metrics))
            if self._flusher is None and not self._closing.is_set():
                self._flusher = threading.Thread(target=self._flush_loop, name="store-flush", daemon=True)
                self._flusher.start()

    def _flush_loop(self) -> None:
        failures = Outage("writing heartbeats", logging.getLogger(__name__))
        while not self._closing.wait(self.flush_every_s):
            try:
                self.flush()
                failures.succeeded()
            except sqlite3.Error as e:  # e.g. the disk is full: the rows are kept and written on the next try
                failures.failed(e)
            except Exception as e:  # noqa: BLE001 - a bug: those rows are lost, later heartbeats are still written
                failures.failed(e, expected=False, action="dropping those rows")
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()

    def flush(self) -> None:
        """Write the pending heartbeats in one transaction."""
        with self._write_lock:
            with self._pending_lock:
                pending, history = self._pending, self._pending_history
                self._pending, self._pending_history = {}, []
            if pending or history:
                self._write_heartbeats(pending, history)

    def _write_heartbeats(self, pending: dict, history: list) -> None:
        try:
            with self._conn() as conn:
                conn.executemany("UPDATE nodes SET last_seen = ?, metrics = ? WHERE node_id = ?",
                                 [(seen, json.dumps(m), node_id) for node_id, (seen, m) in pending.items()])
                conn.executemany("INSERT INTO history (time, node_id, metrics) VALUES (?, ?, ?)",
                                 [(h.time, h.node_id, json.dumps(h.metrics)) for h in history])
        except sqlite3.Error:
            with self._pending_lock:  # put them back, newer heartbeats first
                for node_id, item in pending.items():
                    self._pending.setdefault(node_id, item)
                self._pending_history[:0] = history
            raise

    def load_nodes(self) -> list[NodeRecord]:
        self.flush()
        rows = self._conn().execute(
            "SELECT node_id, name, token_name, session_hash, joined, last_seen, left, capabilities, metrics "
            "FROM nodes ORDER BY joined").fetchall()
        return [NodeRecord(node_id=r["node_id"], name=r["name"], token_name=r["token_name"],
                           session_hash=r["session_hash"], joined=r["joined"], last_seen=r["last_seen"],
                           left=bool(r["left"]), capabilities=json.loads(r["capabilities"]),
                           metrics=json.loads(r["metrics"]))
                for r in rows]

    def history(self, since: float = 0.0) -> list[HistoryRow]:
        self.flush()
        rows = self._conn().execute("SELECT time, node_id, metrics FROM history WHERE time >= ? ORDER BY time",
                                    (since,)).fetchall()
        return [HistoryRow(time=r["time"], node_id=r["node_id"], metrics=json.loads(r["metrics"])) for r in rows]

    # ---- work units -----------------------------------------------------------------------------------------------
    def save_units(self, units) -> None:
        """Write work units (:class:`cotrain.coordinator.workunits.Unit`) in one transaction."""
        with self._conn() as conn:
            conn.executemany(
                "INSERT OR REPLACE INTO units (epoch, idx, start, end, state, holder, deadline, attempts) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [(u.epoch, u.index, u.start, u.end, u.state, u.holder, u.deadline, u.attempts) for u in units])

    def load_units(self) -> list[UnitRow]:
        """Every stored unit, by epoch and index."""
        rows = self._conn().execute(
            "SELECT epoch, idx, start, end, state, holder, deadline, attempts FROM units ORDER BY epoch, idx").fetchall()
        return [UnitRow(epoch=r["epoch"], index=r["idx"], start=r["start"], end=r["end"], state=r["state"],
                        holder=r["holder"], deadline=r["deadline"], attempts=r["attempts"]) for r in rows]

    def forget_epochs(self, epochs: list[int]) -> None:
        """Drop the units of finished epochs (keep the newest finished one: it tells which epoch is current)."""
        with self._conn() as conn:
            conn.executemany("DELETE FROM units WHERE epoch = ?", [(e,) for e in epochs])

    # ---- checkpoints and evaluations -----------------------------------------------------------------------------
    def add_checkpoint(self, round_number: int, path: str, sha256: str, samples_total: int) -> None:
        with self._conn() as conn:
            conn.execute("INSERT INTO checkpoints (round, path, sha256, created, samples_total) VALUES (?, ?, ?, ?, ?)",
                         (round_number, path, sha256, time.time(), samples_total))

    def checkpoints(self) -> list[CheckpointRow]:
        """The recorded checkpoints, newest first."""
        rows = self._conn().execute(
            "SELECT round, path, sha256, created, samples_total FROM checkpoints ORDER BY created DESC").fetchall()
        return [CheckpointRow(round=r["round"], path=r["path"], sha256=r["sha256"], created=r["created"],
                              samples_total=r["samples_total"]) for r in rows]

    def remove_checkpoint(self, path: str) -> None:
        with self._conn() as conn:
            conn.execute("DELETE FROM checkpoints WHERE path = ?", (path,))

    def add_eval(self, round_number: int, metrics: dict[str, float]) -> None:
        """``metrics`` holds val_loss and val_bpc (NaN where it does not apply) and any model-specific figures."""
        with self._conn() as conn:
            conn.execute("INSERT INTO evals (time, round, val_loss, val_bpc, metrics) VALUES (?, ?, ?, ?, ?)",
                         (time.time(), round_number, metrics["val_loss"], metrics["val_bpc"], json.dumps(metrics)))

    def evals(self) -> list[EvalRow]:
        """The evaluations, oldest first."""
        return _evals(self._conn())


def _evals(conn: sqlite3.Connection) -> list[EvalRow]:
    rows = conn.execute("SELECT time, round, val_loss, val_bpc, metrics FROM evals ORDER BY time")
    return [EvalRow(time=r["time"], round=r["round"], val_loss=r["val_loss"], val_bpc=r["val_bpc"],
                    metrics=json.loads(r["metrics"])) for r in rows.fetchall()]


def read_evals(state_dir: Path) -> list[EvalRow]:
    """The evaluations in a running coordinator's state dir, oldest first, read without writing anything (no schema,
    no WAL settings: the coordinator owns the file); none while the store does not exist yet or is busy."""
    path = Path(state_dir) / DB_NAME
    if not path.exists():
        return []
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10.0)
        conn.row_factory = sqlite3.Row
        try:
            return _evals(conn)
        finally:
            conn.close()
    except sqlite3.OperationalError:  # created but no evals table yet, or locked past the timeout
        return []
