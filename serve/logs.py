"""What the service's log says about clients: one INFO line per client error, and no path longer than a line.

BentoML logs every exception of an API call at ERROR with its traceback, and its access log prints the raw
request path: a scanner's 10 KB paths would fill the log. (The access log's line itself: serve/access_log.py.)
"""

from __future__ import annotations

import logging

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


def install_log_filters() -> None:
    logging.getLogger("bentoml._internal.server.http_app").addFilter(ClientErrorsAtInfo())
    logging.getLogger("bentoml.access").addFilter(ShortValues())
