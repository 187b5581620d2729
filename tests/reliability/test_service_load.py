"""The service under fuzzing, sustained mixed load and overload, each promise printed as a number.

- schemathesis generates requests from the service's own OpenAPI document: 0 server errors;
- a soak at concurrency 32 mixing good and bad requests: 0 failed good requests, resident memory growth
  after warm-up under a fortieth of what the deployment requests for a replica (conftest.attack_memory_mb),
  p99 latency printed (1,000 requests in `make test`, 10,000 in `make soak`), with
  the default request timeout (BentoML's own timeout middleware kept each request's context until the timeout
  had passed, so this soak once set 10 s; serve/http/deadline.py frees it when the request ends);
- more concurrency than HANDOFF_MAX_CONCURRENCY: 429 at once, never a timeout, and the service recovers;
- a kept-alive connection outlasts uvicorn's own 5 s (HANDOFF_KEEP_ALIVE_S), so that clients close idle
  connections first; a request sent just as the server's keep-alive timeout runs out is answered, or the
  client sees the connection closed before it sends: never a reset (serve/http/connections.py).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import select
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import psutil
import pytest
from conftest import Server, attack_memory_mb, digit_images, eager_top1, png_bytes, probe_timeout_s

pytestmark = pytest.mark.xdist_group("service_load")  # its module fixtures stay on one worker

CONCURRENCY = 32
SOAK_REQUESTS = int(os.environ.get("HANDOFF_SOAK_REQUESTS", "10000"))


@pytest.fixture(scope="module")
def server(exported: Path, tmp_path_factory):
    with Server(
        tmp_path_factory.mktemp("load") / "serve.log",
        HANDOFF_MODEL_DIR=str(exported),
    ) as srv:
        srv.wait_ready()
        yield srv


def test_schemathesis_finds_no_server_error(server, tmp_path: Path):
    schemathesis = Path(sys.executable).parent / "schemathesis"
    result = subprocess.run(
        [
            str(schemathesis),
            "run",
            f"{server.url}/docs.json",
            "--checks",
            "not_a_server_error",
            "--max-examples",
            "100",  # per operation (28): CI's time; a fixed seed, so every run tries the same requests
            "--seed",
            "1",
            "--workers",
            "1",
            "--no-color",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,  # its example database and reports, out of the working tree
    )
    summary = re.search(r"(\d+) generated, .*", result.stdout)
    print(f"\nschemathesis against /docs.json: {summary.group(0) if summary else result.stdout[-500:]}")
    assert result.returncode == 0, result.stdout[-4000:]
    assert summary and int(summary.group(1)) > 100
    assert server.status("/readyz") == 200


def server_rss_mb(srv: Server) -> float:
    """Resident memory of `bentoml serve` and every process under it."""
    root = psutil.Process(srv.proc.pid)
    return sum(p.memory_info().rss for p in [root, *root.children(recursive=True)]) / 2**20


def request_mix(eager) -> list[tuple[str, dict, int, int | None]]:
    """(path, httpx arguments, expected status, expected top-1 or None): 7 good in 10, 3 bad."""
    images, _ = digit_images(20)
    expected = eager_top1(eager, images)
    _, transform = eager
    tensor = transform(images[0]).unsqueeze(0).numpy()
    nan = np.full_like(tensor, np.nan)
    jpeg = png_bytes(images[1], "JPEG", quality=95)
    mix = [
        ("/classify", {"files": {"image": ("d.png", png_bytes(img))}}, 200, top1) for img, top1 in zip(images, expected)
    ]
    mix += [("/predict", {"json": {"tensor": tensor.tolist()}}, 200, expected[0])] * 8
    bad = [
        ("/classify", {"files": {"image": ("x.jpg", b"not an image at all")}}, 400, None),
        ("/classify", {"files": {"image": ("cut.jpg", jpeg[: len(jpeg) // 2])}}, 400, None),
        ("/classify", {"files": {"file": ("d.png", png_bytes(images[0]))}}, 400, None),
        ("/classify", {"content": b"hello", "headers": {"content-type": "text/plain"}}, 415, None),
        (
            "/predict",
            {"content": json.dumps({"tensor": nan.tolist()}), "headers": {"content-type": "application/json"}},
            400,
            None,
        ),
        ("/predict", {"json": {"tensor": [[1.0, 2.0]]}}, 400, None),
    ]
    return mix + bad * 2  # 28 good, 12 bad


async def soak(url: str, mix: list, total: int, warm_at: int, on_warm) -> tuple[list[str], list[float]]:
    """Send `total` requests drawn round-robin from `mix`, CONCURRENCY at a time; call `on_warm` at `warm_at`."""
    failures, latencies, next_index = [], [], iter(range(total))

    async def worker(client: httpx.AsyncClient) -> None:
        for i in next_index:
            path, kwargs, status, top1 = mix[i % len(mix)]
            started = time.perf_counter()
            try:
                response = await client.post(url + path, **kwargs)
            except httpx.HTTPError as err:
                failures.append(f"{path}: {type(err).__name__}")
                continue
            if top1 is not None:
                latencies.append(time.perf_counter() - started)
                body = response.json() if response.status_code == 200 else {}
                got = (
                    body["predictions"][0]["index"]
                    if "predictions" in body
                    else int(np.argmax(body.get("logits", [[-1]])[0]))
                )
                if response.status_code != 200 or got != top1:
                    failures.append(f"{path}: {response.status_code} top-1 {got} != {top1}: {response.text[:200]}")
            elif response.status_code != status:
                failures.append(f"bad {path}: {response.status_code} != {status}: {response.text[:200]}")
            if i == warm_at:
                on_warm()

    limits = httpx.Limits(max_connections=CONCURRENCY)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:
        await asyncio.gather(*(worker(client) for _ in range(CONCURRENCY)))
    return failures, latencies


def run_soak(server: Server, eager, total: int, warm_at: int) -> None:
    warm: list[float] = []
    started = time.monotonic()
    failures, latencies = asyncio.run(
        soak(server.url, request_mix(eager), total, warm_at, on_warm=lambda: warm.append(server_rss_mb(server)))
    )
    seconds = time.monotonic() - started
    growth = server_rss_mb(server) - warm[0]
    p50, p99 = np.percentile(latencies, [50, 99]) * 1000
    print(
        f"\nsoak: {total} requests at concurrency {CONCURRENCY} in {seconds:.0f} s ({total / seconds:.0f}/s), "
        f"{len(latencies)} good: {len(failures)} failures; p50 {p50:.0f} ms, p99 {p99:.0f} ms; "
        f"server memory {warm[0]:.0f} MB after {warm_at} requests, then {growth:+.1f} MB over the last "
        f"{total - warm_at} ({growth * 2**20 / (total - warm_at):.0f} bytes per request)"
    )
    assert not failures, failures[:10]
    assert growth < attack_memory_mb(), "the worker's memory grows with the requests it served"
    assert server.status("/readyz") == 200


def test_mixed_load_short(server, eager):
    run_soak(server, eager, 1000, warm_at=100)


@pytest.mark.soak
def test_soak(server, eager):
    # Warm once the timeout window is full (half the run: ~18 s here), so what grows after it is a leak.
    run_soak(server, eager, SOAK_REQUESTS, warm_at=SOAK_REQUESTS // 2)


def test_overload_is_refused_quickly_and_the_service_recovers(exported: Path, eager, tmp_path: Path):
    images, _ = digit_images(4)
    expected = eager_top1(eager, images)
    limit, burst = 4, 64
    with Server(tmp_path / "serve.log", HANDOFF_MODEL_DIR=str(exported), HANDOFF_MAX_CONCURRENCY=str(limit)) as srv:
        srv.wait_ready()

        async def one(client: httpx.AsyncClient, i: int) -> tuple[int, float]:
            started = time.perf_counter()
            response = await client.post(f"{srv.url}/classify", files={"image": ("d.png", png_bytes(images[i % 4]))})
            return response.status_code, time.perf_counter() - started

        async def burst_of(n: int) -> list[tuple[int, float]]:
            async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=n)) as client:
                return await asyncio.gather(*(one(client, i) for i in range(n)))

        results = asyncio.run(burst_of(burst))
        statuses = [s for s, _ in results]
        refused = [t for s, t in results if s == 429]
        print(
            f"\noverload: {burst} at once against a limit of {limit}: {statuses.count(200)} answered, "
            f"{len(refused)} refused with 429 (slowest refusal {max(refused, default=0) * 1000:.0f} ms)"
        )
        assert set(statuses) <= {200, 429}, statuses
        assert refused, "a burst 16x the limit must be refused in part"
        assert max(refused) < probe_timeout_s(), "refusals are immediate, not timeouts"
        # Recovered: the same service answers every request in turn, correctly.
        for i, image in enumerate(images):
            response = httpx.post(f"{srv.url}/classify", files={"image": ("d.png", png_bytes(image))}, timeout=30)
            assert response.status_code == 200 and response.json()["predictions"][0]["index"] == expected[i]
        assert srv.status("/readyz") == 200


UVICORN_KEEP_ALIVE_S = 5.0  # what BentoML's server would close an idle connection after, left alone
KEEP_ALIVE_S = 3  # the deadline test's own server: short, to wait less


def _raw_request(image: bytes) -> bytes:
    request = httpx.Request("POST", "http://x/classify", files={"image": ("d.png", image)})
    body = request.read()
    head = f"POST /classify HTTP/1.1\r\nHost: x\r\nContent-Type: {request.headers['content-type']}\r\n"
    return f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body


async def _exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, raw: bytes) -> bytes:
    """Send one request and read its whole response; returns the status code."""
    writer.write(raw)
    head = await reader.readuntil(b"\r\n\r\n")
    length = re.search(rb"content-length: (\d+)", head, re.IGNORECASE)
    await reader.readexactly(int(length.group(1)) if length else 0)
    return head.split(b" ", 2)[1]


def test_an_idle_connection_outlasts_uvicorns_keep_alive(server):
    """The default keep-alive is longer than the clients' own idle timeouts (httpx drops a connection idle
    for 5 s, the soak's client among them): left at uvicorn's 5 s, the server closed ~19 of the soak's 32
    connections in each run of 1,000 requests, racing the client's next request on them."""
    raw = _raw_request(png_bytes(digit_images(1)[0][0]))

    async def twice() -> tuple[bytes, bool, bytes]:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        try:
            first = await _exchange(reader, writer, raw)
            await asyncio.sleep(UVICORN_KEEP_ALIVE_S + 1)
            return first, _closed_by_peer(writer), await _exchange(reader, writer, raw)
        finally:
            writer.close()

    first, closed, second = asyncio.run(twice())
    assert (first, closed, second) == (b"200", False, b"200")


def test_requests_at_the_keep_alive_deadline_are_not_reset_by_a_late_close(exported: Path, tmp_path: Path):
    """300 connections each send a request, wait until about the keep-alive deadline and send another, while
    other clients keep the event loop busy. A client (httpx, a browser) checks a pooled connection for the
    server's end-of-stream before reusing it, as this one does; what it cannot survive is a reset for a request
    sent on a connection that looked open. Before serve/http/connections.py closed idle connections carefully, ~1
    in 40 of these was reset."""
    image = png_bytes(digit_images(1)[0][0])
    raw = _raw_request(image)

    async def probe(port: int, wait: float) -> str:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            await _exchange(reader, writer, raw)
            await asyncio.sleep(wait)
            if _closed_by_peer(writer):
                return "closed, seen before sending"
            return f"answered {(await _exchange(reader, writer, raw)).decode()}"
        except (ConnectionResetError, asyncio.IncompleteReadError) as err:
            return type(err).__name__
        finally:
            writer.close()

    async def run(srv: Server) -> list[str]:
        busy = asyncio.Event()

        async def keep_busy(client: httpx.AsyncClient) -> None:
            while not busy.is_set():
                await client.post(f"{srv.url}/classify", files={"image": ("d.png", image)})

        async with httpx.AsyncClient(timeout=60) as client:
            loaders = [asyncio.create_task(keep_busy(client)) for _ in range(16)]
            rng = np.random.default_rng(0)
            # from well before the deadline to just past it: a loaded machine delays the first answer's arrival,
            # which moves the whole spread against the server's timer (20 of 300 answered in a CI run with -0.15)
            waits = KEEP_ALIVE_S + rng.uniform(-0.4, 0.05, 300)
            outcomes = await asyncio.gather(*(probe(srv.port, wait) for wait in waits))
            busy.set()
            await asyncio.gather(*loaders)
        return outcomes

    with Server(tmp_path / "serve.log", HANDOFF_MODEL_DIR=str(exported), HANDOFF_KEEP_ALIVE_S=str(KEEP_ALIVE_S)) as srv:
        srv.wait_ready()
        outcomes = asyncio.run(run(srv))
    counts = {outcome: outcomes.count(outcome) for outcome in sorted(set(outcomes))}
    print(f"\n300 requests sent around the {KEEP_ALIVE_S:g} s keep-alive deadline under load: {counts}")
    # A request sent in the microseconds between the server's last look and its end-of-stream cannot be saved by
    # any server (RFC 9112 9.3.1: a client retries it); what serve/http/connections.py promises is that this window is
    # microseconds, not the event loop's turn (~1 in 40 of these was reset before: 7 or 8 of 300).
    kept = {"answered 200", "closed, seen before sending"}
    assert sum(n for outcome, n in counts.items() if outcome not in kept) <= 2, counts
    # Both sides of the deadline were probed (how many land on each moves with the machine's load).
    assert counts.get("answered 200", 0) > 0, "some were sent while the connection was kept"
    assert counts.get("closed, seen before sending", 0) > 0, "HANDOFF_KEEP_ALIVE_S reached uvicorn"


def _closed_by_peer(writer: asyncio.StreamWriter) -> bool:
    """What an HTTP client's pool asks before it reuses a connection (httpcore: is the socket readable?). The
    server sends nothing unasked, so readable means its end-of-stream has arrived."""
    readable, _, _ = select.select([writer.get_extra_info("socket").fileno()], [], [], 0)
    return bool(readable)
