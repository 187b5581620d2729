"""Per-epoch metrics: RUN/metrics.csv, and RUN/curves.png drawn from it (rank 0 only).

The CSV row is written before the next epoch starts; the picture is drawn in a background thread at the lowest
CPU priority (train/background.py; matplotlib's import and rendering take about a second of CPU), so training
neither waits for it nor shares its cores with it. `close()` waits for the last one.
"""

from __future__ import annotations

import csv
import io
import logging
import threading
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import IO

from train.background import background_executor
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
        self._drawer = background_executor("curves")
        self._lock = threading.Lock()
        self._rows_to_draw: list[EpochMetrics] | None = None  # set while a drawing is queued, not yet started

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
        """Add a row and redraw the curves in the background; a full disk only warns, since the checkpoint is
        what matters."""
        try:
            rows = self.read() + [row]
            self._write(rows)
        except OSError as err:
            log.warning("could not write %s: %s", self.csv_path.name, err)
            return
        with self._lock:  # a drawing still waiting for its turn draws these rows instead: one picture, the latest
            queued, self._rows_to_draw = self._rows_to_draw is not None, rows
        if not queued:
            self._drawer.submit(self._plot_latest)

    def _plot_latest(self) -> None:
        with self._lock:
            rows, self._rows_to_draw = self._rows_to_draw, None
        try:
            self.plot(rows or [])
        except OSError as err:
            log.warning("could not write %s: %s", self.png_path.name, err)

    def close(self) -> None:
        """Wait for the last drawing of the curves."""
        self._drawer.shutdown(wait=True)

    def _write(self, rows: list[EpochMetrics]) -> None:
        text = io.StringIO(newline="")
        writer = csv.DictWriter(text, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(asdict(r) for r in rows)
        publish(self.csv_path, lambda f: _write_all(f, text.getvalue().encode()))

    def plot(self, rows: list[EpochMetrics]) -> None:
        # matplotlib's object API, not pyplot: no global state, so it may draw in a thread
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        epochs = [r.epoch for r in rows]
        fig = Figure(figsize=(10, 4))
        FigureCanvasAgg(fig)
        ax_loss, ax_acc = fig.subplots(1, 2)
        ax_loss.plot(epochs, [r.train_loss for r in rows], "o-", label="train")
        ax_loss.plot(epochs, [r.val_loss for r in rows], "o-", label="val")
        ax_loss.set(title="loss", xlabel="epoch", ylabel="cross-entropy (log scale)", yscale="log")
        ax_acc.plot(epochs, [r.train_acc1 for r in rows], "o-", label="train")
        ax_acc.plot(epochs, [r.val_acc1 for r in rows], "o-", label="val")
        ax_acc.set(title="top-1 accuracy", xlabel="epoch", ylabel="%", ylim=(0, 100))
        for ax in (ax_loss, ax_acc):
            ax.grid(alpha=0.3)
            ax.legend()
        fig.tight_layout()
        png = io.BytesIO()
        fig.savefig(png, format="png", dpi=100)
        publish(self.png_path, lambda f: _write_all(f, png.getvalue()))
