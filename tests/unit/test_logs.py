"""The service's log filters: long request paths cut short, client errors one INFO line."""

import logging

from bentoml.exceptions import BadInput

from serve.logs import MAX_LOGGED, ClientErrorsAtInfo, ShortValues


def record(msg: str, args: tuple, level: int = logging.INFO, exc: BaseException | None = None) -> logging.LogRecord:
    exc_info = (type(exc), exc, None) if exc else None
    return logging.LogRecord("bentoml.access", level, __file__, 1, msg, args, exc_info)


def test_a_long_path_is_cut_short():
    entry = record("%s (scheme=%s,path=%s)", ("127.0.0.1:5", "http", "/" + "x" * 10_000))
    assert ShortValues().filter(entry)
    line = entry.getMessage()
    assert len(line) < MAX_LOGGED + 100 and "(10001 characters)" in line


def test_a_client_error_becomes_one_info_line_and_a_server_error_stays():
    client = record("Exception on %s [%s]", ("/classify", "POST"), logging.ERROR, BadInput("top_k=0: must be 1..1000"))
    assert ClientErrorsAtInfo().filter(client)
    assert client.levelno == logging.INFO and client.exc_info is None
    assert client.getMessage() == "POST /classify: 400 top_k=0: must be 1..1000"
    server = record("Exception on %s [%s]", ("/classify", "POST"), logging.ERROR, RuntimeError("boom"))
    assert ClientErrorsAtInfo().filter(server)
    assert server.levelno == logging.ERROR and server.exc_info is not None


def test_the_access_log_writer_writes_every_line_and_counts_what_a_full_queue_dropped():
    """serve/logs.py's writer thread: lines keep their order and format; a blocked output drops lines, never the
    event loop, and the next line written says how many went."""
    import io
    import queue

    from serve.logs import HandOver, Writer

    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    lines: queue.Queue[logging.LogRecord] = queue.Queue(3)
    hand_over = HandOver(lines, [ShortValues()])
    writer = Writer(lines, hand_over, [handler])
    for n in range(5):  # the writer is not running yet, like a blocked stdout: 3 fit, 2 are dropped
        hand_over.handle(record("line %d %s", (n, "/" + "x" * 10_000)))
    writer.start()
    writer.stop()
    written = out.getvalue().splitlines()
    assert written[0] == "WARNING 2 access-log line(s) dropped: the log's output did not keep up"
    assert [line.split()[2] for line in written[1:]] == ["0", "1", "2"] and all(len(w) < 300 for w in written)
    hand_over.handle(record("line %d", (5,)))  # room again: nothing more to report
    writer.start()
    writer.stop()
    assert out.getvalue().splitlines()[4:] == ["INFO line 5"]
