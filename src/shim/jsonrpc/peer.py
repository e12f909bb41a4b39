"""A JSON-RPC 2.0 peer: sends requests and notifications, answers the other side's.

Requests run concurrently in both directions: each incoming request is handled
in its own task, so a slow one never stalls the next; outgoing requests wait
on futures keyed by id. When the connection ends, for whatever reason, every
pending request fails with ConnectionClosed and ``on_close`` runs once: a
crash is one code path (as in pygls' client).
"""

from __future__ import annotations

import asyncio
import collections
import itertools
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from loguru import logger

from shim.jsonrpc.errors import ConnectionClosed, ErrorCode, ProtocolError, RemoteError
from shim.jsonrpc.framing import Transport

Handler = Callable[[Any], Awaitable[Any]]
NotificationHandler = Callable[[Any], None]
Reader = Callable[[bytes], Awaitable[Any]]


def encode(message: dict[str, Any]) -> bytes:
    # Compact UTF-8 with newlines inside strings escaped, so one message is one line. orjson, not
    # json: a message each way on every per-call Allocate, at 0.3 us instead of 5 (and 1 us
    # instead of 4 to read one), on both sides of the pipe (docs/benchmarks.md).
    return orjson.dumps(message)


def _quoted(line: bytes, most: int = 80) -> str:
    """The start of a line as JSON quotes it: control characters and bytes that are not UTF-8
    escaped, never a Python repr."""
    text = line[:most].decode("utf-8", "backslashreplace")
    return orjson.dumps(text).decode() + ("..." if len(line) > most else "")


class Peer:
    def __init__(
        self,
        transport: Transport,
        *,
        name: str,
        requests: dict[str, Handler] | None = None,
        notifications: dict[str, NotificationHandler] | None = None,
        strict: bool = True,
        read: Reader | None = None,
    ) -> None:
        """``strict``: end the connection on anything that is not JSON-RPC (devshim's
        side, facing a driver); otherwise answer such input with an error object. ``read``: what
        turns a line into its message, if not orjson.loads (jsonrpc/sliced.py); it must raise
        what orjson raises."""
        self.name = name
        self._transport = transport
        self._requests = dict(requests or {})
        self._notifications = dict(notifications or {})
        self._strict = strict
        self._read = read
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[Any]] = {}
        # Ids of requests we stopped waiting for: a late answer to one is not a protocol error.
        self._expired: collections.deque[int] = collections.deque(maxlen=1024)
        self._handling: set[asyncio.Task[None]] = set()
        self._closed: BaseException | None = None
        self.on_close: Callable[[BaseException], None] | None = None

    @property
    def closed(self) -> bool:
        return self._closed is not None

    # --- outgoing --------------------------------------------------------

    async def request(self, method: str, params: Any, timeout: float) -> Any:
        if self._closed is not None:
            raise ConnectionClosed(f"{self.name}: connection closed ({self._closed})")
        request_id = next(self._ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        try:
            await self._send({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})
            # Not wait_for: in Python 3.11 it waits on a second future, one more loop turn per call.
            async with asyncio.timeout(timeout):
                return await future
        except TimeoutError:
            self._expired.append(request_id)
            raise
        finally:
            self._pending.pop(request_id, None)
            if future.done() and not future.cancelled():
                # Failed by the closing stream while our own send failed: seen, not "never retrieved".
                future.exception()

    async def notify(self, method: str, params: Any) -> None:
        await self._send({"jsonrpc": "2.0", "method": method, "params": params})

    async def _send(self, message: dict[str, Any]) -> None:
        await self._transport.write_message(encode(message))

    # --- incoming --------------------------------------------------------

    async def run(self) -> None:
        """Read until the stream ends or breaks the protocol; then fail what is pending."""
        reason: BaseException = ConnectionClosed(f"{self.name}: end of stream")
        try:
            while (line := await self._transport.read_message()) is not None:
                if line.strip():
                    await self._receive(line)
            # The other side closed its half (devshim sends shutdown, then closes stdin):
            # what it asked before that still gets answered.
            await self.wait_idle()
        except ProtocolError as exc:
            reason = exc
            logger.error("{}: protocol error: {}", self.name, exc)
        except (ConnectionError, asyncio.CancelledError) as exc:
            reason = exc
            raise
        except Exception as exc:
            # Input nothing above foresaw (a repr too deep to print, ...): the other side cannot
            # be trusted any more, which is a protocol error, not a reader that dies silently.
            reason = ProtocolError(f"cannot process a message: {type(exc).__name__}: {exc}")
            logger.error("{}: protocol error: {}", self.name, reason)
        finally:
            self._close(reason)

    async def wait_idle(self) -> None:
        """Until every request received so far has been answered."""
        others = [t for t in self._handling if t is not asyncio.current_task()]
        if others:
            await asyncio.gather(*others, return_exceptions=True)

    def _close(self, reason: BaseException) -> None:
        if self._closed is not None:
            return
        self._closed = reason
        for future in self._pending.values():
            if not future.done():
                future.set_exception(ConnectionClosed(f"{self.name}: {reason}"))
        for task in self._handling:
            task.cancel()
        if self.on_close is not None:
            self.on_close(reason)

    def abort(self, reason: BaseException) -> None:
        """Fail every pending request with ``reason`` and stop answering; the owner closes."""
        self._close(reason)

    async def close(self) -> None:
        self._close(ConnectionClosed(f"{self.name}: closed"))
        await self._transport.close()

    async def _receive(self, line: bytes) -> None:
        if self._closed is not None:
            return  # aborted: whatever the other side still says is ignored
        try:
            message = orjson.loads(line) if self._read is None else await self._read(line)
        # orjson.JSONDecodeError, a ValueError: not UTF-8, not JSON (NaN and Infinity are not),
        # a lone surrogate, or nesting deeper than 1024. An integer beyond 64 bits reads as a float.
        except ValueError as exc:
            if self._strict:  # devshim facing a driver: a stray print is the usual cause
                raise ProtocolError(
                    f"not JSON: {exc}: the line began {_quoted(line)} (stdout carries protocol messages "
                    "only: log to stderr)"
                ) from None
            await self._reject(None, ErrorCode.PARSE_ERROR, f"not JSON: {exc}")
            return
        if self._closed is not None:
            return  # aborted while a long line was read in slices
        if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
            await self._reject(None, ErrorCode.INVALID_REQUEST, "not a JSON-RPC 2.0 object")
            return
        if "method" in message:
            method = message["method"]
            if not isinstance(method, str):
                await self._reject(message.get("id"), ErrorCode.INVALID_REQUEST, "method must be a string")
            elif "id" in message:
                task = asyncio.create_task(self._answer(message["id"], method, message.get("params")))
                self._handling.add(task)
                task.add_done_callback(self._handling.discard)
            else:
                self._on_notification(method, message.get("params"))
        elif "id" in message and ("result" in message or "error" in message):
            self._on_response(message)
        else:
            await self._reject(
                message.get("id"), ErrorCode.INVALID_REQUEST, "neither a request nor a response"
            )

    def _on_response(self, message: dict[str, Any]) -> None:
        # type(), not isinstance(): JSON's true is no request id, though Python's True == 1.
        future = self._pending.get(message["id"]) if type(message["id"]) is int else None
        if future is None:
            if message["id"] in self._expired:
                logger.debug("{}: dropping a late answer to request {}", self.name, message["id"])
                return
            if self._strict:
                raise ProtocolError(f"a response to unknown request id {message['id']!r}")
            return
        if future.done():
            return
        error = message.get("error")
        if error is not None:
            if not isinstance(error, dict) or not isinstance(error.get("code"), int):
                future.set_exception(
                    RemoteError(ErrorCode.INTERNAL_ERROR, f"malformed error object {error!r}")
                )
            else:
                future.set_exception(
                    RemoteError(error["code"], str(error.get("message", "")), error.get("data"))
                )
        else:
            future.set_result(message.get("result"))

    def _on_notification(self, method: str, params: Any) -> None:
        handler = self._notifications.get(method)
        if handler is None:
            logger.debug("{}: ignoring unknown notification {!r}", self.name, method)
            return
        try:
            handler(params)
        except RemoteError as exc:
            logger.warning("{}: bad {} notification: {}", self.name, method, exc.message)
        except Exception as exc:
            # Params the handler could not use (devshim's raise DriverProtocolError): the
            # notification is ignored, as an error object would be; the connection stays.
            logger.warning("{}: bad {} notification: {}: {}", self.name, method, type(exc).__name__, exc)

    async def _answer(self, request_id: Any, method: str, params: Any) -> None:
        handler = self._requests.get(method)
        response: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id}
        if handler is None:
            response["error"] = RemoteError(
                ErrorCode.METHOD_NOT_FOUND, f"unknown method {method!r}"
            ).to_json()
        else:
            try:
                response["result"] = await handler(params)
            except RemoteError as exc:
                response["error"] = exc.to_json()
            except Exception as exc:
                logger.exception("{}: {} failed", self.name, method)
                response["error"] = RemoteError(
                    ErrorCode.INTERNAL_ERROR, f"{type(exc).__name__}: {exc}"
                ).to_json()
        try:
            line = encode(response)
        except TypeError as exc:  # a value JSON cannot carry: a key not a string, an int over 64 bits
            logger.error("{}: the answer to {} is not JSON: {}", self.name, method, exc)
            problem = RemoteError(ErrorCode.INTERNAL_ERROR, f"the answer is not JSON: {exc}")
            line = encode({"jsonrpc": "2.0", "id": request_id, "error": problem.to_json()})
        await self._transport.write_message(line)

    async def _reject(self, request_id: Any, code: ErrorCode, message: str) -> None:
        if self._strict:
            raise ProtocolError(message)
        await self._send({"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}})
