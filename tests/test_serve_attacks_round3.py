"""What a third attacker found (security round 3), each against a real `bentoml serve` with one worker: the figure
each test measures is printed with `pytest -s` and quoted in docs/security.md. A stall is bounded by the
deployment's own liveness probe timeout (deploy/kubernetes.yaml): a probe slower than that restarts the replica."""

from __future__ import annotations

import io
import json
import re
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
from conftest import Server, attack_memory_mb, digit_images, png_bytes, probe_timeout_s
from PIL import Image
from test_serve_attacks import KEY, authed, peak_growth_mb, raw_http

from harness.server import ScriptServer

pytestmark = pytest.mark.xdist_group("serve_attacks_round3")  # one server, on one worker

HEADER_TIMEOUT_S, IDLE_TIMEOUT_S, WRITE_TIMEOUT_S, MAX_CONNECTIONS = 2, 2, 3, 64


@pytest.fixture(scope="module")
def served(exported: Path, tmp_path_factory):
    srv = Server(
        tmp_path_factory.mktemp("attacks3") / "serve.log",
        HANDOFF_MODEL_DIR=str(exported),
        HANDOFF_API_KEYS=KEY,
        HANDOFF_MAX_CONNECTIONS=str(MAX_CONNECTIONS),
        HANDOFF_HEADER_TIMEOUT_S=str(HEADER_TIMEOUT_S),
        HANDOFF_IDLE_TIMEOUT_S=str(IDLE_TIMEOUT_S),
        HANDOFF_WRITE_TIMEOUT_S=str(WRITE_TIMEOUT_S),
    )
    srv.wait_ready()
    yield srv
    srv.stop()


def slowest_probe_during(served, attack) -> tuple[float, object]:
    """Run `attack()` in a thread and probe /livez until it ends: the slowest probe's seconds, and its result."""
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(attack)
        slowest = 0.0
        while not running.done():
            started = time.monotonic()
            assert served.status("/livez") == 200
            slowest = max(slowest, time.monotonic() - started)
            time.sleep(0.05)
        return slowest, running.result()


def post(served, path: str, body: bytes, content_type: str, **headers: str) -> httpx.Response:
    return httpx.post(
        f"{served.url}{path}", content=body, headers=authed(**{"content-type": content_type}, **headers), timeout=60
    )


def test_multipart_padding_never_holds_the_event_loop(served):
    """Item 1: 19 MB of padding after a delimiter, twice back to back (before: /livez held 8.0 s by one)."""
    boundary = "x" * 32
    body = f"--{boundary}".encode() + b" " * (19 * 1024 * 1024) + f"\r\n\r\n--{boundary}--\r\n".encode()

    def attack():
        return [post(served, "/classify", body, f"multipart/form-data; boundary={boundary}") for _ in range(2)]

    slowest, answers = slowest_probe_during(served, attack)
    print(f"\ntwo 19 MB padded forms: /livez slowest {slowest * 1000:.0f} ms, {[a.status_code for a in answers]}")
    for answer in answers:
        assert answer.status_code == 400 and "line break" in answer.json()["error"], answer.text
    assert slowest < probe_timeout_s()


def test_millions_of_bytes_elements_are_refused_by_their_shape(served):
    """Item 2: a protocol infer of 4,980,736 empty BYTES elements in 19 MB (before: the loop held 6.8 s)."""
    count = 4_980_736
    binary = b"\0\0\0\0" * count
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "image",
                    "datatype": "BYTES",
                    "shape": [count],
                    "parameters": {"binary_data_size": len(binary)},
                }
            ]
        }
    ).encode()

    def attack():
        started = time.monotonic()
        answer = post(
            served,
            "/v2/models/handoff/infer",
            header + binary,
            "application/octet-stream",
            **{"inference-header-content-length": str(len(header))},
        )
        return answer, time.monotonic() - started

    slowest, (answer, seconds) = slowest_probe_during(served, attack)
    print(f"\n{count} BYTES elements in {len(binary) / 1e6:.0f} MB: {answer.status_code} in {seconds * 1000:.0f} ms")
    assert answer.status_code == 400 and "rows; send 1 to 32" in answer.json()["error"], answer.text
    assert slowest < probe_timeout_s()


def stream_headers(port: int, first: bytes, chunk: bytes, seconds: float) -> tuple[int, bytes, float]:
    """Send `first`, then `chunk` over and over for up to `seconds` or until the server closes: the bytes it took,
    its answer and when it closed."""
    sent, answer = 0, b""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 65536)  # a small send buffer: "sent" is near "received"
        opened = time.monotonic()
        try:
            s.sendall(first)
            sent += len(first)
            while time.monotonic() - opened < seconds:
                s.sendall(chunk)
                sent += len(chunk)
        except OSError:
            pass
        try:
            s.settimeout(2)
            answer = s.recv(4096)
        except OSError:
            pass
        return sent, answer, time.monotonic() - opened


def test_headers_without_end_are_cut_off_by_size_and_by_time(served):
    """Item 3: a header streamed without end (before: 195 MB kept, the worker at 4.2 GB), a URL of megabytes, and
    headers that keep trickling in under the size cap, cut off HANDOFF_HEADER_TIMEOUT_S after their first byte
    (before: idle + header timeouts)."""

    def attack():
        endless = stream_headers(served.port, b"GET /livez HTTP/1.1\r\nHost: x\r\nX-A: ", b"a" * 65536, 8)
        long_url = stream_headers(served.port, b"GET /" + b"a" * 4 * 1024 * 1024, b"a", 0)
        return endless, long_url

    growth, ((sent, answer, seconds), (_, url_answer, _)) = peak_growth_mb(served.proc.pid, attack)
    print(f"\nendless header: {answer[:12]!r} after {sent / 1e6:.1f} MB sent, {seconds:.1f} s; peak +{growth:.0f} MB")
    assert answer.startswith(b"HTTP/1.1 431") and url_answer.startswith(b"HTTP/1.1 431"), (answer, url_answer)
    assert growth < attack_memory_mb(), f"the worker grew {growth:.0f} MB"

    with socket.create_connection(("127.0.0.1", served.port), timeout=10) as s:
        opened = time.monotonic()
        closed = False
        s.sendall(b"GET /livez HTTP/1.1\r\nHost: x\r\n")
        while not closed and time.monotonic() - opened < IDLE_TIMEOUT_S + HEADER_TIMEOUT_S + probe_timeout_s():
            try:
                s.sendall(b"X-Slow: a\r\n")  # 100 bytes a second: far under the size cap
                time.sleep(0.1)
            except OSError:
                closed = True
        took = time.monotonic() - opened
    print(f"headers trickling in: closed after {took:.1f} s (HANDOFF_HEADER_TIMEOUT_S={HEADER_TIMEOUT_S})")
    assert closed and took < HEADER_TIMEOUT_S + probe_timeout_s()


def test_headers_that_come_whole_in_one_read_are_counted_too(served):
    """Security round 5, item 6: a 100 KB header sent at once, on a fresh connection and as the second request of a
    kept-alive one, is 431 (before: 200; only past about 128 KB was it refused); 60 KB is answered."""

    def request(size: int) -> bytes:
        return b"GET /livez HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * size + b"\r\n\r\n"

    def answers(*requests: bytes) -> list[bytes]:
        """Each request's answer on one connection: its status line and headers, its body read to its length."""
        found = []
        with socket.create_connection(("127.0.0.1", served.port), timeout=10) as s:
            for sent in requests:
                s.sendall(sent)
                received = b""
                while b"\r\n\r\n" not in received and (chunk := s.recv(4096)):
                    received += chunk
                head, _, body = received.partition(b"\r\n\r\n")
                length = re.search(rb"content-length: *([0-9]+)", head, re.IGNORECASE)
                while length is not None and len(body) < int(length.group(1)) and (chunk := s.recv(4096)):
                    body += chunk
                found.append(head)
        return found

    assert answers(request(100 * 1024))[0].startswith(b"HTTP/1.1 431")
    small, big = answers(request(10), request(100 * 1024))
    assert small.startswith(b"HTTP/1.1 200") and big.startswith(b"HTTP/1.1 431"), (small[:20], big[:20])
    assert answers(request(60 * 1024))[0].startswith(b"HTTP/1.1 200")
    assert served.status("/livez") == 200


def closed_by_server(s: socket.socket, seconds: float) -> bool:
    """Read what the server sent until it closes (True) or `seconds` pass with the connection still open."""
    s.settimeout(seconds)
    try:
        while s.recv(1 << 20):
            pass
    except TimeoutError:
        return False
    except OSError:
        pass  # reset: the server aborted it
    return True


def tcp_closed(s: socket.socket) -> bool:
    """Whether the server has aborted the connection, without reading from it. Its reset may not be taken while
    this side's window is full, so one byte is sent: the server's kernel, which has no socket for it any more,
    answers with a reset this side takes. Then the kernel's TCP state says (Linux's TCP_INFO)."""
    try:
        s.send(b"\r\n")
        time.sleep(0.2)
    except OSError:
        return True
    return s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0] in (7, 8)  # TCP_CLOSE, TCP_CLOSE_WAIT


def test_a_client_that_pipelines_far_ahead_is_closed(served):
    """Item 12: uvicorn parses a whole read and queues every request in it (6 MB of them held 170-380 MB and
    delayed the probes 3.6 s). More than 16 sent ahead of their answers close the connection."""
    with socket.create_connection(("127.0.0.1", served.port), timeout=5) as s:
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" * 64)
        pipelined = closed_by_server(s, probe_timeout_s())
    assert pipelined and "pipelined requests" in served.log.read_text()
    assert served.status("/livez") == 200


def test_clients_that_never_read_their_answers_are_shed_and_timed_out(tmp_path: Path):
    """Item 4: a connection stuck writing an answer its client never reads was never shed or timed out (16 of them
    against a cap of 16 reset every /livez). uvicorn with handoff's bounds (tests/fixtures/guarded_uvicorn.py, whose
    64 MB answer outgrows loopback's buffers): as many such clients as the cap, and the probes are still answered
    (a stalled connection is shed first); each is aborted HANDOFF_WRITE_TIMEOUT_S after its write stalls."""
    cap, write_timeout_s = 8, 2
    script = Path(__file__).parent / "fixtures" / "guarded_uvicorn.py"
    with ScriptServer(tmp_path / "uvicorn.log", script, str(cap), str(write_timeout_s)) as srv:
        srv.wait_live(60)
        stuck = []
        for _ in range(cap):
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.connect(("127.0.0.1", srv.port))
            s.sendall(b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
            stuck.append(s)
        time.sleep(0.5)  # each answer fills the buffers between them and stalls
        answered = sum(srv.status("/livez") == 200 for _ in range(cap))
        deadline = time.monotonic() + write_timeout_s + probe_timeout_s()
        while not all(map(tcp_closed, stuck)) and time.monotonic() < deadline:
            time.sleep(0.1)
        closed = [tcp_closed(s) for s in stuck]  # looked at, not read: reading would let the write go on
        for s in stuck:
            s.close()
    log = srv.log.read_text()
    print(f"\n{cap} clients that never read a 64 MB answer, cap {cap}: /livez {answered} of {cap}, closed {closed}")
    assert answered == cap, log[-2000:]
    assert all(closed), "a connection stuck writing was left open past its write timeout"
    assert "read nothing for" in log or "at the connection limit" in log


def many_scans_jpeg(scans: int) -> bytes:
    """A 4000 x 4000 progressive JPEG whose smallest scan is repeated `scans` times before its end: each one a pass
    of the decoder over the whole image (10,000 of them: ~240 KB, ~3.5 s to decode on this machine)."""
    buffer = io.BytesIO()
    Image.new("RGB", (4000, 4000), (120, 130, 140)).save(buffer, "JPEG", progressive=True)
    data = buffer.getvalue()
    starts = [i for i in range(len(data) - 1) if data[i : i + 2] == b"\xff\xda"]
    ends = [*starts[1:], len(data) - 2]  # each scan runs to the next one; the last to the end-of-image marker
    start, end = min(zip(starts, ends), key=lambda span: span[1] - span[0])
    return data[:-2] + data[start:end] * scans + data[-2:]


def test_many_scan_jpegs_and_other_formats_are_refused_before_decoding(served):
    """Items 5 and 15: a progressive JPEG of 10,000 tiny scans (before: 19 s in a decoder, past the deadline) and an
    EPS file (before: every Pillow plugin tried, 13 s for 19 MB) are refused at once; a good image is served
    next."""
    attack = many_scans_jpeg(10_000)
    eps = b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 4000 4000\n" + b"0 0 moveto 1 1 lineto stroke\n" * 100_000
    started = time.monotonic()
    scans = post(served, "/classify", attack, "image/jpeg")
    scans_s = time.monotonic() - started
    other = httpx.post(f"{served.url}/classify", files={"image": ("a.eps", eps)}, headers=authed(), timeout=60)
    good = post(served, "/classify", png_bytes(digit_images(1)[0][0]), "image/png")
    print(f"\n{len(attack) / 1e3:.0f} KB JPEG of 10,010 scans: {scans.status_code} in {scans_s * 1000:.0f} ms")
    assert scans.status_code == 413 and "scans" in scans.json()["error"], scans.text
    assert other.status_code == 415 and "unsupported image format EPS" in other.json()["error"], other.text
    assert good.status_code == 200
    assert scans_s < probe_timeout_s()


def test_an_animated_webp_with_a_huge_canvas_is_refused_before_decoding(served):
    """Item 8: an animated WebP of a 6000 x 6000 canvas (a few hundred KB here; 136 bytes can claim it) cost
    +0.55-0.7 GB to decode its first frame. Now its canvas is held to HANDOFF_MAX_PIXELS / 8; a small one serves."""
    frames = [Image.new("RGB", (6000, 6000), color) for color in ("red", "blue")]
    buffer = io.BytesIO()
    frames[0].save(buffer, "WEBP", save_all=True, append_images=frames[1:], quality=1)
    small = io.BytesIO()
    frames[0].resize((64, 64)).save(small, "WEBP", save_all=True, append_images=[frames[1].resize((64, 64))])
    del frames

    def attack():
        return post(served, "/classify", buffer.getvalue(), "image/webp")

    growth, answer = peak_growth_mb(served.proc.pid, attack)
    print(
        f"\n{len(buffer.getvalue()) / 1e3:.0f} KB animated WebP of 6000 x 6000: {answer.status_code}, +{growth:.0f} MB"
    )
    assert answer.status_code == 413 and "animated image" in answer.json()["error"], answer.text
    assert growth < attack_memory_mb()
    assert post(served, "/classify", small.getvalue(), "image/webp").status_code == 200


def test_newlines_in_paths_and_input_names_forge_no_log_lines(served):
    """Item 13: a newline in a URL path (no key needed) or in a protocol input's name reached the log as a new line,
    so a client could write lines of its own. Now each is escaped, in the access line and the client-error line."""
    forged = "2026-01-01T00:00:00+0000 [ERROR] [entry_service:handoff:1] forged: the model was replaced"
    answer = raw_http(
        served.port, f"GET /nothing%0a{quote(forged)} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode()
    )
    document = {"inputs": [{"name": f"x\n{forged}", "datatype": "FP32", "shape": [1], "data": [1.0]}]}
    infer = post(served, "/v2/models/handoff/infer", json.dumps(document).encode(), "application/json")
    assert answer.startswith(b"HTTP/1.1 401") and infer.status_code == 400, (answer[:100], infer.text)
    time.sleep(0.5)  # the access log is written off the loop
    lines = served.log.read_text().splitlines()
    assert not [line for line in lines if line.startswith(forged)], "a client wrote a line of its own into the log"
    assert sum("\\n" + forged in line for line in lines) >= 2, "the escaped lines are missing"


def test_websocket_upgrades_are_refused(served):
    """Low: a WebSocket upgrade passed the key gate (its scope is not HTTP) and leaked an entry of the connection
    table. handoff has no WebSocket route: every upgrade, with a key or without, is refused by the front door (the
    leak's fix, in serve/http/connections.py, is not observable from outside and is not asserted here)."""
    upgrade = (
        "GET /info HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n{}\r\n"
    )
    for key in ("", f"Authorization: Bearer {KEY}\r\n"):
        answer = raw_http(served.port, upgrade.format(key).encode(), timeout=5)
        assert answer.split(b" ")[1] in (b"403", b"401") and b"101" not in answer.split(b"\r\n")[0], answer[:200]


def test_the_guarded_service_still_serves_with_its_key(served):
    """After every attack above: the probes, and a good request with its key (and one without: 401)."""
    image = png_bytes(digit_images(1)[0][0])
    assert served.status("/livez") == 200 and served.status("/readyz") == 200
    assert post(served, "/classify", image, "image/png").status_code == 200
    keyless = httpx.post(f"{served.url}/classify", content=image, headers={"content-type": "image/png"})
    assert keyless.status_code == 401
