"""What runs inside the generation engine's process (serve/model/generation_engine.py starts it): the ONNX Runtime GenAI
model opened from a private copy of the files the manifest verified, and generations on it, each on its own thread.

A generation is one `og.Generator` on the shared model, fed the ids the service's own tokenizer made
(contract/generation.py), sampling as asked (temperature 0: greedy, as transformers' `do_sample=False`), stopping at
an eos id, a stop string, `max_tokens` or the context's end. Its text is given as it becomes whole, a stop string
never included (as vLLM); `cancelled` ends it at its next token.

ONNX Runtime GenAI holds Python's GIL while it computes a token, so generations in the serving process would starve
its event loop (a sleeping thread woke 5 ms late with one generation running, up to 136 ms with eight): the model
lives in a process of its own, as vLLM's engine core does.
"""

from __future__ import annotations

import atexit
import logging
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from contract.errors import ClientError
from contract.generation import GENAI_FOLDER, PromptTokenizer, TextStream
from contract.manifest import Manifest, copy_artifact

log = logging.getLogger("bentoml.handoff")


@contextmanager
def verified_copy(folder: Path, manifest: Manifest, keep_config: bool = False) -> Iterator[Path]:
    """The export's `genai/` files, each copied through the manifest's hash, in a private folder (0700) that is
    removed on exit: what ONNX Runtime GenAI opens is what was checked, whatever happens to the export folder. With
    `keep_config`, only the weights go on exit, the rest when the process ends: the loaded model reads its config
    folder again for each constrained generation (guidance reads the tokenizer files there)."""
    genai = manifest["genai"]["folder"] if "genai" in manifest else GENAI_FOLDER
    private = Path(tempfile.mkdtemp(prefix="handoff-genai-"))
    try:
        for name in sorted(n for n in manifest["artifacts"] if n.startswith(f"{genai}/")):
            copy_artifact(folder, manifest, name, private / name[len(genai) + 1 :])
        yield private
    finally:
        if keep_config:
            for weights in [*private.glob("*.onnx"), *private.glob("*.onnx.data")]:
                weights.unlink(missing_ok=True)
            atexit.register(shutil.rmtree, private, ignore_errors=True)
        else:
            shutil.rmtree(private, ignore_errors=True)


def open_model(private: Path, device: str) -> tuple[Any, str]:
    """The GenAI model in `private` and where it runs: CUDA for `cuda`, and for `auto` where it can, else the CPU."""
    import onnxruntime_genai as og

    def config(cuda: bool) -> Any:
        found = og.Config(str(private))
        found.clear_providers()  # the CPU, unless CUDA is appended
        if cuda:
            found.append_provider("cuda")
        return found

    use_cuda = device == "cuda" or (device == "auto" and cuda_available())
    try:
        return og.Model(config(use_cuda)), "cuda" if use_cuda else "cpu"
    except RuntimeError as err:
        if device == "cuda" or not use_cuda:
            raise
        log.warning("CUDA cannot run the model here (%s): on the CPU", str(err).splitlines()[0])
        return og.Model(config(False)), "cpu"


def cuda_available() -> bool:
    """Whether ONNX Runtime GenAI can run on CUDA here (it raises, rather than answers, where CUDA's libraries are
    missing)."""
    import onnxruntime_genai as og

    try:
        return bool(og.is_cuda_available())
    except RuntimeError:
        return False


@dataclass(frozen=True)
class Sampling:
    """One request's decoding, as OpenAI's and vLLM's parameters name it."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    """0: every token"""
    seed: int | None = None
    stop: tuple[str, ...] = ()
    min_tokens: int = 0
    """no eos before this many tokens (vLLM's `min_tokens`)"""
    repetition_penalty: float = 1.0
    """transformers' (and vLLM's): a token already in the prompt or the text has its logit divided by it (times it
    where negative)"""
    guidance: tuple[str, str] | None = None
    """ONNX Runtime GenAI's constrained decoding (kind, data): a response_format's JSON schema"""
    logprobs: int | None = None
    """each token's log-probability and this many of the likeliest (None: none asked for)"""


# A generated token's log-probability (the model's log-softmax, before any processing, as vLLM's default reports it)
# and the `logprobs` likeliest tokens': (token id, logprob, ((id, logprob), ...)).
TokenLogprob = tuple[int, float, tuple[tuple[int, float], ...]]


@dataclass(frozen=True)
class Piece:
    """What a generation gives: new text, and at the end why it stopped ("stop", "length", or "abort" where the client
    left) and how many tokens."""

    text: str
    finish_reason: str | None = None
    completion_tokens: int = 0
    logprobs: tuple[TokenLogprob, ...] = ()
    """the tokens generated since the last piece, where asked (an eos, which has no text, left out)"""


def generate(
    model: Any,
    tokenizer: PromptTokenizer,
    eos: tuple[int, ...],
    prompt: list[int],
    sampling: Sampling,
    cancelled: threading.Event,
    put: Callable[[Piece], None],
    between_tokens: Callable[[], None] = lambda: None,
) -> None:
    """One generation on `model`, its text given to `put` as it comes, the last piece with its finish reason;
    `between_tokens` is called before each token."""
    import onnxruntime_genai as og

    params = og.GeneratorParams(model)
    search: dict[str, Any] = {
        "max_length": len(prompt) + sampling.max_tokens,
        "min_length": len(prompt) + min(sampling.min_tokens, sampling.max_tokens),
        "repetition_penalty": sampling.repetition_penalty,
    }
    if sampling.temperature == 0:
        search["do_sample"] = False
    else:
        vocab = tokenizer.tokenizer.get_vocab_size(with_added_tokens=True)
        search |= {
            "do_sample": True,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "top_k": min(sampling.top_k, vocab) if sampling.top_k else vocab,  # past the vocabulary: every token
        }
        if sampling.seed is not None:
            search["random_seed"] = sampling.seed
    params.set_search_options(**search)
    if sampling.guidance is not None:
        try:
            params.set_guidance(*sampling.guidance)
            generator = og.Generator(model, params)
        except RuntimeError as err:  # llguidance's refusal of the schema, before any token
            refused = str(err).splitlines()[0][:300] if str(err) else type(err).__name__
            raise ClientError(f"response_format: the schema cannot be followed: {refused}") from None
    else:
        generator = og.Generator(model, params)
    generator.append_tokens(prompt)
    text = TextStream(tokenizer)
    stops = StopStrings(sampling.stop)
    tokens = 0

    scored: list[TokenLogprob] = []  # since the last piece

    def give(piece: Piece) -> None:
        put(Piece(piece.text, piece.finish_reason, piece.completion_tokens, tuple(scored)))
        scored.clear()

    def finish(reason: str) -> None:
        """The last piece: what the text and the stop strings still hold (a stop string met in it ends it there)."""
        ready, stopped = stops.add(text.flush())
        give(Piece(ready if stopped else ready + stops.flush(), "stop" if stopped else reason, tokens))

    while True:
        if cancelled.is_set():
            log.info("generation stopped: the client left after %d tokens", tokens)
            put(Piece("", "abort", tokens))  # vLLM's reason; whoever still waits ends
            return
        if generator.is_done():
            return finish("length")
        between_tokens()
        logits = np.asarray(generator.get_logits()).reshape(-1) if sampling.logprobs is not None else None
        generator.generate_next_token()
        token = int(generator.get_next_tokens()[0])
        tokens += 1
        if token in eos:
            return finish("stop")
        if logits is not None:
            scored.append(token_logprob(logits, token, int(sampling.logprobs or 0)))
        ready, stopped = stops.add(text.add(token))
        if stopped:
            give(Piece(ready, "stop", tokens))
            return
        if ready:
            give(Piece(ready))
        if tokens >= sampling.max_tokens:
            return finish("length")


def token_logprob(logits: np.ndarray, token: int, top: int) -> TokenLogprob:
    """`token`'s log-probability under `logits` (log-softmax in float64) and the `top` likeliest tokens'."""
    shifted = logits.astype(np.float64) - float(logits.max())
    scores = shifted - np.log(np.exp(shifted).sum())
    best = np.argpartition(-scores, top - 1)[:top] if 0 < top < len(scores) else np.arange(len(scores))[:top]
    ranked = sorted(((int(i), float(scores[i])) for i in best), key=lambda pair: -pair[1])
    return token, float(scores[token]), tuple(ranked)


class StopStrings:
    """Text given as it comes, held back only as long as it could be the start of a stop string; a stop string ends
    the text before it."""

    def __init__(self, stops: tuple[str, ...]) -> None:
        self.stops = tuple(s for s in stops if s)
        self.held = ""

    def add(self, new: str) -> tuple[str, bool]:
        """(text ready to give, whether a stop string was met)."""
        self.held += new
        for stop in self.stops:
            at = self.held.find(stop)
            if at >= 0:
                ready, self.held = self.held[:at], ""
                return ready, True
        keep = max((len(s) - 1 for s in self.stops), default=0)
        keep = max((k for k in range(keep, 0, -1) if any(s.startswith(self.held[-k:]) for s in self.stops)), default=0)
        ready = self.held[: len(self.held) - keep] if keep else self.held
        self.held = self.held[len(ready) :]
        return ready, False

    def flush(self) -> str:
        ready, self.held = self.held, ""
        return ready
