"""How soon a refusal for load (a 503 or 429 with Retry-After) is sent: at once, unless refusals are coming faster
than REFUSALS_AT_ONCE_PER_S; then each one waits REFUSAL_PAUSE_S first (never longer than its own Retry-After).

Why: a client that sends again as soon as it is refused, instead of waiting as Retry-After says, turns every
refusal into another request. Refusals are cheap, but not free (the request's head, its body read, the JSON
answer: a fraction of a millisecond on the event loop), and a closed loop of such clients spends on them all the
CPU the model leaves: 64 of them against a Mask R-CNN on two cores sent 294,000 requests in a minute and the model
served 0.55 x what it serves alone (docs/benchmarks.md). With the pause, the same 64 clients can send at most
64 / REFUSAL_PAUSE_S refusals a second, whatever they do.

The first refusals of an overload go at once (a load balancer moves on to another replica without waiting); only a
flood is paced. A paused refusal costs a sleeping coroutine and the connection its client already holds; when the
refusal comes from a handler, its processing slot (and the request's body) stays held during the pause, so
HANDOFF_MAX_CONCURRENCY bounds how many wait at once; one refused before any handler (no slot free) lets go of its
body first (serve/http/router.py), and HANDOFF_MAX_CONNECTIONS bounds how many of those wait. A connection whose refusal
waits is sheddable at that cap as an idle one is (serve/http/connections.py): a flood of paced refusals once held every
connection of the cap, and no fresh one, a health probe's included, got in (security round 5).
"""

from __future__ import annotations

import asyncio
import time

REFUSALS_AT_ONCE_PER_S = 50  # refusals a second sent at once; beyond that, each waits
REFUSAL_PAUSE_S = 0.5
PACED = "handoff.paced"  # set in a request's ASGI scope while its refusal waits: its connection may be shed


class RefusalPace:
    """Counts refusals in one-second windows and says how long the next one waits before it is sent."""

    def __init__(self, at_once_per_s: int = REFUSALS_AT_ONCE_PER_S, pause_s: float = REFUSAL_PAUSE_S) -> None:
        self.at_once_per_s = at_once_per_s
        self.pause_s = pause_s
        self.window_started = -1.0
        self.in_window = 0

    def pause_for(self, retry_after_s: float) -> float:
        """The pause before a refusal that says Retry-After: `retry_after_s` is sent (0: send it now)."""
        now = time.monotonic()
        if now - self.window_started >= 1.0:
            self.window_started, self.in_window = now, 0
        self.in_window += 1
        return 0.0 if self.in_window <= self.at_once_per_s else min(self.pause_s, retry_after_s)

    async def wait(self, retry_after_s: float) -> None:
        """Wait as `pause_for` says before a refusal that says Retry-After: `retry_after_s` is sent."""
        if (pause := self.pause_for(retry_after_s)) > 0:
            await asyncio.sleep(pause)
