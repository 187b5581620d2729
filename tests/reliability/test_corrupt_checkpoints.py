"""A real checkpoint damaged on purpose, many ways: truncated at many offsets, single bytes flipped in the
pickle, the tensor data and the zip directory. Every case must be refused with one line (CheckpointError;
exit 2 on the command line) or, where the damage is harmless (zip padding), load exactly the original:
never a traceback, a silently wrong weight or a hang. Prints the counts."""

from __future__ import annotations

import random
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import torch
from conftest import TRAIN, run

from export.readers import read_source
from train.checkpoint import CheckpointError, load

pytestmark = pytest.mark.xdist_group("corrupt")  # its module fixtures stay on one worker

SEED = 0
TRUNCATIONS = 40
FLIPS = 160
HANG_RATIO = 100  # a case slower than this many reads of the intact checkpoint is a hang
# A small model: its ~3 MB checkpoint has the same zip layout, pickle and CRCs as resnet18's ~90 MB one, and
# each of the 400 reads below costs a thirtieth as much.
SMALL = ("--arch", "shufflenet_v2_x0_5")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("corrupt") / "run"
    trained = run(
        [sys.executable, TRAIN, "--epochs", "1", "--workers", "0", "--keep-last", "0", *SMALL, "--out", str(out)]
    )
    assert trained.returncode == 0, trained.stderr[-2000:]
    return out / "last.pt"


def damage_plan(size: int) -> list[tuple[str, int]]:
    """Offsets in every region: the pickle at the front, the tensor bytes, the zip directory (last ~12 KB)."""
    rng = random.Random(SEED)
    plan = [("truncate", 0), ("truncate", 1), ("truncate", size - 1), ("truncate", size - 22)]
    plan += [("truncate", rng.randrange(size)) for _ in range(TRUNCATIONS - len(plan))]
    for region in (range(4096), range(size - 16384, size)):
        plan += [("flip", rng.choice(region)) for _ in range(FLIPS // 4)]
    plan += [("flip", rng.randrange(size)) for _ in range(FLIPS // 2)]
    return plan


def damaged(original: bytes, how: str, offset: int) -> bytes:
    if how == "truncate":
        return original[:offset]
    data = bytearray(original)
    data[offset] ^= 0xFF
    return bytes(data)


def identical(a, b) -> bool:
    """Equal trees of containers, tensors and scalars: the whole checkpoint, not just the model."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(identical(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(identical, a, b))
    return a == b


def seconds_to_read(path: Path) -> float:
    """How long both readers (--resume's load and export's) take on `path`."""
    started = time.monotonic()
    load(path)
    read_source(path)
    return time.monotonic() - started


def test_every_corruption_is_refused_with_one_line_or_harmless(checkpoint: Path, tmp_path: Path):
    original_bytes = checkpoint.read_bytes()
    original = load(checkpoint)
    outcomes: Counter[str] = Counter()
    problems: list[str] = []
    target = tmp_path / "damaged.pt"
    slowest = 0.0
    intact_s = min(seconds_to_read(checkpoint) for _ in range(3))
    for how, offset in damage_plan(len(original_bytes)):
        target.write_bytes(damaged(original_bytes, how, offset))
        started = time.monotonic()
        for reader in ("resume", "export"):
            try:
                state = load(target) if reader == "resume" else read_source(target).state_dict
            except CheckpointError as err:
                message = str(err)
                if "\n" in message or not message.startswith(str(target)):
                    problems.append(f"{how}@{offset} ({reader}): not one line naming the file: {message!r}")
                outcomes[f"{how}: refused by {reader}"] += 1
            except Exception as err:  # noqa: BLE001 - exactly what this test hunts for
                problems.append(f"{how}@{offset} ({reader}): {type(err).__name__}: {err}")
            else:
                if not identical(state, original if reader == "resume" else original["model"]):
                    problems.append(f"{how}@{offset} ({reader}): loaded different weights without a word")
                outcomes[f"{how}: harmless, loaded the original"] += 1
        slowest = max(slowest, time.monotonic() - started)
    print(
        f"\ncorrupted checkpoints ({len(original_bytes) / 1e6:.0f} MB, each case read as --resume and by export): "
        f"{dict(outcomes)}; problems {len(problems)}; slowest case {slowest:.2f} s"
    )
    assert not problems, problems[:10]
    assert slowest < HANG_RATIO * intact_s, f"no case may hang (the intact checkpoint: {intact_s:.3f} s)"
    for reader in ("resume", "export"):  # each on its own: one reader's refusals must not hide the other's misses
        assert outcomes[f"flip: refused by {reader}"] >= 0.9 * FLIPS, f"{reader}: most flips are caught by the CRCs"


@pytest.mark.parametrize("how,offset", [("truncate", 2_500_000), ("flip", 1_500_000), ("flip", 200)])
def test_command_line_exits_2_with_one_line(checkpoint: Path, tmp_path: Path, how: str, offset: int):
    target = tmp_path / "damaged.pt"
    target.write_bytes(damaged(checkpoint.read_bytes(), how, offset))
    exported = run([sys.executable, "-m", "export", str(target), "--out", str(tmp_path / "export"), "--no-bento"])
    assert exported.returncode == 2 and len(exported.stderr.strip().splitlines()) == 1, exported.stderr[-2000:]
    assert not (tmp_path / "export").exists(), "nothing half-written"
    resumed = run(
        [
            sys.executable,
            TRAIN,
            "--epochs",
            "1",
            "--workers",
            "0",
            *SMALL,
            "--resume",
            str(target),
            "--out",
            str(tmp_path / "run"),
        ]
    )
    errors = [line for line in resumed.stderr.splitlines() if "ERROR" in line]
    assert resumed.returncode == 2 and len(errors) == 1 and "--resume:" in errors[0], resumed.stderr[-2000:]
    assert "Traceback" not in resumed.stderr
