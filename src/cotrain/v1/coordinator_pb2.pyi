from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Command(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    COMMAND_UNSPECIFIED: _ClassVar[Command]
    CONTINUE: _ClassVar[Command]
    DRAIN: _ClassVar[Command]
COMMAND_UNSPECIFIED: Command
CONTINUE: Command
DRAIN: Command

class Capabilities(_message.Message):
    __slots__ = ("cpus", "gpus", "memory_bytes", "bandwidth_bps")
    CPUS_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    BANDWIDTH_BPS_FIELD_NUMBER: _ClassVar[int]
    cpus: int
    gpus: int
    memory_bytes: int
    bandwidth_bps: int
    def __init__(self, cpus: _Optional[int] = ..., gpus: _Optional[int] = ..., memory_bytes: _Optional[int] = ..., bandwidth_bps: _Optional[int] = ...) -> None: ...

class JoinRequest(_message.Message):
    __slots__ = ("token", "node_name", "protocol_version", "capabilities", "node_id")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    NODE_NAME_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    CAPABILITIES_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    token: str
    node_name: str
    protocol_version: int
    capabilities: Capabilities
    node_id: str
    def __init__(self, token: _Optional[str] = ..., node_name: _Optional[str] = ..., protocol_version: _Optional[int] = ..., capabilities: _Optional[_Union[Capabilities, _Mapping]] = ..., node_id: _Optional[str] = ...) -> None: ...

class RunSpec(_message.Message):
    __slots__ = ("run_id", "config_toml", "corpus_sha256", "train_bytes", "val_bytes", "byte_counts")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    CONFIG_TOML_FIELD_NUMBER: _ClassVar[int]
    CORPUS_SHA256_FIELD_NUMBER: _ClassVar[int]
    TRAIN_BYTES_FIELD_NUMBER: _ClassVar[int]
    VAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    BYTE_COUNTS_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    config_toml: str
    corpus_sha256: str
    train_bytes: int
    val_bytes: int
    byte_counts: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, run_id: _Optional[str] = ..., config_toml: _Optional[str] = ..., corpus_sha256: _Optional[str] = ..., train_bytes: _Optional[int] = ..., val_bytes: _Optional[int] = ..., byte_counts: _Optional[_Iterable[int]] = ...) -> None: ...

class WorkUnit(_message.Message):
    __slots__ = ("epoch", "index", "start", "end", "seed", "deadline_unix")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_UNIX_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    index: int
    start: int
    end: int
    seed: int
    deadline_unix: float
    def __init__(self, epoch: _Optional[int] = ..., index: _Optional[int] = ..., start: _Optional[int] = ..., end: _Optional[int] = ..., seed: _Optional[int] = ..., deadline_unix: _Optional[float] = ...) -> None: ...

class JoinResponse(_message.Message):
    __slots__ = ("node_id", "session", "run", "initial_peers", "heartbeat_interval_s", "coordinator_public_key", "credential_ttl_s")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    RUN_FIELD_NUMBER: _ClassVar[int]
    INITIAL_PEERS_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    COORDINATOR_PUBLIC_KEY_FIELD_NUMBER: _ClassVar[int]
    CREDENTIAL_TTL_S_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    session: str
    run: RunSpec
    initial_peers: _containers.RepeatedScalarFieldContainer[str]
    heartbeat_interval_s: float
    coordinator_public_key: bytes
    credential_ttl_s: float
    def __init__(self, node_id: _Optional[str] = ..., session: _Optional[str] = ..., run: _Optional[_Union[RunSpec, _Mapping]] = ..., initial_peers: _Optional[_Iterable[str]] = ..., heartbeat_interval_s: _Optional[float] = ..., coordinator_public_key: _Optional[bytes] = ..., credential_ttl_s: _Optional[float] = ...) -> None: ...

class RegisterPeerRequest(_message.Message):
    __slots__ = ("node_id", "session", "peer_id", "maddrs", "record_public_key", "client_mode")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    PEER_ID_FIELD_NUMBER: _ClassVar[int]
    MADDRS_FIELD_NUMBER: _ClassVar[int]
    RECORD_PUBLIC_KEY_FIELD_NUMBER: _ClassVar[int]
    CLIENT_MODE_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    session: str
    peer_id: str
    maddrs: _containers.RepeatedScalarFieldContainer[str]
    record_public_key: bytes
    client_mode: bool
    def __init__(self, node_id: _Optional[str] = ..., session: _Optional[str] = ..., peer_id: _Optional[str] = ..., maddrs: _Optional[_Iterable[str]] = ..., record_public_key: _Optional[bytes] = ..., client_mode: _Optional[bool] = ...) -> None: ...

class RegisterPeerResponse(_message.Message):
    __slots__ = ("reachability", "reason", "credential", "revocations")
    REACHABILITY_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    CREDENTIAL_FIELD_NUMBER: _ClassVar[int]
    REVOCATIONS_FIELD_NUMBER: _ClassVar[int]
    reachability: str
    reason: str
    credential: bytes
    revocations: bytes
    def __init__(self, reachability: _Optional[str] = ..., reason: _Optional[str] = ..., credential: _Optional[bytes] = ..., revocations: _Optional[bytes] = ...) -> None: ...

class NodeMetrics(_message.Message):
    __slots__ = ("step", "round", "loss", "samples_per_s", "bytes_sent", "bytes_received", "samples_total", "epoch", "partial_rounds", "rounds_completed", "samples_local", "compute_s", "wall_s", "state_bytes_sent", "state_bytes_received", "peer_id", "flagged_peers", "units_done", "refused", "refused_peers", "groups_from_board", "groups_matchmade", "meet_s", "allreduce_s", "memory_bytes", "processes", "heartbeat_ms", "last_group", "lr", "expert_calls_failed", "steps_skipped")
    STEP_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    LOSS_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_PER_S_FIELD_NUMBER: _ClassVar[int]
    BYTES_SENT_FIELD_NUMBER: _ClassVar[int]
    BYTES_RECEIVED_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    PARTIAL_ROUNDS_FIELD_NUMBER: _ClassVar[int]
    ROUNDS_COMPLETED_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_LOCAL_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_S_FIELD_NUMBER: _ClassVar[int]
    WALL_S_FIELD_NUMBER: _ClassVar[int]
    STATE_BYTES_SENT_FIELD_NUMBER: _ClassVar[int]
    STATE_BYTES_RECEIVED_FIELD_NUMBER: _ClassVar[int]
    PEER_ID_FIELD_NUMBER: _ClassVar[int]
    FLAGGED_PEERS_FIELD_NUMBER: _ClassVar[int]
    UNITS_DONE_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    REFUSED_PEERS_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FROM_BOARD_FIELD_NUMBER: _ClassVar[int]
    GROUPS_MATCHMADE_FIELD_NUMBER: _ClassVar[int]
    MEET_S_FIELD_NUMBER: _ClassVar[int]
    ALLREDUCE_S_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    PROCESSES_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_MS_FIELD_NUMBER: _ClassVar[int]
    LAST_GROUP_FIELD_NUMBER: _ClassVar[int]
    LR_FIELD_NUMBER: _ClassVar[int]
    EXPERT_CALLS_FAILED_FIELD_NUMBER: _ClassVar[int]
    STEPS_SKIPPED_FIELD_NUMBER: _ClassVar[int]
    step: int
    round: int
    loss: float
    samples_per_s: float
    bytes_sent: int
    bytes_received: int
    samples_total: int
    epoch: int
    partial_rounds: int
    rounds_completed: int
    samples_local: int
    compute_s: float
    wall_s: float
    state_bytes_sent: int
    state_bytes_received: int
    peer_id: str
    flagged_peers: _containers.RepeatedScalarFieldContainer[str]
    units_done: int
    refused: int
    refused_peers: _containers.RepeatedScalarFieldContainer[str]
    groups_from_board: int
    groups_matchmade: int
    meet_s: float
    allreduce_s: float
    memory_bytes: int
    processes: int
    heartbeat_ms: float
    last_group: _containers.RepeatedScalarFieldContainer[str]
    lr: float
    expert_calls_failed: int
    steps_skipped: int
    def __init__(self, step: _Optional[int] = ..., round: _Optional[int] = ..., loss: _Optional[float] = ..., samples_per_s: _Optional[float] = ..., bytes_sent: _Optional[int] = ..., bytes_received: _Optional[int] = ..., samples_total: _Optional[int] = ..., epoch: _Optional[int] = ..., partial_rounds: _Optional[int] = ..., rounds_completed: _Optional[int] = ..., samples_local: _Optional[int] = ..., compute_s: _Optional[float] = ..., wall_s: _Optional[float] = ..., state_bytes_sent: _Optional[int] = ..., state_bytes_received: _Optional[int] = ..., peer_id: _Optional[str] = ..., flagged_peers: _Optional[_Iterable[str]] = ..., units_done: _Optional[int] = ..., refused: _Optional[int] = ..., refused_peers: _Optional[_Iterable[str]] = ..., groups_from_board: _Optional[int] = ..., groups_matchmade: _Optional[int] = ..., meet_s: _Optional[float] = ..., allreduce_s: _Optional[float] = ..., memory_bytes: _Optional[int] = ..., processes: _Optional[int] = ..., heartbeat_ms: _Optional[float] = ..., last_group: _Optional[_Iterable[str]] = ..., lr: _Optional[float] = ..., expert_calls_failed: _Optional[int] = ..., steps_skipped: _Optional[int] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("node_id", "session", "metrics", "evidence_round", "commitments", "parts_seen")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    EVIDENCE_ROUND_FIELD_NUMBER: _ClassVar[int]
    COMMITMENTS_FIELD_NUMBER: _ClassVar[int]
    PARTS_SEEN_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    session: str
    metrics: NodeMetrics
    evidence_round: int
    commitments: _containers.RepeatedScalarFieldContainer[bytes]
    parts_seen: _containers.RepeatedCompositeFieldContainer[PartSeen]
    def __init__(self, node_id: _Optional[str] = ..., session: _Optional[str] = ..., metrics: _Optional[_Union[NodeMetrics, _Mapping]] = ..., evidence_round: _Optional[int] = ..., commitments: _Optional[_Iterable[bytes]] = ..., parts_seen: _Optional[_Iterable[_Union[PartSeen, _Mapping]]] = ...) -> None: ...

class PartSeen(_message.Message):
    __slots__ = ("round", "member", "start", "end", "digest", "signature", "contribution")
    ROUND_FIELD_NUMBER: _ClassVar[int]
    MEMBER_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    CONTRIBUTION_FIELD_NUMBER: _ClassVar[int]
    round: int
    member: str
    start: int
    end: int
    digest: bytes
    signature: bytes
    contribution: bytes
    def __init__(self, round: _Optional[int] = ..., member: _Optional[str] = ..., start: _Optional[int] = ..., end: _Optional[int] = ..., digest: _Optional[bytes] = ..., signature: _Optional[bytes] = ..., contribution: _Optional[bytes] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("command", "reason", "credential", "revocations", "evidence_round")
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    CREDENTIAL_FIELD_NUMBER: _ClassVar[int]
    REVOCATIONS_FIELD_NUMBER: _ClassVar[int]
    EVIDENCE_ROUND_FIELD_NUMBER: _ClassVar[int]
    command: Command
    reason: str
    credential: bytes
    revocations: bytes
    evidence_round: int
    def __init__(self, command: _Optional[_Union[Command, str]] = ..., reason: _Optional[str] = ..., credential: _Optional[bytes] = ..., revocations: _Optional[bytes] = ..., evidence_round: _Optional[int] = ...) -> None: ...

class EvidenceChunk(_message.Message):
    __slots__ = ("node_id", "session", "round", "data")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    session: str
    round: int
    data: bytes
    def __init__(self, node_id: _Optional[str] = ..., session: _Optional[str] = ..., round: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class SubmitEvidenceResponse(_message.Message):
    __slots__ = ("accepted", "reason")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    reason: str
    def __init__(self, accepted: _Optional[bool] = ..., reason: _Optional[str] = ...) -> None: ...

class GetWorkRequest(_message.Message):
    __slots__ = ("node_id", "session")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    session: str
    def __init__(self, node_id: _Optional[str] = ..., session: _Optional[str] = ...) -> None: ...

class GetWorkResponse(_message.Message):
    __slots__ = ("unit", "reason", "retry_after_s")
    UNIT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_S_FIELD_NUMBER: _ClassVar[int]
    unit: WorkUnit
    reason: str
    retry_after_s: float
    def __init__(self, unit: _Optional[_Union[WorkUnit, _Mapping]] = ..., reason: _Optional[str] = ..., retry_after_s: _Optional[float] = ...) -> None: ...

class ReportWorkRequest(_message.Message):
    __slots__ = ("node_id", "session", "epoch", "index", "samples")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    session: str
    epoch: int
    index: int
    samples: int
    def __init__(self, node_id: _Optional[str] = ..., session: _Optional[str] = ..., epoch: _Optional[int] = ..., index: _Optional[int] = ..., samples: _Optional[int] = ...) -> None: ...

class ReportWorkResponse(_message.Message):
    __slots__ = ("accepted", "reason")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    reason: str
    def __init__(self, accepted: _Optional[bool] = ..., reason: _Optional[str] = ...) -> None: ...

class LeaveRequest(_message.Message):
    __slots__ = ("node_id", "session", "reason", "metrics")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    session: str
    reason: str
    metrics: NodeMetrics
    def __init__(self, node_id: _Optional[str] = ..., session: _Optional[str] = ..., reason: _Optional[str] = ..., metrics: _Optional[_Union[NodeMetrics, _Mapping]] = ...) -> None: ...

class LeaveResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetSwarmHealthRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class NodeHealth(_message.Message):
    __slots__ = ("node_id", "node_name", "state", "metrics", "last_seen_unix", "joined_unix", "reason", "bytes_per_s", "units", "reachability", "groupmates", "verification")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_NAME_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    LAST_SEEN_UNIX_FIELD_NUMBER: _ClassVar[int]
    JOINED_UNIX_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    BYTES_PER_S_FIELD_NUMBER: _ClassVar[int]
    UNITS_FIELD_NUMBER: _ClassVar[int]
    REACHABILITY_FIELD_NUMBER: _ClassVar[int]
    GROUPMATES_FIELD_NUMBER: _ClassVar[int]
    VERIFICATION_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    node_name: str
    state: str
    metrics: NodeMetrics
    last_seen_unix: float
    joined_unix: float
    reason: str
    bytes_per_s: float
    units: _containers.RepeatedScalarFieldContainer[str]
    reachability: str
    groupmates: _containers.RepeatedScalarFieldContainer[str]
    verification: Verification
    def __init__(self, node_id: _Optional[str] = ..., node_name: _Optional[str] = ..., state: _Optional[str] = ..., metrics: _Optional[_Union[NodeMetrics, _Mapping]] = ..., last_seen_unix: _Optional[float] = ..., joined_unix: _Optional[float] = ..., reason: _Optional[str] = ..., bytes_per_s: _Optional[float] = ..., units: _Optional[_Iterable[str]] = ..., reachability: _Optional[str] = ..., groupmates: _Optional[_Iterable[str]] = ..., verification: _Optional[_Union[Verification, _Mapping]] = ...) -> None: ...

class Verification(_message.Message):
    __slots__ = ("checks", "failed", "reputation", "suspended", "reason", "replayed")
    CHECKS_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    REPUTATION_FIELD_NUMBER: _ClassVar[int]
    SUSPENDED_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_FIELD_NUMBER: _ClassVar[int]
    checks: int
    failed: int
    reputation: float
    suspended: bool
    reason: str
    replayed: int
    def __init__(self, checks: _Optional[int] = ..., failed: _Optional[int] = ..., reputation: _Optional[float] = ..., suspended: _Optional[bool] = ..., reason: _Optional[str] = ..., replayed: _Optional[int] = ...) -> None: ...

class SwarmTotals(_message.Message):
    __slots__ = ("nodes_online", "samples_per_s", "global_round", "samples_total", "bytes_sent", "bytes_received", "val_loss", "val_bpc", "val_round", "latest_checkpoint", "latest_checkpoint_round", "val_metrics", "epoch", "units_total", "units_pending", "units_in_progress", "units_done", "units_reissued", "scheduling_reason", "validator_cpu_s", "checks")
    class ValMetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    NODES_ONLINE_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_PER_S_FIELD_NUMBER: _ClassVar[int]
    GLOBAL_ROUND_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    BYTES_SENT_FIELD_NUMBER: _ClassVar[int]
    BYTES_RECEIVED_FIELD_NUMBER: _ClassVar[int]
    VAL_LOSS_FIELD_NUMBER: _ClassVar[int]
    VAL_BPC_FIELD_NUMBER: _ClassVar[int]
    VAL_ROUND_FIELD_NUMBER: _ClassVar[int]
    LATEST_CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    LATEST_CHECKPOINT_ROUND_FIELD_NUMBER: _ClassVar[int]
    VAL_METRICS_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    UNITS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    UNITS_PENDING_FIELD_NUMBER: _ClassVar[int]
    UNITS_IN_PROGRESS_FIELD_NUMBER: _ClassVar[int]
    UNITS_DONE_FIELD_NUMBER: _ClassVar[int]
    UNITS_REISSUED_FIELD_NUMBER: _ClassVar[int]
    SCHEDULING_REASON_FIELD_NUMBER: _ClassVar[int]
    VALIDATOR_CPU_S_FIELD_NUMBER: _ClassVar[int]
    CHECKS_FIELD_NUMBER: _ClassVar[int]
    nodes_online: int
    samples_per_s: float
    global_round: int
    samples_total: int
    bytes_sent: int
    bytes_received: int
    val_loss: float
    val_bpc: float
    val_round: int
    latest_checkpoint: str
    latest_checkpoint_round: int
    val_metrics: _containers.ScalarMap[str, float]
    epoch: int
    units_total: int
    units_pending: int
    units_in_progress: int
    units_done: int
    units_reissued: int
    scheduling_reason: str
    validator_cpu_s: float
    checks: int
    def __init__(self, nodes_online: _Optional[int] = ..., samples_per_s: _Optional[float] = ..., global_round: _Optional[int] = ..., samples_total: _Optional[int] = ..., bytes_sent: _Optional[int] = ..., bytes_received: _Optional[int] = ..., val_loss: _Optional[float] = ..., val_bpc: _Optional[float] = ..., val_round: _Optional[int] = ..., latest_checkpoint: _Optional[str] = ..., latest_checkpoint_round: _Optional[int] = ..., val_metrics: _Optional[_Mapping[str, float]] = ..., epoch: _Optional[int] = ..., units_total: _Optional[int] = ..., units_pending: _Optional[int] = ..., units_in_progress: _Optional[int] = ..., units_done: _Optional[int] = ..., units_reissued: _Optional[int] = ..., scheduling_reason: _Optional[str] = ..., validator_cpu_s: _Optional[float] = ..., checks: _Optional[int] = ...) -> None: ...

class SwarmHealth(_message.Message):
    __slots__ = ("run_id", "nodes", "totals", "alerts", "now_unix", "experts")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    TOTALS_FIELD_NUMBER: _ClassVar[int]
    ALERTS_FIELD_NUMBER: _ClassVar[int]
    NOW_UNIX_FIELD_NUMBER: _ClassVar[int]
    EXPERTS_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    nodes: _containers.RepeatedCompositeFieldContainer[NodeHealth]
    totals: SwarmTotals
    alerts: _containers.RepeatedScalarFieldContainer[str]
    now_unix: float
    experts: ExpertsHealth
    def __init__(self, run_id: _Optional[str] = ..., nodes: _Optional[_Iterable[_Union[NodeHealth, _Mapping]]] = ..., totals: _Optional[_Union[SwarmTotals, _Mapping]] = ..., alerts: _Optional[_Iterable[str]] = ..., now_unix: _Optional[float] = ..., experts: _Optional[_Union[ExpertsHealth, _Mapping]] = ...) -> None: ...

class ReadDataRequest(_message.Message):
    __slots__ = ("node_id", "session", "split", "offset", "length")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    SPLIT_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    session: str
    split: str
    offset: int
    length: int
    def __init__(self, node_id: _Optional[str] = ..., session: _Optional[str] = ..., split: _Optional[str] = ..., offset: _Optional[int] = ..., length: _Optional[int] = ...) -> None: ...

class DataChunk(_message.Message):
    __slots__ = ("data", "offset")
    DATA_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    offset: int
    def __init__(self, data: _Optional[bytes] = ..., offset: _Optional[int] = ...) -> None: ...

class GetCheckpointRequest(_message.Message):
    __slots__ = ("node_id", "session")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    session: str
    def __init__(self, node_id: _Optional[str] = ..., session: _Optional[str] = ...) -> None: ...

class CheckpointChunk(_message.Message):
    __slots__ = ("data", "total", "round", "sha256")
    DATA_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    total: int
    round: int
    sha256: str
    def __init__(self, data: _Optional[bytes] = ..., total: _Optional[int] = ..., round: _Optional[int] = ..., sha256: _Optional[str] = ...) -> None: ...

class ReportExpertsRequest(_message.Message):
    __slots__ = ("node_id", "session", "capacity", "holds", "served", "refused")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    HOLDS_FIELD_NUMBER: _ClassVar[int]
    SERVED_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    session: str
    capacity: int
    holds: _containers.RepeatedScalarFieldContainer[str]
    served: _containers.RepeatedCompositeFieldContainer[ExpertLoad]
    refused: int
    def __init__(self, node_id: _Optional[str] = ..., session: _Optional[str] = ..., capacity: _Optional[int] = ..., holds: _Optional[_Iterable[str]] = ..., served: _Optional[_Iterable[_Union[ExpertLoad, _Mapping]]] = ..., refused: _Optional[int] = ...) -> None: ...

class ExpertChunk(_message.Message):
    __slots__ = ("node_id", "session", "uid", "data")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    session: str
    uid: str
    data: bytes
    def __init__(self, node_id: _Optional[str] = ..., session: _Optional[str] = ..., uid: _Optional[str] = ..., data: _Optional[bytes] = ...) -> None: ...

class SaveExpertResponse(_message.Message):
    __slots__ = ("updates",)
    UPDATES_FIELD_NUMBER: _ClassVar[int]
    updates: int
    def __init__(self, updates: _Optional[int] = ...) -> None: ...

class LoadExpertRequest(_message.Message):
    __slots__ = ("node_id", "session", "uid")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    session: str
    uid: str
    def __init__(self, node_id: _Optional[str] = ..., session: _Optional[str] = ..., uid: _Optional[str] = ...) -> None: ...

class ExpertLoad(_message.Message):
    __slots__ = ("uid", "forward", "backward", "updates", "started_from")
    UID_FIELD_NUMBER: _ClassVar[int]
    FORWARD_FIELD_NUMBER: _ClassVar[int]
    BACKWARD_FIELD_NUMBER: _ClassVar[int]
    UPDATES_FIELD_NUMBER: _ClassVar[int]
    STARTED_FROM_FIELD_NUMBER: _ClassVar[int]
    uid: str
    forward: int
    backward: int
    updates: int
    started_from: int
    def __init__(self, uid: _Optional[str] = ..., forward: _Optional[int] = ..., backward: _Optional[int] = ..., updates: _Optional[int] = ..., started_from: _Optional[int] = ...) -> None: ...

class ExpertHostHealth(_message.Message):
    __slots__ = ("node_id", "node_name", "peer_id", "capacity", "holds", "served", "refused", "last_report_unix")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_NAME_FIELD_NUMBER: _ClassVar[int]
    PEER_ID_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    HOLDS_FIELD_NUMBER: _ClassVar[int]
    SERVED_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    LAST_REPORT_UNIX_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    node_name: str
    peer_id: str
    capacity: int
    holds: _containers.RepeatedScalarFieldContainer[str]
    served: _containers.RepeatedCompositeFieldContainer[ExpertLoad]
    refused: int
    last_report_unix: float
    def __init__(self, node_id: _Optional[str] = ..., node_name: _Optional[str] = ..., peer_id: _Optional[str] = ..., capacity: _Optional[int] = ..., holds: _Optional[_Iterable[str]] = ..., served: _Optional[_Iterable[_Union[ExpertLoad, _Mapping]]] = ..., refused: _Optional[int] = ..., last_report_unix: _Optional[float] = ...) -> None: ...

class ExpertsHealth(_message.Message):
    __slots__ = ("experts", "hosted", "reason", "hosts")
    EXPERTS_FIELD_NUMBER: _ClassVar[int]
    HOSTED_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    HOSTS_FIELD_NUMBER: _ClassVar[int]
    experts: int
    hosted: int
    reason: str
    hosts: _containers.RepeatedCompositeFieldContainer[ExpertHostHealth]
    def __init__(self, experts: _Optional[int] = ..., hosted: _Optional[int] = ..., reason: _Optional[str] = ..., hosts: _Optional[_Iterable[_Union[ExpertHostHealth, _Mapping]]] = ...) -> None: ...

class ReportExpertsResponse(_message.Message):
    __slots__ = ("uids", "reason")
    UIDS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    uids: _containers.RepeatedScalarFieldContainer[str]
    reason: str
    def __init__(self, uids: _Optional[_Iterable[str]] = ..., reason: _Optional[str] = ...) -> None: ...

class GetExpertsRequest(_message.Message):
    __slots__ = ("node_id", "session")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    session: str
    def __init__(self, node_id: _Optional[str] = ..., session: _Optional[str] = ...) -> None: ...

class ExpertHostEntry(_message.Message):
    __slots__ = ("uid", "peer_id")
    UID_FIELD_NUMBER: _ClassVar[int]
    PEER_ID_FIELD_NUMBER: _ClassVar[int]
    uid: str
    peer_id: str
    def __init__(self, uid: _Optional[str] = ..., peer_id: _Optional[str] = ...) -> None: ...

class GetExpertsResponse(_message.Message):
    __slots__ = ("experts", "reason")
    EXPERTS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    experts: _containers.RepeatedCompositeFieldContainer[ExpertHostEntry]
    reason: str
    def __init__(self, experts: _Optional[_Iterable[_Union[ExpertHostEntry, _Mapping]]] = ..., reason: _Optional[str] = ...) -> None: ...
