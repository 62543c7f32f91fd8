from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class FetchRequest(_message.Message):
    __slots__ = ("key", "wait_s", "credential", "deposit")
    KEY_FIELD_NUMBER: _ClassVar[int]
    WAIT_S_FIELD_NUMBER: _ClassVar[int]
    CREDENTIAL_FIELD_NUMBER: _ClassVar[int]
    DEPOSIT_FIELD_NUMBER: _ClassVar[int]
    key: str
    wait_s: float
    credential: bytes
    deposit: bytes
    def __init__(self, key: _Optional[str] = ..., wait_s: _Optional[float] = ..., credential: _Optional[bytes] = ..., deposit: _Optional[bytes] = ...) -> None: ...

class FetchChunk(_message.Message):
    __slots__ = ("data", "found", "total", "refused", "use_stream")
    DATA_FIELD_NUMBER: _ClassVar[int]
    FOUND_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    USE_STREAM_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    found: bool
    total: int
    refused: str
    use_stream: bool
    def __init__(self, data: _Optional[bytes] = ..., found: _Optional[bool] = ..., total: _Optional[int] = ..., refused: _Optional[str] = ..., use_stream: _Optional[bool] = ...) -> None: ...

class Credential(_message.Message):
    __slots__ = ("run_id", "node_id", "peer_id", "record_public_key", "role", "issued_unix", "expires_unix", "reputation")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    PEER_ID_FIELD_NUMBER: _ClassVar[int]
    RECORD_PUBLIC_KEY_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    ISSUED_UNIX_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_UNIX_FIELD_NUMBER: _ClassVar[int]
    REPUTATION_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    node_id: str
    peer_id: str
    record_public_key: bytes
    role: str
    issued_unix: float
    expires_unix: float
    reputation: float
    def __init__(self, run_id: _Optional[str] = ..., node_id: _Optional[str] = ..., peer_id: _Optional[str] = ..., record_public_key: _Optional[bytes] = ..., role: _Optional[str] = ..., issued_unix: _Optional[float] = ..., expires_unix: _Optional[float] = ..., reputation: _Optional[float] = ...) -> None: ...

class SignedCredential(_message.Message):
    __slots__ = ("body", "signature")
    BODY_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    body: bytes
    signature: bytes
    def __init__(self, body: _Optional[bytes] = ..., signature: _Optional[bytes] = ...) -> None: ...

class Revocations(_message.Message):
    __slots__ = ("run_id", "version", "issued_unix", "node_ids")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    ISSUED_UNIX_FIELD_NUMBER: _ClassVar[int]
    NODE_IDS_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    version: int
    issued_unix: float
    node_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, run_id: _Optional[str] = ..., version: _Optional[int] = ..., issued_unix: _Optional[float] = ..., node_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class SignedRevocations(_message.Message):
    __slots__ = ("body", "signature")
    BODY_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    body: bytes
    signature: bytes
    def __init__(self, body: _Optional[bytes] = ..., signature: _Optional[bytes] = ...) -> None: ...

class ExpertCall(_message.Message):
    __slots__ = ("credential", "uid", "backward", "shape", "inputs", "grad_outputs")
    CREDENTIAL_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    BACKWARD_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    GRAD_OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    credential: bytes
    uid: str
    backward: bool
    shape: _containers.RepeatedScalarFieldContainer[int]
    inputs: bytes
    grad_outputs: bytes
    def __init__(self, credential: _Optional[bytes] = ..., uid: _Optional[str] = ..., backward: _Optional[bool] = ..., shape: _Optional[_Iterable[int]] = ..., inputs: _Optional[bytes] = ..., grad_outputs: _Optional[bytes] = ...) -> None: ...

class ExpertAnswer(_message.Message):
    __slots__ = ("refused", "values")
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    refused: str
    values: bytes
    def __init__(self, refused: _Optional[str] = ..., values: _Optional[bytes] = ...) -> None: ...
