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
