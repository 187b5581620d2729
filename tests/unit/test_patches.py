"""serve/patches.py, the two last resorts: the self-check that keeps the service not ready when a replacement did
not take, and the upstream defects each one works around. The last two tests fail when upstream fixes the defect:
the patch can then go (docs/serve.md, "Where handoff patches its dependencies").

Each runs in a fresh interpreter: the patches change modules for the whole process, and other tests import
BentoML's own classes."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run(code: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_self_check_names_each_replacement_until_it_has_taken_effect():
    found = run(
        """
        import asyncio, json, socket
        import uvicorn
        from uvicorn.server import ServerState
        from serve import patches
        from serve.http.connections import ConnectionLimits

        before = patches.not_in_effect()
        patches.install(ConnectionLimits(8, 5.0, 5.0, 5.0))
        from bentoml._internal.server.http import traffic
        traffic.TimeoutMiddleware(None, timeout=1.0)  # as BentoML builds its app: the deadline is built instead
        after_build = patches.not_in_effect()
        config = uvicorn.Config(app=None)
        config.load()
        protocol = config.http_protocol_class

        async def one_connection():  # uvicorn's protocol class, as its server makes it, serving one connection
            loop = asyncio.get_running_loop()
            state = ServerState()
            server = await loop.create_server(lambda: protocol(config, state, {}), "127.0.0.1", 0)
            port = server.sockets[0].getsockname()[1]
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            await asyncio.sleep(0.2)
            writer.close()
            server.close()

        asyncio.run(one_connection())
        print(json.dumps({"before": before, "after_build": after_build, "served": patches.not_in_effect(),
                          "protocol": protocol.__name__}))
        """
    )
    assert "request deadline" in found["before"] and "connection bounds" in found["before"]
    assert "request deadline" not in found["after_build"] and "connection bounds" in found["after_build"]
    assert found["served"] is None and found["protocol"].startswith("Guarded")


def test_upstream_bentomls_timeout_middleware_still_leaves_a_timer_per_answered_request():
    """The defect behind replacing it: every request answered at once still leaves its timer armed for the whole
    timeout. Fails when BentoML cancels the timer: then drop the replacement."""
    found = run(
        """
        import asyncio, json
        from bentoml._internal.server.http.traffic import TimeoutMiddleware

        async def app(scope, receive, send):
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b""})

        async def main():
            async def send(message):
                pass
            middleware = TimeoutMiddleware(app, timeout=60.0)
            for _ in range(100):
                await middleware({"type": "http"}, None, send)
            return len(asyncio.get_running_loop()._scheduled)

        print(json.dumps({"armed": asyncio.run(main())}))
        """
    )
    assert found["armed"] >= 100


def test_upstream_bentomls_worker_still_gives_uvicorn_no_protocol_class():
    """The defect behind guarding uvicorn's default protocol: BentoML's worker builds uvicorn.Config with no `http`
    and takes no option for one. Fails when it does: then pass the guarded class there instead."""
    found = run(
        """
        import inspect, json
        from _bentoml_impl.worker import service

        source = inspect.getsource(service.main.callback)
        options = [p.name for p in service.main.params]
        print(json.dumps({"http_passed": "http=" in source, "options": options}))
        """
    )
    assert not found["http_passed"] and not any(o in ("http", "http_protocol") for o in found["options"])
