"""Run `bentoml serve` as a child process on a free localhost port, and wait for it to be ready.

Used by `make demo`, the tests and the benchmarks, so all three start the service the same way a user does.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class BentoServer:
    own_home: str | None = None  # the BENTOML_HOME made for this server, removed when it stops

    def __init__(
        self,
        log: Path,
        target: str | None = None,
        cwd: Path = ROOT,
        bentoml: Path | None = None,
        python: str = sys.executable,
        **env: str,
    ) -> None:
        """`target` is what `bentoml serve` serves (default: the bentofile in `cwd`); `bentoml` the executable
        (default: `python -m bentoml` of `python`, this interpreter unless named, which also works where bentoml
        was installed with `pip --target` and has no script beside the interpreter); `env` adds variables."""
        launcher = [str(bentoml)] if bentoml else [python, "-m", "bentoml"]
        serve = [*launcher, "serve", *([target] if target else []), "--host", "127.0.0.1", "--port"]
        # `bentoml serve` empties $BENTOML_HOME/prometheus_multiproc_dir as it starts, where every worker keeps
        # its /metrics values: a server started beside another (parallel tests) wiped the other's counts. So each
        # gets a home of its own, unless the caller names one (a Bento built there).
        self.own_home = None if "BENTOML_HOME" in env else tempfile.mkdtemp(prefix="bentoml-home-")
        if self.own_home is not None:
            env = {**env, "BENTOML_HOME": self.own_home}
        self._start(log, serve, cwd, env)

    def _start(self, log: Path, command: list[str], cwd: Path, env: dict[str, str]) -> None:
        """Runs `command` with a free port as its last argument, in a session of its own (stop() ends it all)."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            [*command, str(self.port)],
            cwd=cwd,
            # BentoML posts usage statistics to its servers unless told not to: a local run sends nothing out.
            env={"BENTOML_DO_NOT_TRACK": "true", **os.environ, **env},
            stdout=open(log, "w"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def status(self, path: str) -> int | None:
        try:
            return httpx.get(self.url + path, timeout=5).status_code
        except httpx.HTTPError:
            return None

    def _wait(self, path: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self.status(path) != 200:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"bentoml serve exited ({self.proc.returncode}); log: {self.log}\n" + self.log.read_text()[-3000:]
                )
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.url}{path} not 200 after {timeout}s; log: {self.log}")
            time.sleep(0.1)

    ready_path = "/readyz"
    """what answers 200 once the server is ready (BentoML's probe; a peer speaking the protocol: its own)"""

    def wait_ready(self, timeout: float = 180) -> float:
        """Seconds from launch to `ready_path` 200."""
        self._wait(self.ready_path, timeout)
        return time.monotonic() - self.started

    def wait_live(self, timeout: float = 180) -> None:
        self._wait("/livez", timeout)

    def stop(self) -> None:
        """Stops the server and every process it started (its session's group), and waits until all are gone:
        a worker still exiting would take CPU from whatever is measured next."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        started = time.monotonic()
        while _group_alive(self.proc.pid) and time.monotonic() - started < 15:  # (an unreaped zombie stays)
            if time.monotonic() - started > 10:
                os.killpg(self.proc.pid, signal.SIGKILL)
            time.sleep(0.05)
        if self.own_home is not None:  # made by __init__ for this server alone
            shutil.rmtree(self.own_home, ignore_errors=True)

    def __enter__(self) -> BentoServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


class ScriptServer(BentoServer):
    """A Python script that serves HTTP on the port given as its last argument (the benchmarks' peers that are
    not BentoML services), started and stopped like a BentoML server."""

    def __init__(self, log: Path, script: Path, *args: str, **env: str) -> None:
        self._start(log, [sys.executable, str(script), *args], ROOT, env)
