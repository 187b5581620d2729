"""Two models as a user of handoff writes them, in their own package: nothing here comes from handoff.

- TextClassifier: token ids (int64, a sequence of any length) and a padding mask (bool) -> class logits,
  an embedding and a small transformer encoder.
- TabularModel: float features and int64 categories -> a dict of two outputs, a score and class probabilities.
- Forecaster: a GRU over a series of any length -> a forecast per step.
- OuterProduct: a series of any length -> its outer product, an answer that grows with the square of the input.
"""

import torch
import torch.nn as nn

VOCAB, CLASSES = 100, 4
FEATURES, CATEGORIES, LEVELS = 6, 3, 5


class TextClassifier(nn.Module):
    def __init__(self, dim: int = 32) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, dim, padding_idx=0)
        layer = nn.TransformerEncoderLayer(dim, nhead=4, dim_feedforward=64, dropout=0.1, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
        self.head = nn.Linear(dim, CLASSES)

    def forward(self, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        hidden = self.encoder(self.embed(tokens), src_key_padding_mask=mask)
        keep = (~mask).unsqueeze(-1).float()
        pooled = (hidden * keep).sum(1) / keep.sum(1).clamp(min=1.0)
        return self.head(pooled)


class TabularModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embeddings = nn.ModuleList(nn.Embedding(LEVELS, 4) for _ in range(CATEGORIES))
        self.body = nn.Sequential(nn.Linear(FEATURES + 4 * CATEGORIES, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU())
        self.score = nn.Linear(32, 1)
        self.classes = nn.Linear(32, 3)

    def forward(self, features: torch.Tensor, categories: torch.Tensor) -> dict[str, torch.Tensor]:
        embedded = [embedding(categories[:, i]) for i, embedding in enumerate(self.embeddings)]
        hidden = self.body(torch.cat([features, *embedded], dim=1))
        return {"score": self.score(hidden), "probs": torch.softmax(self.classes(hidden), dim=1)}


class OuterProduct(nn.Module):
    """A model whose answer grows with the square of its input: a series [N, L] -> its outer product [N, L, L]."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Linear(1, 1)

    def forward(self, series: torch.Tensor) -> torch.Tensor:
        scaled = self.scale(series.unsqueeze(-1)).squeeze(-1)
        return scaled.unsqueeze(2) * scaled.unsqueeze(1)


class Forecaster(nn.Module):
    """A GRU over a series of any length [N, L, 1] -> a forecast per step [N, L, 1]."""

    def __init__(self) -> None:
        super().__init__()
        self.gru = nn.GRU(1, 8, batch_first=True)
        self.head = nn.Linear(8, 1)

    def forward(self, series: torch.Tensor) -> torch.Tensor:
        hidden, _ = self.gru(series)
        return self.head(hidden)


class SummingModel(nn.Module):
    """A mistake a user makes: its output has no batch dimension (the whole batch summed to one number)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(FEATURES, 1)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.linear(features).sum()


def raising_factory() -> nn.Module:
    """A mistake in a user's factory: it raises before any model exists."""
    raise RuntimeError("no GPU here")
