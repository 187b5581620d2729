"""The service's log: long request paths cut short, BentoML's access line written off the loop."""

import asyncio
import contextvars
import io
import logging
import time

from serve.observability.access_log import AccessLine, AccessLogWriter, Entry, LineFields
from serve.observability.logs import MAX_LOGGED, ShortValues


def record(msg: str, args: tuple) -> logging.LogRecord:
    return logging.LogRecord("bentoml.access", logging.INFO, __file__, 1, msg, args, None)


def test_a_long_path_is_cut_short():
    entry = record("%s (scheme=%s,path=%s)", ("127.0.0.1:5", "http", "/" + "x" * 10_000))
    assert ShortValues().filter(entry)
    line = entry.getMessage()
    assert len(line) < MAX_LOGGED + 100 and "(10001 characters)" in line


def _entry(path: str, status: int = 200) -> Entry:
    scope = {"type": "http", "scheme": "http", "method": "POST", "path": path, "client": ("10.0.0.1", 5), "headers": []}
    start = {"type": "http.response.start", "status": status, "headers": []}
    bare = LineFields(request_length=False, request_type=False, response_length=False, response_type=False)
    return Entry(bare, scope, start, 1.5, time.time(), contextvars.copy_context())


def test_the_access_log_writer_writes_every_line_and_counts_what_a_full_queue_dropped():
    """serve/observability/access_log.py's writer thread: lines keep their order and format; a blocked output drops
    lines, never the event loop, and the next line written says how many went."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    writer = AccessLogWriter([ShortValues()], [handler], capacity=3)
    for n in range(5):  # the writer is not running yet, like a blocked stdout: 3 fit, 2 are dropped
        writer.put(_entry(f"/{n}" + "x" * 10_000))
    writer.start()
    writer.stop()
    written = out.getvalue().splitlines()
    assert written[0] == "WARNING 2 access-log line(s) dropped: the log's output did not keep up"
    assert [line.split("path=")[1][:2] for line in written[1:]] == ["/0", "/1", "/2"] and all(
        len(w) < 300 for w in written
    )
    writer.put(_entry("/5"))  # room again: nothing more to report
    writer.start()
    writer.stop()
    assert out.getvalue().splitlines()[4:] == ["INFO 10.0.0.1:5 (scheme=http,method=POST,path=/5) (status=200) 1.500ms"]


def test_the_access_line_is_bentomls_line():
    """AccessLine, as the service adds it (its defaults), writes BentoML's AccessLogMiddleware's line with BentoML's
    default configuration (every optional field on), the latency aside."""
    from bentoml._internal.server.http.access import AccessLogMiddleware

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 201, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": b"{}", "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    async def nothing(message):
        pass

    scope = {
        "type": "http",
        "scheme": "https",
        "method": "POST",
        "path": "/classify",
        "client": ("10.1.2.3", 40000),
        "headers": [(b"content-type", b"image/png"), (b"content-length", b"123")],
    }
    options = dict.fromkeys(
        (
            "has_request_content_length",
            "has_request_content_type",
            "has_response_content_length",
            "has_response_content_type",
        ),
        True,
    )
    records = []
    catch = logging.Handler()
    catch.emit = records.append
    logger = logging.getLogger("bentoml.access")
    logger.addHandler(catch)
    level, logger.level = logger.level, logging.INFO
    try:
        asyncio.run(AccessLogMiddleware(app, **options)(dict(scope), None, nothing))
        asyncio.run(AccessLine(app)(dict(scope), None, nothing))
    finally:
        logger.removeHandler(catch)
        logger.level = level
    theirs, ours = (record.getMessage().rsplit(" ", 1)[0] for record in records)
    assert (
        ours
        == theirs
        == (
            "10.1.2.3:40000 (scheme=https,method=POST,path=/classify,type=image/png,length=123) "
            "(status=201,type=application/json,length=)"
        )
    )


def test_a_line_that_cannot_be_made_is_lost_alone():
    """A filter that fails on one line costs that line, not the writer thread that writes every later one."""

    class FailsOnce(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            if "/bad" in str(record.args):
                raise ValueError("boom")
            return True

    out = io.StringIO()
    handler = logging.StreamHandler(out)
    writer = AccessLogWriter([FailsOnce()], [handler])
    for path in ("/a", "/bad", "/b"):
        writer.put(_entry(path))
    writer.start()
    writer.stop()
    assert [line.split("path=")[1].split(")")[0] for line in out.getvalue().splitlines()] == ["/a", "/b"]


def test_controls_are_cut_before_they_are_escaped_and_bidi_controls_escaped():
    """Security round 4, items 10 and 11: a path of 10,000 control characters was escaped whole (40,000 characters
    built) before it was cut; U+202E, which reverses what a person reads, was written raw."""
    from serve.observability.logs import printable

    line = printable("/\x01" * 5_000)
    assert line.endswith("...(10000 characters)") and len(line) <= 4 * MAX_LOGGED + 30
    assert printable("/files/\u202egnp.exe") == "/files/\\u202egnp.exe"


def test_only_the_probes_own_paths_go_unlogged():
    """Security round 4, item 11: any path merely starting with /readyz or /metrics went unlogged."""
    from serve.observability.access_log import SKIPPED

    written = []

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 404, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    class Capture(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            written.append(record.getMessage())

    capture = Capture()
    access = logging.getLogger("bentoml.access")
    access.addHandler(capture)
    access.setLevel(logging.INFO)
    try:
        for path in ("/readyz", "/readyz/../../admin", "/metricsX"):
            scope = {"type": "http", "scheme": "http", "method": "GET", "path": path, "headers": [], "client": None}
            asyncio.run(AccessLine(app)(scope, None, _discard))
            time.sleep(0.05)
    finally:
        access.removeHandler(capture)
    assert "/readyz" in SKIPPED
    logged = " ".join(written)
    assert "path=/readyz/../../admin" in logged and "path=/metricsX" in logged and "path=/readyz)" not in logged


async def _discard(message) -> None:
    return None


def test_refusals_for_load_are_logged_once_every_few_seconds_with_how_many_came_since(monkeypatch):
    """An overloaded model refusing clients that send again at once: thousands of 503s a second, a line every few
    seconds saying how many; another kind of refusal has lines of its own."""
    import serve.observability.logs as logs

    records: list[str] = []
    logger = logging.getLogger("handoff-test-repeats")
    logger.propagate = False
    logger.setLevel(logging.INFO)
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())  # type: ignore[method-assign]
    logger.addHandler(handler)
    now = [1000.0]
    monkeypatch.setattr(logs.time, "monotonic", lambda: now[0])
    repeats = logs.Repeats(logger)
    for _ in range(3000):
        repeats.log(logging.WARNING, "503 overloaded", "%s %s: %d %s", "POST", "/detect", 503, "overloaded")
        now[0] += 0.001  # three seconds in all
    repeats.log(logging.INFO, "429 too many", "%s %s: %d %s", "POST", "/detect", 429, "too many")
    now[0] += logs.REPEATS_EVERY_S
    repeats.log(logging.WARNING, "503 overloaded", "%s %s: %d %s", "POST", "/detect", 503, "overloaded")
    assert records == [
        "POST /detect: 503 overloaded",
        "POST /detect: 429 too many",
        "POST /detect: 503 overloaded (and 2999 more like it since the last such line)",
    ]


def test_a_record_copied_from_an_earlier_one_is_the_record_logging_makes():
    """The writer makes each line's record by copying the fields of the first it made (logging reads the thread,
    the process and the caller for each record, the same every time): the copy has every field logging gives it."""
    from serve.observability.access_log import make_record

    first = make_record(_entry("/first"))
    later = _entry("/later", status=503)._replace(created=first.created + 2.5)
    made, copied = make_record(later).__dict__, make_record(later, like=first).__dict__
    assert copied.keys() == made.keys() and copied["args"] == made["args"]
    assert abs(copied["relativeCreated"] - first.relativeCreated - 2500) < 1e-6  # dated, as `created`, at the answer
    assert copied["created"] == later.created and copied["msecs"] == made["msecs"]
    same = ("relativeCreated", "created", "msecs")
    assert {k: v for k, v in copied.items() if k not in same} == {k: v for k, v in made.items() if k not in same}
    assert "path=/later" in logging.Formatter("%(message)s").format(make_record(later, like=first))
