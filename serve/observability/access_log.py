"""The access log: BentoML's line for every request, made and written by a thread of its own.

BentoML's AccessLogMiddleware builds its line and its log record on the event loop after each response, and hands it
to the log's handlers there: about twice the loop's CPU of the request's own front door (docs/history.md). So the
service turns BentoML's off in its configuration (`logging.access.enabled: false`) and adds `AccessLine` to its
middlewares (serve/http/front.py): the same line, logger, fields and skipped paths as BentoML's defaults, but the loop
only hands over what the line is made of: the request's scope, the response's first message, the latency, the time, and
the request's context, where BentoML's log filters read the trace ids. A writer thread makes the records, runs the
filters inside that context, formats them and writes the lines of up to 50 ms at a time (one wake-up and one write
each, not one per line). Past 10,000 waiting lines (a blocked stdout: a log collector that stops reading) lines are
dropped and counted, never the loop blocked, and the next line written says how many went.

Where BentoML has not configured its server logging (an app called in process), the line is logged on the spot.
HANDOFF_ACCESS_LOG=0 leaves the middleware out.
"""

from __future__ import annotations

import atexit
import contextlib
import contextvars
import copy
import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any, NamedTuple

from serve.http.front_door import Receive, Scope, Send

LINE = "%s (%s) (%s) %.3fms"  # BentoML's: address (request) (response) latency
ACCESS_QUEUE_LINES = 10_000  # lines waiting for the writer; past that (stdout blocked) they are counted, not kept
WRITE_EVERY_S = 0.05  # the writer wakes at most this often, and writes what has gathered at once
LOGGER = logging.getLogger("bentoml.access")
log = logging.getLogger("bentoml.handoff.access_log")


SKIPPED = ("/metrics", "/healthz", "/livez", "/readyz")  # BentoML's default: no line for probes and scrapes


@dataclass(frozen=True)
class LineFields:
    """The optional fields of the line; all four, as BentoML's default configuration has them."""

    request_length: bool = True
    request_type: bool = True
    response_length: bool = True
    response_type: bool = True

    def args(self, scope: Scope, start: dict[str, Any] | None, latency_ms: float) -> tuple[object, ...]:
        """The line's arguments, as BentoML's middleware formats them."""
        client = scope.get("client")
        request = f"scheme={scope['scheme']},method={scope.get('method', '')},path={scope['path']}"
        if self.request_type or self.request_length:
            request += self._optional(scope["headers"], self.request_type, self.request_length)
        response = f"status={start['status'] if start else 0}"
        if self.response_type or self.response_length:
            response += self._optional(start["headers"] if start else [], self.response_type, self.response_length)
        address = f"{client[0]}:{client[1]}" if client else "_"
        return address, request, response, latency_ms

    @staticmethod
    def _optional(headers: list[tuple[bytes, bytes]], content_type: bool, content_length: bool) -> str:
        length, kind = _content(headers)
        return (f",type={kind}" if content_type else "") + (f",length={length}" if content_length else "")


def _content(headers: list[tuple[bytes, bytes]]) -> tuple[str, str]:
    """(Content-Length, Content-Type) as sent, "" where absent."""
    length, kind = b"", b""
    for key, value in headers:
        if key == b"content-length":
            length = value
        elif key == b"content-type":
            kind = value
    return length.decode("latin-1"), kind.decode("latin-1")


class Entry(NamedTuple):
    """What the loop hands the writer for one line."""

    fields: LineFields
    scope: Scope
    start: dict[str, Any] | None  # the response's http.response.start message
    latency_ms: float
    created: float  # time.time() when the response ended
    context: contextvars.Context


class AccessLogWriter:
    """Makes, filters and writes the lines `put` hands it, in a thread of its own."""

    def __init__(self, filters: list[Any], handlers: list[logging.Handler], capacity: int = ACCESS_QUEUE_LINES) -> None:
        self.entries: queue.SimpleQueue[Entry | None] = queue.SimpleQueue()
        self.capacity = capacity
        self.filters = logging.Filterer()  # the server handlers' filters, which read the request's context
        for f in filters:
            self.filters.addFilter(f)
        self.handlers = handlers
        self.dropped = 0
        self._thread: threading.Thread | None = None
        self._template: logging.LogRecord | None = None  # the first record made, whose fields the others copy

    def put(self, entry: Entry) -> None:
        """On the event loop: queue the line, or count it where the queue is full."""
        if self.entries.qsize() >= self.capacity:
            self.dropped += 1
        else:
            self.entries.put(entry)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._write_all, name="handoff-access-log", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Write the lines still queued, then end the thread."""
        if self._thread is not None:
            self.entries.put(None)
            self._thread.join()
            self._thread = None

    def _write_all(self) -> None:
        while True:
            batch = [self.entries.get()]  # waits for a line
            time.sleep(WRITE_EVERY_S)  # then lets more gather: one wake-up and one write per batch, not per line
            while not self.entries.empty():
                batch.append(self.entries.get_nowait())
            last = batch.index(None) if None in batch else len(batch)  # None: stop() asks the thread to end
            self._write([record for entry in batch[:last] if (record := self._record(entry)) is not None])
            if last < len(batch):
                return

    def _record(self, entry: Entry | None) -> logging.LogRecord | None:
        """The entry's record with BentoML's filters run inside the request's context; None if one refuses it
        (or fails: the line is lost, not the thread that writes every later one)."""
        assert entry is not None
        try:
            if self._template is None:  # made here, in the writer's thread, as every record after it
                self._template = make_record(entry)
            record = make_record(entry, self._template)
            return record if entry.context.run(self._passes, record) else None
        except Exception:  # noqa: BLE001 - a filter's or a field's fault
            log.exception("an access-log line could not be made")
            return None

    def _passes(self, record: logging.LogRecord) -> bool:
        return bool(LOGGER.filter(record)) and bool(self.filters.filter(record))

    def _write(self, records: list[logging.LogRecord]) -> None:
        if self.dropped and records:
            dropped, self.dropped = self.dropped, 0
            note = copy.copy(records[0])  # with the fields BentoML's filters added, which its format prints
            note.msg, note.args = f"{dropped} access-log line(s) dropped: the log's output did not keep up", ()
            note.levelno, note.levelname, note.levelname_bracketed = logging.WARNING, "WARNING", "[WARNING]"
            records.insert(0, note)
        for handler in self.handlers:
            mine = [record for record in records if record.levelno >= handler.level]
            if mine and isinstance(handler, logging.StreamHandler):  # the batch in one write and one flush
                try:
                    text = "".join(handler.format(record) + handler.terminator for record in mine)
                    with handler.lock or contextlib.nullcontext():
                        handler.stream.write(text)
                        handler.stream.flush()
                except Exception:  # noqa: BLE001 - as logging's own handlers do: report, never raise
                    handler.handleError(mine[0])
            else:
                for record in mine:
                    handler.handle(record)


def make_record(entry: Entry, like: logging.LogRecord | None = None) -> logging.LogRecord:
    """The line's record, dated when the response ended. `like`, a record made before in the same thread: its
    fields are copied instead of made again, as logging makes them for every record (the thread's and the
    process's names, the caller's file and module: a third of a line's cost, and the same for every line)."""
    args = entry.fields.args(entry.scope, entry.start, entry.latency_ms)
    if like is None:
        record = LOGGER.makeRecord(LOGGER.name, logging.INFO, __file__, 0, LINE, args, None)
    else:
        record = type(like).__new__(type(like))  # the class logging's record factory made it of
        record.__dict__.update(like.__dict__)
        record.args = args
        record.relativeCreated = like.relativeCreated + (entry.created - like.created) * 1000
    record.created, record.msecs = entry.created, (entry.created - int(entry.created)) * 1000
    return record


_writer: AccessLogWriter | None = None  # set in the server's worker by write_access_log_off_the_loop()


class AccessLine:
    """BentoML's access-log line for every request but the probes and scrapes (`skip_paths`)."""

    def __init__(self, app: Any, fields: LineFields | None = None, skip_paths: tuple[str, ...] = SKIPPED) -> None:
        self.app = app
        self.fields = fields or LineFields()
        self.skip_paths = skip_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        logged = scope["type"] == "http" and LOGGER.isEnabledFor(logging.INFO)  # (the service has no websockets)
        if not logged or scope["path"] in self.skip_paths:  # the probes' own paths, not all that begin like them
            return await self.app(scope, receive, send)
        began = time.perf_counter()
        start: dict[str, Any] | None = None

        async def logged_send(message: dict[str, Any]) -> None:
            nonlocal start
            if message["type"] == "http.response.start":
                start = message
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                latency_ms = max(time.perf_counter() - began, 0.0) * 1000
                await send(message)
                entry = Entry(self.fields, scope, start, latency_ms, time.time(), contextvars.copy_context())
                if _writer is not None:
                    _writer.put(entry)
                else:
                    LOGGER.handle(make_record(entry))
                return
            await send(message)

        await self.app(scope, receive, logged_send)


def write_access_log_off_the_loop() -> AccessLogWriter | None:
    """Write the `bentoml.access` lines from a thread: the same handlers, formats and destination. Returns the
    writer, or None where BentoML has not configured its server logging (lines are then logged on the spot)."""
    global _writer
    parent = logging.getLogger("bentoml")
    if _writer is not None or LOGGER.handlers or not parent.handlers or not LOGGER.propagate:
        return None  # not BentoML's server configuration, or already moved
    filters = [f for handler in parent.handlers for f in handler.filters]
    handlers: list[logging.Handler] = []
    for handler in parent.handlers:
        if isinstance(handler, logging.StreamHandler):  # a copy without the filters, which the writer runs itself
            writer_side = logging.StreamHandler(handler.stream)
            writer_side.setLevel(handler.level)
            writer_side.setFormatter(handler.formatter)
            handler = writer_side
        handlers.append(handler)
    _writer = AccessLogWriter(filters, handlers)
    _writer.start()
    atexit.register(_writer.stop)  # the lines still queued are written before the worker exits
    return _writer
