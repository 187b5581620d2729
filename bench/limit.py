"""The in-process limit a served model is measured against: no HTTP, no server, the best arrangement found.

The same JPEGs, decoded and preprocessed by the service's own Preprocessor, run through ONNX Runtime with the
service's session settings (serve/model/runtime.py), on the whole machine. Three arrangements at each batch size:
- serial: decode a batch, then run it;
- overlapped: a thread pool (one thread per core) decodes batch k+1 while the model runs batch k;
- lanes: one lane per core, each a one-thread session with its own decoding thread, overlapped as above; the
  in-process peer of a service with one worker per core (HANDOFF_WORKERS).
One call is one round: every arrangement and batch size is timed over the same images (a sweep of short
windows), and the fastest is then timed again over a window as long as a service's load (`seconds`); that
second timing is the round's limit. Taking the best of fifteen short, noisy windows as the figure would bias
the limit upwards (the largest of several noisy draws overstates the mean), and the services are not given a
best-of. Callers take the median over rounds, interleaved with the services they compare.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from bench.checks import assert_provider
from contract.manifest import fast_decode_passed, read_manifest_unchecked
from contract.pil_transform import Preprocessor
from serve.config import usable_cores
from serve.model.runtime import onnx_providers, onnx_session_options

BATCH_SIZES = (1, 4, 8, 16, 32)


class InProcessModel:
    """One export folder's model and preprocessing, loaded the way the service loads them (the fast JPEG decode
    too, where the export's check passed, as with the service's default HANDOFF_DECODE=auto)."""

    def __init__(self, folder: Path, device: str, model_file: str = "model.onnx") -> None:
        import onnxruntime as ort

        manifest = read_manifest_unchecked(folder)
        self.pre = Preprocessor.from_manifest(manifest["preprocess"], max_pixels=10**8)
        self.fast_decode = fast_decode_passed(manifest)
        self.session = ort.InferenceSession(
            str(folder / model_file), onnx_session_options(), providers=onnx_providers(device)
        )
        assert_provider("limit", self.session.get_providers(), device)
        cores = usable_cores()
        self.pool = ThreadPoolExecutor(cores)
        # Lanes are a CPU arrangement (the service runs one worker per GPU, not per core).
        lanes = cores if device == "cpu" else 0
        self.lanes = [
            (ort.InferenceSession(str(folder / model_file), onnx_session_options(1)), ThreadPoolExecutor(1))
            for _ in range(lanes)
        ]

    def prepare(self, jpeg: bytes) -> np.ndarray:
        return self.pre(self.pre.decode(jpeg, fast=self.fast_decode))

    def run(self, batch: np.ndarray) -> None:
        self.session.run(None, {"input": batch})

    def serial(self, batches: list[list[bytes]]) -> None:
        for batch in batches:
            self.run(np.stack([self.prepare(jpeg) for jpeg in batch]))

    def overlapped(self, batches: list[list[bytes]], lane: tuple[Any, ThreadPoolExecutor] | None = None) -> None:
        session, pool = lane or (self.session, self.pool)
        pending = [pool.submit(self.prepare, jpeg) for jpeg in batches[0]]
        for k in range(len(batches)):
            ready = np.stack([future.result() for future in pending])
            if k + 1 < len(batches):  # the next batch decodes while this one runs
                pending = [pool.submit(self.prepare, jpeg) for jpeg in batches[k + 1]]
            session.run(None, {"input": ready})

    def in_lanes(self, batches: list[list[bytes]]) -> None:
        """The batches dealt out to the lanes in turn, every lane running at once (sessions release the GIL)."""
        count = len(self.lanes)
        threads = [
            threading.Thread(target=self.overlapped, args=(batches[i::count], lane))
            for i, lane in enumerate(self.lanes)
            if batches[i::count]
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()


def _timed(work: Callable[[list[list[bytes]]], None], batches: list[list[bytes]]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this whole process: every thread, ONNX Runtime's included)."""
    wall, cpu = time.perf_counter(), time.process_time()
    work(batches)
    return time.perf_counter() - wall, time.process_time() - cpu


def _batches(jpegs: list[bytes], size: int, images: int, lanes: int) -> list[list[bytes]]:
    """At least `images` JPEGs in batches of `size`, a whole number of batches per lane so that no lane idles."""
    count = -(-max(1, images // size) // lanes) * lanes
    return [[jpegs[(i * size + j) % len(jpegs)] for j in range(size)] for i in range(count)]


def _throughput(work: Callable[[list[list[bytes]]], None], batches: list[list[bytes]]) -> dict[str, float]:
    """Images per second and CPU ms per image of `work` over `batches`."""
    wall, cpu = _timed(work, batches)
    count = sum(len(batch) for batch in batches)
    return {"images_per_s": count / wall, "cpu_ms_per_image": 1000 * cpu / count}


def overlapped_limit(model: InProcessModel, jpegs: list[bytes], images: int, size: int = 32) -> dict[str, float]:
    """Images/s and CPU ms per image of the overlapped arrangement alone on batches of `size` (no sweep: for
    workloads too slow to sweep, such as 12-megapixel photos)."""
    batches = _batches(jpegs, size, images, 1)
    model.overlapped(batches[:1])  # warm
    return _throughput(model.overlapped, batches)


def limit_round(model: InProcessModel, jpegs: list[bytes], seconds: float, images: int = 96) -> dict[str, Any]:
    """One round: images/s and CPU ms per image for every arrangement and batch size (the sweep), the fastest
    timed again for `seconds` (the round's limit), and the single-image time (decode + preprocess + batch of 1,
    median of 30 calls)."""
    arrangements = {"serial": model.serial, "overlapped": model.overlapped}
    if model.lanes:
        arrangements["lanes"] = model.in_lanes
    lanes = max(1, len(model.lanes))
    by_arrangement: dict[str, dict[int, dict[str, float]]] = {name: {} for name in arrangements}
    for size in BATCH_SIZES:
        batches = _batches(jpegs, size, images, lanes)
        for name, arrangement in arrangements.items():
            arrangement(batches[:1])  # warm this batch size
            by_arrangement[name][size] = _throughput(arrangement, batches)
    best_name, best_size = max(
        ((name, size) for name, rows in by_arrangement.items() for size in rows),
        key=lambda key: by_arrangement[key[0]][key[1]]["images_per_s"],
    )
    swept = by_arrangement[best_name][best_size]["images_per_s"]
    limit = _throughput(arrangements[best_name], _batches(jpegs, best_size, int(swept * seconds), lanes))
    single = [_timed(model.serial, [[jpegs[i % len(jpegs)]]])[0] for i in range(30)]
    return {
        **limit,
        "best": f"{best_name}, batch {best_size}",
        "best_in_sweep_images_per_s": swept,
        "single_image_ms": 1000 * statistics.median(single),
        "by_arrangement": {
            name: {str(size): row for size, row in rows.items()} for name, rows in by_arrangement.items()
        },
    }
