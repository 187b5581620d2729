"""Bounds on connections, below HTTP: a cap on open connections, a deadline for a request's headers, an
idle timeout for a connection that never sends one and the keep-alive timeout between requests.

uvicorn (which BentoML runs) closes a kept-alive connection after 5 idle seconds, but a fresh connection
that sends nothing, or sends its headers a byte at a time, may stay open forever, and it accepts connections
until the process runs out of file descriptors: ~20,000 idle sockets left /livez, /readyz and /info
unanswered, with nothing logged. An ASGI middleware never sees such a connection (it sees requests), so
these bounds live in uvicorn's HTTP protocol: `install` makes uvicorn build its connections from a subclass
of its own protocol class that adds them, before BentoML's worker starts uvicorn (uvicorn is pinned in
pyproject.toml for that reason; tests/test_serve_attacks.py holds it to its promises).

At the cap, a new connection sheds the oldest one that has no request in progress (idle, or still sending
its headers), so a probe that connects afresh is answered even while thousands of idle sockets are open; only
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
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("bentoml.handoff.connections")

DESCRIPTORS_KEPT_FREE = 64  # for the model's files, logs and the metrics folder, whatever the cap
LOG_EVERY_S = 5.0


@dataclass(frozen=True)
class ConnectionLimits:
    max_connections: int
    header_timeout_s: float
    """a request's headers must be complete this long after its first byte"""
    idle_timeout_s: float
    """a fresh connection must send its first byte within this"""
    keep_alive_s: float
    """a kept-alive connection is closed after this long without a request"""

    def effective_max(self) -> int:
        """The cap, kept under the file descriptors this process may open (ulimit -n)."""
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft == resource.RLIM_INFINITY:
            return self.max_connections
        return max(1, min(self.max_connections, soft - DESCRIPTORS_KEPT_FREE))


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


def guarded(protocol: type[asyncio.Protocol], limits: ConnectionLimits) -> type[asyncio.Protocol]:
    """A subclass of uvicorn's HTTP protocol class `protocol` that enforces `limits`."""
    cap = limits.effective_max()
    shedding = _Shedding()

    class GuardedProtocol(protocol):  # type: ignore[misc, valid-type]
        deadline: asyncio.TimerHandle | None = None

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.timeout_keep_alive = limits.keep_alive_s  # uvicorn's attribute, read after each response

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            super().connection_made(transport)
            if len(shedding.open) >= cap and not self._shed_oldest_idle():
                shedding.refused += 1
                shedding.report(cap)
                transport.close()
                return
            shedding.open[self] = None
            self._arm(limits.idle_timeout_s, idle=True)

        def connection_lost(self, exc: Exception | None) -> None:
            shedding.open.pop(self, None)
            self._disarm()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if not self._in_request() and self.deadline is None:
                self._arm(limits.header_timeout_s, idle=False)  # a request's first byte: its headers have this long
            super().data_received(data)
            if self._in_request():
                self._disarm()

        def _in_request(self) -> bool:
            cycle = getattr(self, "cycle", None)
            return cycle is not None and not cycle.response_complete

        def _arm(self, seconds: float, idle: bool) -> None:
            self._disarm()
            self.deadline = self.loop.call_later(seconds, self._expire, idle)

        def _disarm(self) -> None:
            if self.deadline is not None:
                self.deadline.cancel()
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
                if not connection._in_request() and _close_if_quiet(connection.transport):
                    shedding.open.pop(connection)
                    shedding.shed += 1
                    shedding.report(cap)
                    return True
            return False

    GuardedProtocol.__name__ = GuardedProtocol.__qualname__ = f"Guarded{protocol.__name__}"
    return GuardedProtocol


def install(limits: ConnectionLimits) -> None:
    """Make uvicorn's default ("auto") HTTP protocol the guarded one; BentoML's worker starts uvicorn with it."""
    from uvicorn.protocols.http import auto

    if not getattr(auto.AutoHTTPProtocol, "handoff_guarded", False):
        auto.AutoHTTPProtocol = guarded(auto.AutoHTTPProtocol, limits)
        auto.AutoHTTPProtocol.handoff_guarded = True  # type: ignore[attr-defined]
