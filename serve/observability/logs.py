"""What the service's log says about clients: one INFO line per client error (`CLIENT_ERROR`, written by the
handlers), a refusal for load (a 503 or 429 with Retry-After) summarized (`Repeats`), and no value longer than a
line or breaking one.

The access log prints the raw request path: a scanner's 10 KB paths would fill the log, and a newline in one
would forge a line. (The access log's line itself: serve/observability/access_log.py.)
"""

from __future__ import annotations

import logging
import re
import time

MAX_KINDS = 64
REPEATS_EVERY_S = 5.0  # a refusal for load is logged at most once this often, with how many came meanwhile
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


class Repeats:
    """Lines that come by the thousand under load (an overloaded model refusing clients that send again at once:
    234,000 in a minute): the first of a kind logged, then at most one every REPEATS_EVERY_S, saying how many
    came since. The kinds are few (the refusals' own messages), so the table stays small."""

    def __init__(self, logger: logging.Logger) -> None:
        self.logger = logger
        self.logged_at: dict[str, float] = {}
        self.since: dict[str, int] = {}

    def log(self, level: int, kind: str, line: str, *args: object) -> None:
        now = time.monotonic()
        if len(self.logged_at) > MAX_KINDS and kind not in self.logged_at:  # never grown by what a client sends
            self.logged_at.clear()
            self.since.clear()
        if now - self.logged_at.get(kind, -REPEATS_EVERY_S) < REPEATS_EVERY_S:
            self.since[kind] = self.since.get(kind, 0) + 1
            return
        self.logged_at[kind] = now
        more = self.since.pop(kind, 0)
        if more:
            self.logger.log(level, line + " (and %d more like it since the last such line)", *args, more)
        else:
            self.logger.log(level, line, *args)


class ShortValues(logging.Filter):
    """Every string in a log record's arguments (the request path above all) as one short line (`printable`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(printable(value) if isinstance(value, str) else value for value in record.args)
        return True


def install_log_filters() -> None:
    logging.getLogger("bentoml.access").addFilter(ShortValues())
