"""Load for the serving benchmarks: one image per request at a fixed concurrency, and the CPU it cost.

Each image goes as one of the `FORMS` (`uploads`): a multipart form to `/classify` (field `image`, as a browser
or `curl -F` sends it), the JPEG itself as the body (`Content-Type: image/jpeg`), or the Open Inference
Protocol's binary infer, as tritonclient sends it (no Content-Type; `Inference-Header-Content-Length`),
carrying the JPEG as a BYTES `image` or the already preprocessed FP32 `input`.

Two clients, both closed loops (each of `concurrency` connections sends its next request when the last one
is answered):
- wrk (Debian's `wrk` package, C): the default where it is installed; it costs the shared cores far less
  than a Python client, so the served figures are less about the client;
- httpx (one asyncio process): the fallback, and what a Python user would reach for. It cannot load a fast service
  at high concurrency: against `GET /livez` here it gave 1,138 requests/s at c=4 and 111 at c=64, where wrk gave
  2,848 at c=64 (2-core AMD EPYC, 2026-12-04); a figure at c=64 taken with httpx measures the client.
Both send a refused request's next one at once, unless told to wait as its Retry-After says (`retry_after`, as
HTTP asks of a client: a closed loop that does not wait spends the server's CPU on requests refused again).
Either way the result carries the client's own CPU time per image and its share of the machine, and the
server's CPU time per image (its whole process tree: the arbiter and every worker; read after the ramp and
just before the end, SteadyServerCpu), so the overhead per request can be read independently of who else
shares the cores; the server's also by process and thread (`thread_cpu_seconds`: an event loop's share apart from
a model's threads).

Throughput is the steady rate: the least-squares slope of answers against time, after the first RAMP_S seconds.
Answers counted over the whole window and divided by its length (kept as `images_per_s_whole_window`) are
off twice for a batching server: its answers come in waves, a batch at a time (32 every 0.6-0.7 s at c=64 here),
so where the window's end falls in that cycle moves the count by up to a batch (simulated: 3.6% standard
deviation over 8 s, against 0.1% for the slope); and the window starts with nothing in flight, so the first
wave comes only after the pipeline has filled.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import psutil

BOUNDARY = "handoff-bench-boundary"
MULTIPART_TYPE = f"multipart/form-data; boundary={BOUNDARY}"
CPUS = os.cpu_count() or 1

# wrk's Lua side: one prebuilt multipart body per JPEG, sent in turn; done() prints the figures as JSON.
WRK_SCRIPT = """
local ffi = require("ffi")  -- wrk runs LuaJIT: clock_gettime gives each answer a CLOCK_MONOTONIC time
ffi.cdef[[
typedef struct { long tv_sec; long tv_nsec; } handoff_timespec;
int clock_gettime(int clock, handoff_timespec *now);
]]
local clock = ffi.new("handoff_timespec")
local function now()
  ffi.C.clock_gettime(1, clock)
  return tonumber(clock.tv_sec) + tonumber(clock.tv_nsec) * 1e-9
end
local threads = {}
setup = function(thread) table.insert(threads, thread) end
init = function(args) started = now() end
answers = {}
response = function(status, headers, body)
  if status == 200 then answers[#answers + 1] = now() end
end
local bodies, next_body = {}, 0
local folder, count = "%(folder)s", %(count)d
local headers = {%(headers)s}
for i = 0, count - 1 do
  local f = assert(io.open(string.format("%%s/%%03d.body", folder, i), "rb"))
  bodies[i] = f:read("*all")
  f:close()
end
request = function()
  next_body = (next_body + 1) %% count
  local fresh = {}  -- wrk.format adds Host and Content-Length to the table it is given
  for name, value in pairs(headers[next_body]) do fresh[name] = value end
  return wrk.format("POST", "%(path)s", fresh, bodies[next_body])
end
done = function(summary, latency, requests)
  local e = summary.errors
  local stamps = {}
  for _, t in ipairs(threads[1]:get("answers")) do stamps[#stamps + 1] = string.format("%%.6f", t) end
  io.write(string.format(
    '\\nRESULT {"requests": %%d, "duration_us": %%d, "p50_us": %%d, "p99_us": %%d, "errors": %%d, "refused": %%d, '
    .. '"started": %%.6f, "answers": [%%s]}\\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    e.connect + e.read + e.write + e.status + e.timeout, e.status, threads[1]:get("started"),
    table.concat(stamps, ",")))
end
"""


# Added where the clients honour Retry-After: each refusal that carries one makes a connection wait it out before
# its next request (wrk's `delay` is asked before every request; which connection waits is whichever asks next).
WRK_RETRY_AFTER = """
local owed = {}
local count_answer = response
response = function(status, headers, body)
  count_answer(status, headers, body)
  local after = headers["retry-after"] or headers["Retry-After"]
  if status ~= 200 and after then owed[#owed + 1] = tonumber(after) * 1000 end
end
delay = function()
  if #owed > 0 then return table.remove(owed, 1) end
  return 0
end
"""


def multipart_body(jpeg: bytes) -> bytes:
    """The body a browser or `curl -F image=@photo.jpg` sends for one JPEG."""
    head = (
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="image"; filename="photo.jpg"\r\n'
        "Content-Type: image/jpeg\r\n\r\n"
    ).encode()
    return head + jpeg + f"\r\n--{BOUNDARY}--\r\n".encode()


@dataclass(frozen=True)
class Upload:
    """One prepared request for one image: where it goes, its headers and its body."""

    path: str
    headers: dict[str, str]
    body: bytes


def _infer(name: str, datatype: str, shape: list[int], binary: bytes, model: str) -> Upload:
    header = json.dumps(
        {
            "inputs": [
                {"name": name, "datatype": datatype, "shape": shape, "parameters": {"binary_data_size": len(binary)}}
            ]
        }
    ).encode()
    return Upload(f"/v2/models/{model}/infer", {"Inference-Header-Content-Length": str(len(header))}, header + binary)


def _oip_image(jpeg: bytes, model: str) -> Upload:
    return _infer("image", "BYTES", [1, 1], len(jpeg).to_bytes(4, "little") + jpeg, model)


def _oip_tensor(tensor: np.ndarray, model: str) -> Upload:
    return _infer("input", "FP32", [1, *tensor.shape], np.ascontiguousarray(tensor, "<f4").tobytes(), model)


def _oip_json(tensor: np.ndarray, model: str) -> Upload:
    document = {
        "inputs": [{"name": "input", "datatype": "FP32", "shape": [1, *tensor.shape], "data": tensor.ravel().tolist()}]
    }
    return Upload(f"/v2/models/{model}/infer", {"Content-Type": "application/json"}, json.dumps(document).encode())


FORMS: dict[str, Callable[..., Upload]] = {
    "multipart": lambda jpeg, model: Upload("/classify", {"Content-Type": MULTIPART_TYPE}, multipart_body(jpeg)),
    "raw": lambda jpeg, model: Upload("/classify", {"Content-Type": "image/jpeg"}, jpeg),
    "oip_image": _oip_image,
    "oip_tensor": _oip_tensor,  # takes the preprocessed tensor of each image, not its JPEG
    "oip_json": _oip_json,  # the same, as the protocol's JSON form
}


def uploads(images: list[Any], form: str = "multipart", model: str = "handoff") -> list[Upload]:
    """One request per image in `form`: JPEG bytes for every form but oip_tensor and oip_json, which take C x H x W
    arrays."""
    return [FORMS[form](image, model) for image in images]


def wrk_available() -> bool:
    return shutil.which("wrk") is not None


def tree_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process and all its living descendants."""
    root = psutil.Process(pid)
    total = 0.0
    for process in [root, *root.children(recursive=True)]:
        try:
            times = process.cpu_times()
            total += times.user + times.system
        except psutil.NoSuchProcess:
            pass
    return total


def _role(process: psutil.Process) -> str:
    """A process's part in a server: the module or script a Python process runs (`-m MODULE`, `SCRIPT.py`), else
    its program's name (`tritonserver`, `triton_python_backend_stub`)."""
    command = process.cmdline()
    if "-m" in command[:-1]:
        return command[command.index("-m") + 1]
    if len(command) > 1 and command[1].endswith(".py"):
        return Path(command[1]).name
    return process.name()


def thread_cpu_seconds(pid: int) -> dict[str, float]:
    """User + system CPU seconds of a process and its living descendants, by process and thread: each process's
    main thread (a Python server's event loop) apart from its other threads (a model's, a log writer's), keyed
    `ROLE: main thread` and `ROLE: other threads` (serve_throughput shows where each server's CPU goes)."""
    seconds: dict[str, float] = {}
    root = psutil.Process(pid)
    for process in [root, *root.children(recursive=True)]:
        try:
            role = _role(process)
            main, others = f"{role}: main thread", f"{role}: other threads"
            seconds.setdefault(main, 0.0)  # both, always: results of rounds are alike in shape
            seconds.setdefault(others, 0.0)
            for thread in process.threads():
                seconds[main if thread.id == process.pid else others] += thread.user_time + thread.system_time
        except psutil.Error:  # it ended meanwhile
            pass
    return seconds


RAMP_S = 1.0  # answers before this are left out of the rate: the pipeline fills (first full batch at c=64: ~0.8 s)


def steady_rate(answers: list[float], started: float) -> float:
    """Answers per second: the least-squares slope of the answer count against the answers' times (seconds,
    one clock), leaving out the first RAMP_S seconds after `started`. Waves of answers and the window's edges
    weigh little in a slope, where they move a count divided by the window's length."""
    steady = np.array([t for t in answers if t >= started + RAMP_S])
    if len(steady) < 2 or steady[-1] == steady[0]:
        return 0.0
    return float(np.polyfit(steady, np.arange(len(steady)), 1)[0])


END_MARGIN_S = 0.25  # the server's CPU is read this long before the load ends, while every connection still waits


class SteadyServerCpu:
    """The server's CPU seconds (its process tree), read by timer threads while the load runs: once the ramp is
    over, and just before the end. Their difference over the answers in between (at the steady rate) is its CPU
    per image, free of the start (nothing in flight yet) and of the end (requests taken in and partly worked on
    that the window leaves unanswered: up to a batch of model work at c=64)."""

    def __init__(self, server_pid: int, seconds: float) -> None:
        if seconds < RAMP_S + 2 * END_MARGIN_S:
            raise ValueError(f"a load of {seconds:g} s is too short: at least {RAMP_S + 2 * END_MARGIN_S:g} s")
        self.server_pid = server_pid
        self.reads: list[tuple[float, float, dict[str, float]]] = []  # when, the tree's CPU, by process and thread
        self.timers = [threading.Timer(at, self._read) for at in (RAMP_S, seconds - END_MARGIN_S)]
        for timer in self.timers:
            timer.start()

    def _read(self) -> None:
        self.reads.append((time.monotonic(), tree_cpu_seconds(self.server_pid), thread_cpu_seconds(self.server_pid)))

    def _span(self) -> tuple[tuple[float, float, dict[str, float]], ...]:
        """The two reads, first one first, once both timers have read."""
        for timer in self.timers:
            timer.join()
        return tuple(sorted(self.reads, key=lambda read: read[0]))

    def ms_per_image(self, images_per_s: float) -> float:
        (first_at, first_cpu, _), (last_at, last_cpu, _) = self._span()
        return 1000 * (last_cpu - first_cpu) / max(images_per_s * (last_at - first_at), 1e-9)

    def ms_per_image_by_thread(self, images_per_s: float) -> dict[str, float]:
        """`ms_per_image` by process and thread (`thread_cpu_seconds`' keys; the threads' clock ticks are coarser)."""
        (first_at, _, first), (last_at, _, last) = self._span()
        images = max(images_per_s * (last_at - first_at), 1e-9)
        return {key: 1000 * max(0.0, last[key] - first.get(key, 0.0)) / images for key in sorted(last)}


def _with_cpu(
    result: dict[str, Any], images: int, wall: float, client_cpu: float, server_cpu: float, steady: SteadyServerCpu
) -> dict:
    result["client_cpu_ms_per_image"] = 1000 * client_cpu / max(images, 1)
    result["client_cpu_share"] = client_cpu / (wall * CPUS)  # of the whole machine (all cores)
    result["server_cpu_ms_per_image"] = steady.ms_per_image(result["images_per_s"])
    result["server_cpu_ms_per_image_by_thread"] = steady.ms_per_image_by_thread(result["images_per_s"])
    result["server_cpu_ms_per_image_whole_window"] = 1000 * server_cpu / max(images, 1)
    return result


def load_wrk(
    url: str, server_pid: int, requests: list[Upload], concurrency: int, seconds: float, retry_after: bool = False
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="wrk-") as folder:
        for i, upload in enumerate(requests):
            Path(folder, f"{i:03d}.body").write_bytes(upload.body)
        script = Path(folder, "upload.lua")
        headers = ", ".join(
            f"[{i}] = {{{', '.join(f'[{json.dumps(k)}] = {json.dumps(v)}' for k, v in upload.headers.items())}}}"
            for i, upload in enumerate(requests)
        )
        script.write_text(
            WRK_SCRIPT % {"folder": folder, "count": len(requests), "headers": headers, "path": requests[0].path}
            + (WRK_RETRY_AFTER if retry_after else "")
        )
        cmd = ["wrk", "-t", "1", "-c", str(concurrency), "-d", f"{seconds:g}s", "--timeout", "120s", "-s", str(script)]
        server_before = tree_cpu_seconds(server_pid)
        started = time.perf_counter()
        process = subprocess.Popen([*cmd, url], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        steady = SteadyServerCpu(server_pid, seconds)
        assert process.stdout is not None
        output = process.stdout.read().decode()
        _, status, usage = os.wait4(process.pid, 0)
        wall = time.perf_counter() - started
        server_cpu = tree_cpu_seconds(server_pid) - server_before
    line = next((x for x in output.splitlines() if x.startswith("RESULT ")), None)
    if status != 0 or line is None:
        raise RuntimeError(f"wrk failed ({status}):\n{output}")
    figures = json.loads(line[len("RESULT ") :])
    result = {
        # only answered images count: a 503 for overload is not throughput
        "images_per_s": steady_rate(figures["answers"], figures["started"]),
        "images_per_s_whole_window": (figures["requests"] - figures["refused"]) / (figures["duration_us"] / 1e6),
        "answered": len(figures["answers"]),
        "p50_ms": figures["p50_us"] / 1000,
        "p99_ms": figures["p99_us"] / 1000,
        "errors": figures["errors"],
    }
    return _with_cpu(result, figures["requests"], wall, usage.ru_utime + usage.ru_stime, server_cpu, steady)


async def _load_httpx(
    url: str, requests: list[Upload], concurrency: int, seconds: float, retry_after: bool
) -> tuple[dict, int]:
    latencies: list[float] = []
    answers: list[float] = []  # when each image was answered (time.monotonic)
    errors = 0
    deadline = time.perf_counter() + seconds

    async def worker(client: httpx.AsyncClient, offset: int) -> None:
        nonlocal errors
        i = offset
        while time.perf_counter() < deadline:
            t0 = time.perf_counter()
            upload = requests[i % len(requests)]
            response = await client.post(f"{url}{upload.path}", content=upload.body, headers=upload.headers)
            latencies.append(time.perf_counter() - t0)
            errors += response.status_code != 200
            if response.status_code == 200:
                answers.append(time.monotonic())
            elif retry_after and "retry-after" in response.headers:
                await asyncio.sleep(float(response.headers["retry-after"]))
            i += concurrency

    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        started, wall_started = time.monotonic(), time.perf_counter()
        await asyncio.gather(*(worker(client, k) for k in range(concurrency)))
        elapsed = time.perf_counter() - wall_started
    result = {
        # only answered images count: a 503 for overload is not throughput
        "images_per_s": steady_rate(answers, started),
        "images_per_s_whole_window": len(answers) / elapsed,
        "answered": len(answers),
        "p50_ms": 1000 * float(np.percentile(latencies, 50)),
        "p99_ms": 1000 * float(np.percentile(latencies, 99)),
        "errors": errors,
    }
    return result, len(latencies)


def load_httpx(
    url: str, server_pid: int, requests: list[Upload], concurrency: int, seconds: float, retry_after: bool = False
) -> dict[str, Any]:
    server_before, client_before = tree_cpu_seconds(server_pid), time.process_time()
    started = time.perf_counter()
    steady = SteadyServerCpu(server_pid, seconds)
    result, images = asyncio.run(_load_httpx(url, requests, concurrency, seconds, retry_after))
    wall = time.perf_counter() - started
    client_cpu, server_cpu = time.process_time() - client_before, tree_cpu_seconds(server_pid) - server_before
    return _with_cpu(result, images, wall, client_cpu, server_cpu, steady)


CLIENTS = {"wrk": load_wrk, "httpx": load_httpx}


def warm_up(url: str, requests: list[Upload], count: int = 8) -> None:
    """A few requests first, so no side pays its first-call costs inside the measured window."""
    with httpx.Client(timeout=120) as client:
        for upload in requests[:count]:
            client.post(f"{url}{upload.path}", content=upload.body, headers=upload.headers).raise_for_status()


def load(
    client: str,
    url: str,
    server_pid: int,
    requests: list[Upload],
    concurrency: int,
    seconds: float,
    retry_after: bool = False,
) -> dict:
    """Images/s, p50/p99 latency, errors, and client and server CPU, for `seconds` of load at `concurrency`;
    `retry_after`: a refused request's connection waits as its Retry-After says (else it sends again at once)."""
    return CLIENTS[client](url, server_pid, requests, concurrency, seconds, retry_after)


def load_levels(
    client: str,
    url: str,
    server_pid: int,
    requests: list[Upload],
    levels: tuple[int, ...],
    seconds: float,
    retry_after: bool = False,
) -> dict[str, dict]:
    """A warm-up, then `load` at each concurrency level in turn, keyed by the level as text (as in the JSON)."""
    warm_up(url, requests)
    return {str(c): load(client, url, server_pid, requests, c, seconds, retry_after) for c in levels}
