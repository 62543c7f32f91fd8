"""The coordinator's gRPC handlers, built from the service descriptor, with requests checked on the way in.

``grpc`` deserializes a request before the service sees it; a message that does not parse raises out of the
deserializer into grpc, which answers ``UNKNOWN`` and logs an ERROR with a traceback for every such request. Here
the deserializer never raises: it returns a :class:`Malformed` marker, and the handler answers
``INVALID_ARGUMENT`` ("request is not a valid cotrain.v1.JoinRequest: ...") before calling the service method.
For a client stream the check is made on each message as the service reads it, so a bad message mid-stream ends
the stream with ``INVALID_ARGUMENT``. Bad requests are logged as one warning at most per ``interval_s``, with the
count of the others, so that garbage cannot flood the log.

Every method of the service descriptor gets a handler, so an RPC added to the proto later is covered without
touching this module. Service methods must be coroutines (``async def``) or async generators, as
:class:`~cotrain.coordinator.service.CoordinatorService`'s are: the service keeps its state on the event loop.
A method the servicer does not implement (missing, or the generated stub that only says "not implemented")
answers ``UNIMPLEMENTED``.
"""

from __future__ import annotations

import inspect
import logging
import time
from typing import Callable, Optional

import grpc
from google.protobuf import message_factory
from google.protobuf.descriptor import MethodDescriptor, ServiceDescriptor

from cotrain.coordinator.ratelimit import peer_address

logger = logging.getLogger(__name__)

#: longest parser error kept in a status message or log line
MAX_REASON_CHARS = 200


class Malformed:
    """What the deserializer hands grpc for bytes that are not a valid message of the expected type."""

    __slots__ = ("type_name", "reason")

    def __init__(self, type_name: str, reason: str):
        self.type_name, self.reason = type_name, reason

    def __str__(self) -> str:
        return f"request is not a valid {self.type_name}: {self.reason}"


def lenient_deserializer(message_class) -> Callable[[bytes], object]:
    """``message_class.FromString``, except that bytes it rejects give a :class:`Malformed` instead of raising."""
    type_name = message_class.DESCRIPTOR.full_name

    def deserialize(data: bytes):
        try:
            return message_class.FromString(data)
        except Exception as e:  # noqa: BLE001 -- whatever the parser raises, the bytes came from the client
            # upb says "Error parsing message with type 'T': <why>"; keep the why (the type is in our own text)
            reason = str(e).rpartition(": ")[2].strip() or type(e).__name__
            return Malformed(type_name, reason[:MAX_REASON_CHARS])

    return deserialize


class ThrottledWarning:
    """Logs the first bad request, then at most one warning per ``interval_s`` that counts the ones in between.

    Requests in a quiet period are counted and reported with the next one logged; none logs a traceback.
    """

    def __init__(self, log: logging.Logger = logger, interval_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic):
        self.log, self.interval_s, self.clock = log, interval_s, clock
        self.last: Optional[float] = None
        self.suppressed = 0
        self.total = 0

    def note(self, what: str) -> bool:
        """Count one bad request described by ``what``; True when it was logged."""
        self.total += 1
        now = self.clock()
        if self.last is not None and now - self.last < self.interval_s:
            self.suppressed += 1
            return False
        suppressed, self.suppressed, self.last = self.suppressed, 0, now
        more = (f" ({suppressed} more since the last report, {self.total} in all; at most one report per "
                f"{self.interval_s:g}s)" if suppressed else "")
        self.log.warning("rejected a malformed request: %s%s", what, more)
        return True


def _is_generated_stub(servicer, name: str) -> bool:
    """True when ``servicer.name`` is the method grpc's code generator wrote (it only says "not implemented")."""
    for cls in type(servicer).__mro__:
        if name in vars(cls):
            return cls.__module__.endswith("_pb2_grpc")
    return False


def _unimplemented(method: MethodDescriptor):
    details = f"{method.full_name} is not implemented by this coordinator"

    async def reject(request_or_iterator, context):
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, details)

    return reject


class _Handlers:
    def __init__(self, warning: ThrottledWarning):
        self.warning = warning

    async def reject(self, method: MethodDescriptor, bad: Malformed, context) -> None:
        self.warning.note(f"/{method.containing_service.full_name}/{method.name} from "
                          f"{peer_address(context.peer())}: {bad}")
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(bad))

    def checked_stream(self, method: MethodDescriptor, requests, context):
        async def checked():
            async for request in requests:
                if isinstance(request, Malformed):
                    await self.reject(method, request, context)
                yield request
        return checked()

    def wrap(self, method: MethodDescriptor, implementation):
        """The handler function for one method: checks its request(s), then calls ``implementation``."""
        streams_out = inspect.isasyncgenfunction(implementation)
        if method.client_streaming:
            if streams_out:
                async def handler(requests, context):
                    async for response in implementation(self.checked_stream(method, requests, context), context):
                        yield response
            else:
                async def handler(requests, context):
                    return await implementation(self.checked_stream(method, requests, context), context)
        else:
            if streams_out:
                async def handler(request, context):
                    if isinstance(request, Malformed):
                        await self.reject(method, request, context)
                    async for response in implementation(request, context):
                        yield response
            else:
                async def handler(request, context):
                    if isinstance(request, Malformed):
                        await self.reject(method, request, context)
                    return await implementation(request, context)
        handler.__name__ = handler.__qualname__ = method.name
        return handler


_HANDLER_KINDS = {
    (False, False): grpc.unary_unary_rpc_method_handler,
    (False, True): grpc.unary_stream_rpc_method_handler,
    (True, False): grpc.stream_unary_rpc_method_handler,
    (True, True): grpc.stream_stream_rpc_method_handler,
}


def method_handlers(servicer, service: ServiceDescriptor,
                    warning: Optional[ThrottledWarning] = None) -> dict[str, grpc.RpcMethodHandler]:
    """{method name: handler} for every method of ``service``, served by ``servicer``'s method of that name."""
    handlers = _Handlers(warning or ThrottledWarning())
    out = {}
    for method in service.methods:
        implementation = getattr(servicer, method.name, None)
        if implementation is None or _is_generated_stub(servicer, method.name):
            implementation = _unimplemented(method)
        elif not (inspect.iscoroutinefunction(implementation) or inspect.isasyncgenfunction(implementation)):
            raise TypeError(f"{type(servicer).__name__}.{method.name} must be a coroutine or an async generator "
                            f"(the coordinator's service runs on the event loop)")
        out[method.name] = _HANDLER_KINDS[method.client_streaming, method.server_streaming](
            handlers.wrap(method, implementation),
            request_deserializer=lenient_deserializer(message_factory.GetMessageClass(method.input_type)),
            response_serializer=message_factory.GetMessageClass(method.output_type).SerializeToString)
    return out


def add_service(server, servicer, service: ServiceDescriptor, warning: Optional[ThrottledWarning] = None) -> None:
    """Register ``servicer`` for every method of ``service`` on a ``grpc.aio`` server (in place of the generated
    ``add_<Service>Servicer_to_server``)."""
    handlers = method_handlers(servicer, service, warning)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service.full_name, handlers),))
    if hasattr(server, "add_registered_method_handlers"):  # as the generated code does: a faster lookup
        server.add_registered_method_handlers(service.full_name, handlers)
