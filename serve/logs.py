"""What the service's log says about clients: one INFO line per client error, and no path longer than a line;
and the access log written by a thread of its own, not by the event loop.

BentoML logs every exception of an API call at ERROR with its traceback, and its access log prints the raw
request path: a scanner's 10 KB paths would fill the log. Its access line is formatted and written to stdout
on the event loop, once per request (py-spy: 8% of the loop's time serving the digits model at c=64).
"""

from __future__ import annotations

import atexit
import copy
import logging
import queue
from logging.handlers import QueueHandler, QueueListener
from typing import Any

MAX_LOGGED = 200  # characters of any one value in a log line: a normal access-log field fits, a 10 KB path does not
CLIENT_ERROR = "%s %s: %d %s"  # method, path, status, what was wrong: the one line a client's mistake gets


def client_error_args(
    method: object, path: object, status: int, error: BaseException
) -> tuple[object, object, int, str]:
    return method, path, status, str(error)[:MAX_LOGGED]


class ClientErrorsAtInfo(logging.Filter):
    """BentoML logs every exception of an API call at ERROR with its traceback; a 4xx is the client's doing,
    so it becomes one INFO line (what was wrong), and the server's log keeps ERROR for real faults."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        status = getattr(getattr(error, "error_code", None), "value", 500)
        if record.levelno >= logging.ERROR and error is not None and 400 <= status < 500:
            path, method = record.args if isinstance(record.args, tuple) and len(record.args) == 2 else ("?", "?")
            record.levelno, record.levelname = logging.INFO, "INFO"
            record.msg, record.args = CLIENT_ERROR, client_error_args(method, path, status, error)
            record.exc_info, record.exc_text = None, None
        return True


class ShortValues(logging.Filter):
    """Cut every long string in a log record's arguments (the request path above all) to MAX_LOGGED characters."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(_short(value) for value in record.args)
        return True


def _short(value: object) -> object:
    if isinstance(value, str) and len(value) > MAX_LOGGED:
        return f"{value[:MAX_LOGGED]}...({len(value)} characters)"
    return value


ACCESS_QUEUE_LINES = 10_000  # lines waiting for the writer; past that (stdout blocked) they are counted, not kept


class HandOver(QueueHandler):
    """Runs the handlers' filters where the record is made (BentoML's read the request's trace ids from context
    variables, which the writer thread does not see), then queues the record unformatted; a full queue drops
    the line and counts it rather than growing or blocking the event loop."""

    def __init__(self, lines: queue.Queue[logging.LogRecord], filters: list[Any]) -> None:
        super().__init__(lines)
        self.filters = list(filters)
        self.dropped = 0

    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        return record  # formatting is the writer's work; the access line's arguments are strings and numbers

    def enqueue(self, record: logging.LogRecord) -> None:
        try:
            self.queue.put_nowait(record)
        except queue.Full:
            self.dropped += 1


class Writer(QueueListener):
    """Formats and writes the queued records; says how many were dropped once the queue has room again."""

    def __init__(self, lines: queue.Queue[logging.LogRecord], hand_over: HandOver, handlers: list[logging.Handler]):
        super().__init__(lines, *handlers, respect_handler_level=True)
        self.hand_over = hand_over

    def handle(self, record: logging.LogRecord) -> None:
        if self.hand_over.dropped:
            dropped, self.hand_over.dropped = self.hand_over.dropped, 0
            note = copy.copy(record)  # with the fields BentoML's filters added, which its format prints
            note.msg, note.args = f"{dropped} access-log line(s) dropped: the log's output did not keep up", ()
            note.levelno, note.levelname, note.levelname_bracketed = logging.WARNING, "WARNING", "[WARNING]"
            super().handle(note)
        super().handle(record)


def write_access_log_off_the_loop() -> Writer | None:
    """Move the `bentoml.access` lines to a writer thread: the same handlers, formats and destination. Returns
    the writer, or None where BentoML has not configured its server logging (the line stays as it is)."""
    access, parent = logging.getLogger("bentoml.access"), logging.getLogger("bentoml")
    if access.handlers or not parent.handlers or access.propagate is False:
        return None  # not BentoML's server configuration, or already moved
    filters = [f for handler in parent.handlers for f in handler.filters]
    writers: list[logging.Handler] = []
    for handler in parent.handlers:
        if isinstance(handler, logging.StreamHandler):  # a copy without the filters, which ran on the loop's side
            writer_side = logging.StreamHandler(handler.stream)
            writer_side.setLevel(handler.level)
            writer_side.setFormatter(handler.formatter)
            handler = writer_side
        writers.append(handler)
    lines: queue.Queue[logging.LogRecord] = queue.Queue(ACCESS_QUEUE_LINES)
    hand_over = HandOver(lines, filters)
    writer = Writer(lines, hand_over, writers)
    access.addHandler(hand_over)
    access.propagate = False
    writer.start()
    atexit.register(writer.stop)  # the lines still queued are written before the worker exits
    return writer


def install_log_filters() -> None:
    logging.getLogger("bentoml._internal.server.http_app").addFilter(ClientErrorsAtInfo())
    logging.getLogger("bentoml.access").addFilter(ShortValues())
