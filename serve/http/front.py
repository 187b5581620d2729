"""handoff's middlewares called by uvicorn directly, in front of BentoML's app rather than inside it.

handoff's router (serve/http/router.py) answers every handoff route itself; BentoML's app only answers its own probes.
Inside BentoML's app, each request first went through the layers it wraps every request in: Starlette's error
middleware and application, OpenTelemetry's middleware (which builds each request's URL to test it against the
exclusion that serve/observability/tracing.py configures, even with tracing off) and BentoML's timeout. Those layers
answer nothing for a handoff route; they only cost. So uvicorn's protocol, which handoff subclasses already
(serve/http/connections.py), calls handoff's middlewares itself, with BentoML's whole app as the router's inner app
for the requests it does not answer (BentoML's probes). uvicorn's own wrappers (the proxy headers, the message
log) stay outermost, as uvicorn put them.

Where the user's BentoML configuration traces, the spans are BentoML's: the service then adds the same
middlewares to BentoML's app instead (serve/service.py), and this front is not used.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

UVICORN_WRAPPERS = "uvicorn.middleware."  # the module of each wrapper uvicorn puts around the app it is given


@dataclass
class Front:
    middlewares: list[tuple[type, dict[str, Any]]]
    """outermost first, each built as BentoML builds a middleware: `cls(app, **options)`"""
    _built: tuple[Any, Any] | None = field(default=None, repr=False)

    def stack(self, app: Any) -> Any:
        """The middlewares around `app`."""
        for cls, options in reversed(self.middlewares):
            app = cls(app, **options)
        return app

    def around(self, loaded: Any) -> Any:
        """The app a connection calls, given uvicorn's (`config.loaded_app`): the middlewares between uvicorn's
        wrappers and the service's app. Built once per process, on its first connection."""
        if self._built is None or self._built[0] is not loaded:
            self._built = (loaded, self._between(loaded))
        return self._built[1]

    def _between(self, app: Any) -> Any:
        if type(app).__module__.startswith(UVICORN_WRAPPERS):
            wrapper = copy.copy(app)  # the same settings (the trusted proxies), around the front
            wrapper.app = self._between(app.app)
            return wrapper
        return self.stack(app)
