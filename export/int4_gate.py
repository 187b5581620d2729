"""The accuracy gate an int4 language model passes before it is served in place of the fp32 one (`--int4`).

Both GenAI models run on the same prompts (parity's, and the user's own with --prompts). The fp32 model generates
greedily, to eos or `new_tokens`; the int4 model is then fed the fp32 model's tokens one at a time (teacher forcing),
which gives, from one pass:
- agreement: each step where int4's greedy choice is fp32's token, until the first step where it is not (past it the
  two sequences would go on from different tokens): the share of all fp32 tokens agreed on this way;
- first differences: each must be a near-tie (each side's token in the other's top NEAR_TIE_TOP), counted;
- log-likelihood: the mean log-probability of the fp32 model's continuations under the int4 model, against the fp32
  model's own; the drop (fp32 minus int4, in nats a token) within `max_loglik_drop`.
`Int4Gate` holds the bounds; `GateReport` the figures, which the manifest records (`genai.gate`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

NEAR_TIE_TOP = 5


@dataclass(frozen=True)
class Int4Gate:
    """The bounds an int4 model must hold against the fp32 model."""

    min_agreement: float = 0.4  # share of the fp32 model's greedy tokens int4 chooses too, to each first difference
    max_loglik_drop: float = 0.1  # nats a token: fp32's continuations, fp32's mean log-probability minus int4's


DEFAULT_GATE = Int4Gate()


@dataclass
class GateReport:
    """What the gate measured, and its verdict."""

    prompts: int = 0
    tokens: int = 0  # fp32 greedy tokens, all prompts
    agreed: int = 0  # of those, chosen by int4 too before each prompt's first difference
    first_differences: int = 0
    near_ties: int = 0  # first differences where each token is in the other's top NEAR_TIE_TOP
    loglik_fp32: float = 0.0  # mean log-probability a token of fp32's continuations, under each model
    loglik_int4: float = 0.0
    passed: bool = False
    reason: str | None = None

    @property
    def agreement(self) -> float:
        return self.agreed / self.tokens if self.tokens else 0.0

    def to_manifest(self, gate: Int4Gate) -> dict[str, Any]:
        return {**asdict(self), "agreement": round(self.agreement, 4), "bounds": asdict(gate)}

    def line(self) -> str:
        drop = self.loglik_fp32 - self.loglik_int4
        return (
            f"int4 against fp32 on {self.prompts} prompts: {self.agreement:.1%} of {self.tokens} greedy tokens agreed, "
            f"{self.first_differences} first difference(s) ({self.near_ties} near-ties), log-likelihood "
            f"{self.loglik_int4:.3f} against {self.loglik_fp32:.3f} a token (drop {drop:.3f})"
        )


def measure(fp32: Path, int4: Path, prompts: list[list[int]], new_tokens: int, eos: list[int]) -> GateReport:
    """Both GenAI models on `prompts` (token ids) as the module docstring says; the verdict is `judge`'s."""
    import onnxruntime_genai as og

    reference, quantized = og.Model(str(fp32)), og.Model(str(int4))
    report = GateReport()
    fp32_sum = int4_sum = 0.0
    for ids in prompts:
        tokens, fp32_logits = _greedy(reference, ids, new_tokens, eos)
        int4_logits = _teacher_forced(quantized, ids, tokens)
        report.prompts += 1
        report.tokens += len(tokens)
        for step, token in enumerate(tokens):
            mine, theirs = int4_logits[step], fp32_logits[step]
            fp32_sum += float(_log_softmax(theirs)[token])
            int4_sum += float(_log_softmax(mine)[token])
        agreed, near_tie = first_difference(tokens, fp32_logits, int4_logits)
        report.agreed += agreed
        if agreed < len(tokens):
            report.first_differences += 1
            report.near_ties += int(near_tie)
    report.loglik_fp32 = fp32_sum / max(1, report.tokens)
    report.loglik_int4 = int4_sum / max(1, report.tokens)
    return report


def first_difference(tokens: list[int], fp32: list[np.ndarray], int4: list[np.ndarray]) -> tuple[int, bool]:
    """How many of fp32's `tokens` int4's greedy choice equals before the first that it does not, and whether that
    difference is a near-tie (True where there is none)."""
    for step, token in enumerate(tokens):
        chosen = int(np.argmax(int4[step]))
        if chosen != token:
            in_theirs = chosen in np.argsort(-fp32[step])[:NEAR_TIE_TOP]
            in_mine = token in np.argsort(-int4[step])[:NEAR_TIE_TOP]
            return step, bool(in_theirs and in_mine)
    return len(tokens), True


def judge(report: GateReport, gate: Int4Gate) -> GateReport:
    """The verdict on `report` against `gate`'s bounds, with by how much it missed the first it missed."""
    drop = report.loglik_fp32 - report.loglik_int4
    if report.tokens == 0:
        report.passed, report.reason = False, "the fp32 model generated no token to compare"
    elif report.near_ties < report.first_differences:
        report.passed = False
        report.reason = (
            f"{report.first_differences - report.near_ties} of {report.first_differences} first differences are "
            f"not near-ties (each token in the other's top {NEAR_TIE_TOP})"
        )
    elif report.agreement < gate.min_agreement:
        report.passed = False
        report.reason = (
            f"int4 chose fp32's greedy token {report.agreement:.1%} of the time, below the gate's "
            f"{gate.min_agreement:.0%} by {gate.min_agreement - report.agreement:.1%}"
        )
    elif drop > gate.max_loglik_drop:
        report.passed = False
        report.reason = (
            f"the log-likelihood of fp32's continuations drops by {drop:.3f} nats a token under int4, past the "
            f"gate's {gate.max_loglik_drop} by {drop - gate.max_loglik_drop:.3f}"
        )
    else:
        report.passed, report.reason = True, None
    return report


def _greedy(model: Any, ids: list[int], new_tokens: int, eos: list[int]) -> tuple[list[int], list[np.ndarray]]:
    """The model's greedy tokens after `ids` (to eos, or `new_tokens`), and the logits each was chosen from."""
    import onnxruntime_genai as og

    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(ids) + new_tokens, do_sample=False)
    generator = og.Generator(model, params)
    generator.append_tokens(ids)
    tokens: list[int] = []
    logits: list[np.ndarray] = []
    while not generator.is_done():
        logits.append(np.array(generator.get_logits(), dtype=np.float64).reshape(-1))
        generator.generate_next_token()
        tokens.append(int(generator.get_next_tokens()[0]))
        if tokens[-1] in eos:
            break
    return tokens, logits


def _teacher_forced(model: Any, ids: list[int], tokens: list[int]) -> list[np.ndarray]:
    """The model's logits before each of `tokens`, each fed in turn after `ids`."""
    import onnxruntime_genai as og

    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(ids) + len(tokens) + 1, do_sample=False)
    generator = og.Generator(model, params)
    generator.append_tokens(ids)
    logits = []
    for token in tokens:
        logits.append(np.array(generator.get_logits(), dtype=np.float64).reshape(-1))
        generator.append_tokens([token])
    return logits


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max()
    return shifted - np.log(np.exp(shifted).sum())
