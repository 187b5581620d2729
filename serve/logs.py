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
# URL path or an input's name forged whole log lines (security round 3, item 13); and the bidirectional controls,
# which reorder what a person reads (U+202E shows `gnp.exe` as `exe.png`; security round 4, item 11).
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def printable(value: str) -> str:
    """`value` as one log line: cut to MAX_LOGGED characters, then its control characters escaped (a newline as
    \\x0a). Cut first: escaping a whole 10 KB path of controls cost more than serving it (round 4, item 10)."""
    cut = value[:MAX_LOGGED]
    text = _CONTROL.sub(lambda match: ascii(match.group())[1:-1], cut)
    return f"{text}...({len(value)} characters)" if len(value) > MAX_LOGGED else text


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
