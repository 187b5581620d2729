"""The checkpoint benchmark's pieces (bench/checkpoint_stall.py): the raw-bytes reference saver really writes the
state's bytes, and the paired ratios' median comes with an interval that brackets it."""

import random
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # bench/ is scripts, not an installed package
from bench.results import median_with_interval  # noqa: E402
from bench.save_floors import RawBytesSaver, tensors  # noqa: E402


def state(step: int) -> dict:
    return {
        "model": {"w": torch.full((3, 4), float(step)), "num_batches_tracked": torch.tensor(step)},
        "optimizer": {"state": {0: {"momentum_buffer": torch.arange(5.0) * step}}, "param_groups": [{"lr": 0.1}]},
        "epoch": step,
    }


def test_raw_bytes_saver_writes_every_tensor_byte_and_replaces_the_last(tmp_path):
    saver = RawBytesSaver(tmp_path, is_main=True)
    try:
        for step in (1, 2):
            saver.save(state(step), epoch_done=True, is_best=False)
        saver.wait()
    finally:
        saver.close()
    expected = b"".join(t.numpy().tobytes() for t in tensors(state(2)))
    assert (tmp_path / "last.bin").read_bytes() == expected
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.bin"]  # no temporary left behind


def test_the_interval_brackets_the_median_and_is_reproducible():
    draw = random.Random(1)
    ratios = [1.03 + draw.gauss(0, 0.04) for _ in range(15)]
    median, low, high = median_with_interval(ratios)
    assert min(ratios) <= low < median < high <= max(ratios)
    assert median_with_interval(ratios) == (median, low, high)
    assert median_with_interval([1.0] * 15) == (1.0, 1.0, 1.0)
