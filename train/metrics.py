"""Per-epoch metrics: RUN/metrics.csv, and RUN/curves.png drawn from it (rank 0 only).

Both are written before the next epoch starts, each replaced atomically; the picture takes a few milliseconds
(train/curves.py), so it is drawn in place rather than in a thread.
"""

from __future__ import annotations

import csv
import io
import logging
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import IO

from train.curves import Panel, draw_curves
from train.files import publish

log = logging.getLogger(__name__)


@dataclass
class EpochMetrics:
    epoch: int  # 1-based: the number of epochs completed
    step: int
    lr: float
    train_loss: float
    train_acc1: float
    val_loss: float
    val_acc1: float
    seconds: float


COLUMNS = [f.name for f in fields(EpochMetrics)]


def _write_all(f: IO[bytes], data: bytes) -> None:
    f.write(data)


class MetricsLog:
    def __init__(self, folder: Path) -> None:
        self.csv_path = folder / "metrics.csv"
        self.png_path = folder / "curves.png"

    def read(self) -> list[EpochMetrics]:
        if not self.csv_path.is_file():
            return []
        with open(self.csv_path, newline="") as f:
            return [
                EpochMetrics(**{k: (int(row[k]) if k in ("epoch", "step") else float(row[k])) for k in COLUMNS})  # type: ignore[arg-type]
                for row in csv.DictReader(f)
            ]

    def truncate_after(self, epoch: int) -> None:
        """On resume from an older checkpoint, forget the rows of epochs that will be trained again."""
        rows = self.read()
        kept = [r for r in rows if r.epoch <= epoch]
        if len(kept) != len(rows):
            self._write(kept)

    def append(self, row: EpochMetrics) -> None:
        """Add a row and redraw the curves; a full disk only warns, since the checkpoint is what matters."""
        try:
            rows = self.read() + [row]
            self._write(rows)
            self.plot(rows)
        except OSError as err:
            log.warning("could not write %s or %s: %s", self.csv_path.name, self.png_path.name, err)

    def _write(self, rows: list[EpochMetrics]) -> None:
        text = io.StringIO(newline="")
        writer = csv.DictWriter(text, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(asdict(r) for r in rows)
        publish(self.csv_path, lambda f: _write_all(f, text.getvalue().encode()))

    def plot(self, rows: list[EpochMetrics]) -> None:
        epochs = [r.epoch for r in rows]
        png = draw_curves(
            epochs,
            [
                Panel(
                    "loss",
                    "cross-entropy (log scale)",
                    {"train": [r.train_loss for r in rows], "val": [r.val_loss for r in rows]},
                    log_scale=True,
                ),
                Panel(
                    "top-1 accuracy",
                    "%",
                    {"train": [r.train_acc1 for r in rows], "val": [r.val_acc1 for r in rows]},
                    y_range=(0, 100),
                ),
            ],
        )
        publish(self.png_path, lambda f: _write_all(f, png))
