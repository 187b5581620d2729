"""What the service's log says about clients: one INFO line per client error (`CLIENT_ERROR`, written by the
handlers), and no value longer than a line or breaking one.

The access log prints the raw request path: a scanner's 10 KB paths would fill the log, and a newline in one
would forge a line. (The access log's line itself: serve/access_log.py.)
"""

from __future__ import annotations

import logging
import re

MAX_LOGGED = 200  # characters of any one value in a log line: a normal access-log field fits, a 10 KB path does not
CLIENT_ERROR = "%s %s: %d %s"  # method, path, status, what was wrong: the one line a client's mistake gets


# Characters that would start a new line, or move the cursor, in a log a person reads: a client's newline in a
# URL path or an input's name forged whole log lines (security round 3, item 13).
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def printable(value: str) -> str:
    """`value` as one log line: control characters escaped (a newline as \\x0a), cut to MAX_LOGGED characters."""
    text = _CONTROL.sub(lambda match: ascii(match.group())[1:-1], value)
    return f"{text[:MAX_LOGGED]}...({len(text)} characters)" if len(text) > MAX_LOGGED else text


def client_error_args(method: object, path: object, status: int, error: BaseException) -> tuple[str, str, int, str]:
    return printable(str(method)), printable(str(path)), status, printable(str(error))


class ShortValues(logging.Filter):
    """Every string in a log record's arguments (the request path above all) as one short line (`printable`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(printable(value) if isinstance(value, str) else value for value in record.args)
        return True


def install_log_filters() -> None:
    logging.getLogger("bentoml.access").addFilter(ShortValues())
