"""Bounds on connections, below HTTP: a cap on open connections, a deadline for a request's headers, an
idle timeout for a connection that never sends one and the keep-alive timeout between requests.

uvicorn (which BentoML runs) closes a kept-alive connection after 5 idle seconds, but a fresh connection
that sends nothing, or sends its headers a byte at a time, may stay open forever, and it accepts connections
until the process runs out of file descriptors: ~20,000 idle sockets left /livez, /readyz and /info
unanswered, with nothing logged. An ASGI middleware never sees such a connection (it sees requests), so
these bounds live in uvicorn's HTTP protocol: `guarded` makes a subclass of uvicorn's protocol class that adds
them, which serve/patches.py makes uvicorn's default before BentoML's worker starts it (uvicorn's range in
pyproject.toml is narrow for that reason; tests/test_serve_attacks.py holds it to its promises).

The idle and header deadlines are each watched by one timer a tick (serve/http/deadline_sweep.py), not a timer armed
and cancelled for every request's first byte.

At the cap, a new connection sheds the oldest one that has no request in progress (idle, or still sending
its headers) or whose request only waits to send a paced refusal (serve/http/refusal_pace.py), so a probe that connects
afresh is answered even while thousands of idle sockets are open or a flood of refused clients holds the cap; only
when every connection is busy with a request is the new one closed. Each shed is counted and logged, at most
one line every few seconds.

Closing an idle connection races with the client's next request on it, so the keep-alive timeout (uvicorn's
5 s) is made longer than the clients' and proxies' own idle timeouts: they close first. The 1,000-request soak,
whose client (httpx) drops a connection idle for 5 s, saw ~19 connections closed by the server's 5 s in each
run, and once in a while a reset. Where the server does close, `_close_if_quiet` keeps that race to
microseconds. uvloop runs due timers before it reads the sockets, and its transport closes the socket only on a
later turn of the event loop, so under load a request could arrive, or be sent, well after the server had
decided to close: the kernel then resets the connection and the client sees "connection reset" on a request
it sent in time (1 in 1,000 to 10,000 requests of the soak; ~1 in 40 sent at the keep-alive deadline).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import resource
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from serve.http.deadline_sweep import DeadlineSweep
from serve.http.refusal_pace import PACED

log = logging.getLogger("bentoml.handoff.connections")

DESCRIPTORS_KEPT_FREE = 64  # for the model's files, logs and the metrics folder, whatever the cap
LOG_EVERY_S = 5.0
# Requests a client may send ahead on one connection (HTTP/1.1 pipelining) before its answers: uvicorn parses a
# whole read and queues every request in it, so 6 MB of them held 170-380 MB and delayed the probes by 3.6 s.
MAX_PIPELINED = 16


def headers_too_large(limit: int) -> bytes:
    """The 431 answer, written straight to the socket: the request never reached the app."""
    body = b'{"error": "the request line and headers are larger than %d bytes"}' % limit
    head = b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\nconnection: close\r\n"
    return head + b"content-length: %d\r\n\r\n" % len(body) + body


@dataclass(frozen=True)
class ConnectionLimits:
    max_connections: int
    header_timeout_s: float
    """a request's headers must be complete this long after its first byte"""
    idle_timeout_s: float
    """a fresh connection must send its first byte within this"""
    keep_alive_s: float
    """a kept-alive connection is closed after this long without a request"""
    max_header_bytes: int = 64 * 1024
    """a request's line and headers together; more is answered 431 and the connection closed"""
    write_timeout_s: float = 30.0
    """a response write the client does not read for this long (the send buffer stays full) closes the connection"""

    def effective_max(self) -> int:
        """The cap, kept under the file descriptors this process may open (ulimit -n)."""
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft == resource.RLIM_INFINITY:
            return self.max_connections
        return max(1, min(self.max_connections, soft - DESCRIPTORS_KEPT_FREE))


def _header_part(tail: bytes, data: bytes) -> int:
    """How many bytes of `data` belong to a request's headers, which have so far ended with `tail` (up to 3 bytes):
    up to the blank line that ends them where `data` holds it, else all of it."""
    end = (tail + data).find(b"\r\n\r\n")
    return len(data) if end < 0 else max(0, end + 4 - len(tail))


def _close_if_quiet(transport: asyncio.BaseTransport) -> bool:
    """Close a connection unless the client has already sent more (bytes this process has not read yet).
    Its end-of-stream goes out now, not on the event loop's next turn, so that the client sees it before it
    sends another request."""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        try:  # uvloop hands out a stand-in socket without recv: use a duplicate of its descriptor
            with socket.fromfd(sock.fileno(), sock.family, socket.SOCK_STREAM) as duplicate:
                if _unread(duplicate):
                    return False  # data_received reads it next
                duplicate.shutdown(socket.SHUT_WR)
        except OSError:  # the socket is already gone
            pass
    transport.close()
    return True


def _unread(sock: socket.socket) -> bool:
    try:
        return bool(sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT))
    except BlockingIOError:
        return False


class _Shedding:
    """The connections in the order they opened, and the count of those shed since the last log line."""

    def __init__(self) -> None:
        self.open: collections.OrderedDict[Any, None] = collections.OrderedDict()
        self.shed = self.refused = 0
        self.logged_at = 0.0

    def report(self, limit: int) -> None:
        now = time.monotonic()
        if now - self.logged_at >= LOG_EVERY_S:
            log.warning(
                "at the connection limit (%d, HANDOFF_MAX_CONNECTIONS): closed %d idle connection(s) and refused %d "
                "new one(s) since the last report",
                limit,
                self.shed,
                self.refused,
            )
            self.shed = self.refused = 0
            self.logged_at = now


def guarded(
    protocol: type[asyncio.Protocol], limits: ConnectionLimits, app_around: Callable[[Any], Any] | None = None
) -> type[asyncio.Protocol]:
    """A subclass of uvicorn's HTTP protocol class `protocol` that enforces `limits`; `app_around`, given uvicorn's
    app, returns the app its connections call instead (serve/http/front.py)."""
    cap = limits.effective_max()
    shedding = _Shedding()
    # A fresh connection's first byte, and each request's headers, are waited for under one timer a tick each.
    idle_deadlines = DeadlineSweep(limits.idle_timeout_s, lambda connection: connection._expire(idle=True))
    header_deadlines = DeadlineSweep(limits.header_timeout_s, lambda connection: connection._expire(idle=False))
    counts_headers = hasattr(protocol, "on_headers_complete")  # httptools' callbacks, which the counting needs

    class GuardedProtocol(protocol):  # type: ignore[misc, valid-type]
        connections_served = 0
        deadline: DeadlineSweep | None = None  # the sweep watching this connection, if one is
        write_deadline: asyncio.TimerHandle | None = None
        header_bytes = 0  # received while the request's headers are incomplete
        header_tail = b""  # their last bytes so far, where the blank line that ends them may have begun
        headers_done = False

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.timeout_keep_alive = limits.keep_alive_s  # uvicorn's attribute, read after each response
            # uvicorn's own access line (handoff's is serve/observability/access_log.py): uvicorn makes its arguments
            # for every response whenever any handler exists, the root's included, even where the logger writes nothing
            # (BentoML's server leaves it at WARNING): a quoted path and the client's address, made for nothing.
            self.access_log = self.access_log and self.access_logger.isEnabledFor(logging.INFO)  # type: ignore[has-type]
            if app_around is not None:  # uvicorn's attribute: the app each request of this connection calls
                self.app = app_around(self.app)  # type: ignore[has-type]

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            super().connection_made(transport)
            GuardedProtocol.connections_served += 1  # the start-up self-check's evidence (serve/patches.py)
            if len(shedding.open) >= cap and not self._shed_oldest_idle():
                shedding.refused += 1
                shedding.report(cap)
                transport.close()
                return
            shedding.open[self] = None
            self._arm(idle_deadlines)

        def connection_lost(self, exc: Exception | None) -> None:
            shedding.open.pop(self, None)
            self._disarm()
            self._disarm_write()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if not self._in_request() and self.deadline is not header_deadlines:
                # A request's first byte: its headers have this long, counted from now however fast they stream.
                self._arm(header_deadlines)
            # Counted before parsing, up to the headers' end where this read holds it, so that headers that come
            # whole in one read are counted too (a 100 KB header was answered 200, security round 5) and a body
            # read with its headers is not. (h11 bounds headers itself.)
            if counts_headers and (not self.headers_done or not self._in_request()):  # a request's headers, or
                # the next request's on a kept-alive connection
                if self.header_bytes + _header_part(self.header_tail, data) > limits.max_header_bytes:
                    return self._refuse_headers()
            super().data_received(data)
            if counts_headers and not self.headers_done:
                self.header_bytes += len(data)
                self.header_tail = (self.header_tail + data)[-3:]
            if len(getattr(self, "pipeline", ())) > MAX_PIPELINED:
                log.warning("closed a connection with more than %d pipelined requests", MAX_PIPELINED)
                self.transport.close()
                return
            if self._in_request():
                self._disarm()

        def handle_websocket_upgrade(self) -> None:  # uvicorn's: the socket goes to its WebSocket protocol
            shedding.open.pop(self, None)  # which this table does not follow (it leaked the entry)
            self._disarm()
            self._disarm_write()
            super().handle_websocket_upgrade()

        # httptools' parser callbacks: where a request's headers begin and end.
        def on_message_begin(self) -> None:
            self.headers_done = False
            super().on_message_begin()

        def on_headers_complete(self) -> None:
            self.headers_done, self.header_bytes, self.header_tail = True, 0, b""
            super().on_headers_complete()

        def _refuse_headers(self) -> None:
            """431 and close: the parser has kept every byte of the headers so far, and would keep the rest."""
            self.transport.write(headers_too_large(limits.max_header_bytes))
            self.transport.close()
            self.headers_done = True  # nothing more is parsed on this connection

        # The transport's flow control: the client has not read what was sent (its buffers are full).
        def pause_writing(self) -> None:
            super().pause_writing()
            if self.write_deadline is None:
                self.write_deadline = self.loop.call_later(limits.write_timeout_s, self._write_expired)

        def resume_writing(self) -> None:
            self._disarm_write()
            super().resume_writing()

        def _disarm_write(self) -> None:
            if self.write_deadline is not None:
                self.write_deadline.cancel()
                self.write_deadline = None

        def _write_expired(self) -> None:
            self.write_deadline = None
            log.warning("closed a connection whose client read nothing for %g s", limits.write_timeout_s)
            self.transport.abort()  # close() would wait, forever, to flush what the client never reads

        def _stalled(self) -> bool:
            """Stuck writing an answer the client does not read: sheddable like an idle connection."""
            return self.write_deadline is not None

        def _in_request(self) -> bool:
            cycle = getattr(self, "cycle", None)
            return cycle is not None and not cycle.response_complete

        def _paced(self) -> bool:
            """Waiting only to send a refusal for load (serve/http/refusal_pace.py): sheddable like an idle
            connection."""
            cycle = getattr(self, "cycle", None)
            return cycle is not None and not cycle.response_complete and bool(cycle.scope.get(PACED))

        def _arm(self, sweep: DeadlineSweep) -> None:
            self._disarm()
            sweep.record(self)
            self.deadline = sweep

        def _disarm(self) -> None:
            if self.deadline is not None:
                self.deadline.forget(self)
                self.deadline = None

        def _expire(self, idle: bool) -> None:
            self.deadline = None
            if self._in_request():
                return
            if idle:
                _close_if_quiet(self.transport)  # a first byte in time: data_received arms the header deadline
            else:
                self.transport.close()  # headers past their deadline, however many bytes are still coming

        def timeout_keep_alive_handler(self) -> None:  # uvicorn's, for a kept-alive connection
            if not self.transport.is_closing():
                _close_if_quiet(self.transport)

        def _shed_oldest_idle(self) -> bool:
            for connection in shedding.open:
                if connection._stalled() or connection._paced():
                    connection.transport.abort()
                elif connection._in_request() or not _close_if_quiet(connection.transport):
                    continue
                shedding.open.pop(connection)
                shedding.shed += 1
                shedding.report(cap)
                return True
            return False

    GuardedProtocol.__name__ = GuardedProtocol.__qualname__ = f"Guarded{protocol.__name__}"
    GuardedProtocol.handoff_guarded = True
    return GuardedProtocol
