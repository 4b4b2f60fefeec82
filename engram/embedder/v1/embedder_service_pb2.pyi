from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class EmbedRequest(_message.Message):
    __slots__ = ("texts", "background")
    TEXTS_FIELD_NUMBER: _ClassVar[int]
    BACKGROUND_FIELD_NUMBER: _ClassVar[int]
    texts: _containers.RepeatedScalarFieldContainer[str]
    background: bool
    def __init__(self, texts: _Optional[_Iterable[str]] = ..., background: _Optional[bool] = ...) -> None: ...

class EmbedResponse(_message.Message):
    __slots__ = ("model", "dimension", "vectors")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    DIMENSION_FIELD_NUMBER: _ClassVar[int]
    VECTORS_FIELD_NUMBER: _ClassVar[int]
    model: str
    dimension: int
    vectors: bytes
    def __init__(self, model: _Optional[str] = ..., dimension: _Optional[int] = ..., vectors: _Optional[bytes] = ...) -> None: ...

class DescribeRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DescribeResponse(_message.Message):
    __slots__ = ("model", "dimension")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    DIMENSION_FIELD_NUMBER: _ClassVar[int]
    model: str
    dimension: int
    def __init__(self, model: _Optional[str] = ..., dimension: _Optional[int] = ...) -> None: ...
