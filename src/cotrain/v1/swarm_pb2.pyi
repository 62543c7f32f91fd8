from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class FetchRequest(_message.Message):
    __slots__ = ("key", "wait_s")
    KEY_FIELD_NUMBER: _ClassVar[int]
    WAIT_S_FIELD_NUMBER: _ClassVar[int]
    key: str
    wait_s: float
    def __init__(self, key: _Optional[str] = ..., wait_s: _Optional[float] = ...) -> None: ...

class FetchChunk(_message.Message):
    __slots__ = ("data", "found", "total")
    DATA_FIELD_NUMBER: _ClassVar[int]
    FOUND_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    found: bool
    total: int
    def __init__(self, data: _Optional[bytes] = ..., found: _Optional[bool] = ..., total: _Optional[int] = ...) -> None: ...
