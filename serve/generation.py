"""A language model served: the ONNX Runtime GenAI model loaded from bytes the manifest verified, and generations
run on it, many at once, each on its own thread, off the event loop.

- Loading: every file of the export's `genai/` folder is read through the manifest's hashes and written into a
  private folder this process made (0700), which is what ONNX Runtime GenAI opens: the files it reads are the ones
  checked, whatever happens to the export folder afterwards.
- A generation (`Generations.stream`) is one `og.Generator` on the shared model, fed the ids the service's own
  tokenizer made (contract/generation.py), sampling as asked (temperature 0: greedy, as transformers'
  `do_sample=False`), stopping at an eos id, a stop string, `max_tokens` or the context's end. Its text comes out as
  it becomes whole, a stop string never included (as vLLM), through an asyncio queue; a client that leaves sets
  `cancelled`, and the loop ends at its next token.
- At most HANDOFF_MAX_GENERATIONS run at once; one more is refused at once (429) rather than queued.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import tempfile
import threading
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from contract.errors import ClientError
from contract.generation import GenerationSettings, PromptTokenizer, TextStream
from contract.manifest import read_artifact

log = logging.getLogger("bentoml.handoff")
GENAI_MODEL = "genai/model.onnx"


class GenAiRuntime:
    """The GenAI model, opened from a private copy of the verified files."""

    name = "onnxruntime-genai"
    artifact = GENAI_MODEL

    def __init__(self, folder: Path, manifest: dict[str, Any], device: str) -> None:
        import onnxruntime_genai as og

        genai = (manifest.get("genai") or {}).get("folder", "genai")
        self.private = Path(tempfile.mkdtemp(prefix="handoff-genai-"))  # 0700, this process's own
        try:
            for name in sorted(n for n in manifest["artifacts"] if n.startswith(f"{genai}/")):
                (self.private / name[len(genai) + 1 :]).write_bytes(read_artifact(folder, manifest, name))
            use_cuda = device == "cuda" or (device == "auto" and cuda_available())
            try:
                self.model = og.Model(self._config(use_cuda))
            except RuntimeError as err:
                if device == "cuda" or not use_cuda:
                    raise
                log.warning("CUDA cannot run the model here (%s): on the CPU", str(err).splitlines()[0])
                use_cuda = False
                self.model = og.Model(self._config(use_cuda))
        finally:
            shutil.rmtree(self.private, ignore_errors=True)  # the model holds what it read
        self.device = "cuda" if use_cuda else "cpu"
        self.provider = "CUDAExecutionProvider" if use_cuda else "CPUExecutionProvider"

    def _config(self, cuda: bool) -> Any:
        import onnxruntime_genai as og

        config = og.Config(str(self.private))
        config.clear_providers()  # the CPU, unless CUDA is appended
        if cuda:
            config.append_provider("cuda")
        return config

    def __call__(self, batch: np.ndarray) -> np.ndarray:
        raise TypeError("a language model is called through Generations")

    def run_named(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        raise TypeError("a language model is called through Generations")


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


@dataclass(frozen=True)
class Piece:
    """What a generation gives: new text, and at the end why it stopped ("stop", "length", or "abort" where the client
    left) and how many tokens."""

    text: str
    finish_reason: str | None = None
    completion_tokens: int = 0


class Generations:
    """Generations on one model, at most `limit` at once, each on its own thread."""

    def __init__(
        self, runtime: GenAiRuntime, tokenizer: PromptTokenizer, settings: GenerationSettings, limit: int
    ) -> None:
        self.runtime, self.tokenizer, self.settings, self.limit = runtime, tokenizer, settings, limit
        self.running = 0  # changed on the event loop only
        self.vocab_size = int(self._vocab_size())
        self._threads = ThreadPoolExecutor(limit, thread_name_prefix="handoff-generate")

    def _vocab_size(self) -> int:
        return self.tokenizer.tokenizer.get_vocab_size(with_added_tokens=True)

    def sampling_for(self, prompt_tokens: int, max_tokens: int | None, **options: Any) -> Sampling:
        """The request's sampling, its `max_tokens` checked against the context: a prompt that leaves no room, or a
        completion that would not fit, is a 400 that says so (never cut silently); unset, the rest of the context."""
        context = self.settings.context_length
        if prompt_tokens >= context:
            raise ClientError(
                f"This model's maximum context length is {context} tokens. However, your prompt is {prompt_tokens} "
                "tokens: shorten it"
            )
        if max_tokens is None:
            max_tokens = context - prompt_tokens
        elif prompt_tokens + max_tokens > context:
            raise ClientError(
                f"This model's maximum context length is {context} tokens. However, you requested "
                f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the prompt, {max_tokens} in the completion). "
                "Please reduce the length of the prompt or the completion."
            )
        return Sampling(max_tokens=max_tokens, **options)

    def reserve(self) -> None:
        """Take a generation slot, or refuse with 429 (checked before the prompt is tokenized)."""
        if self.running >= self.limit:
            raise ClientError(
                f"{self.limit} generations are running (HANDOFF_MAX_GENERATIONS); retry shortly", 429, retry_after_s=1
            )
        self.running += 1

    def release(self) -> None:
        self.running -= 1

    async def stream(self, prompt: list[int], sampling: Sampling, cancelled: threading.Event) -> AsyncIterator[Piece]:
        """The generation's text as it comes, its last piece with the finish reason (a slot taken by `reserve`)."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Piece | BaseException] = asyncio.Queue()

        def put(item: Piece | BaseException) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, item)

        work = loop.run_in_executor(self._threads, self._generate, prompt, sampling, cancelled, put)
        try:
            while True:
                item = await queue.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
                if item.finish_reason is not None:
                    break
        finally:
            cancelled.set()  # the consumer left early (a disconnect, an error): the thread stops at its next token
            await asyncio.shield(work)

    def _generate(self, prompt: list[int], sampling: Sampling, cancelled: threading.Event, put: Any) -> None:
        try:
            self._run(prompt, sampling, cancelled, put)
        except Exception as err:  # noqa: BLE001 - handed to the event loop, which answers or logs it
            put(err)

    def _run(self, prompt: list[int], sampling: Sampling, cancelled: threading.Event, put: Any) -> None:
        import onnxruntime_genai as og

        params = og.GeneratorParams(self.runtime.model)
        search: dict[str, Any] = {
            "max_length": len(prompt) + sampling.max_tokens,
            "min_length": len(prompt) + min(sampling.min_tokens, sampling.max_tokens),
        }
        if sampling.temperature == 0:
            search["do_sample"] = False
        else:
            search |= {
                "do_sample": True,
                "temperature": sampling.temperature,
                "top_p": sampling.top_p,
                "top_k": sampling.top_k or self.vocab_size,
            }
            if sampling.seed is not None:
                search["random_seed"] = sampling.seed
        params.set_search_options(**search)
        generator = og.Generator(self.runtime.model, params)
        generator.append_tokens(prompt)
        text = TextStream(self.tokenizer)
        stops = StopStrings(sampling.stop)
        tokens = 0
        while True:
            if cancelled.is_set():
                log.info("generation stopped: the client left after %d tokens", tokens)
                put(Piece("", "abort", tokens))  # vLLM's reason; whoever still waits ends
                return
            if generator.is_done():
                put(Piece(stops.flush(), "length", tokens))
                return
            generator.generate_next_token()
            token = int(generator.get_next_tokens()[0])
            tokens += 1
            if token in self.settings.eos_token_ids:
                put(Piece(stops.flush(), "stop", tokens))
                return
            ready, stopped = stops.add(text.add(token))
            if stopped:
                put(Piece(ready, "stop", tokens))
                return
            if tokens >= sampling.max_tokens:
                put(Piece(ready + stops.flush(), "length", tokens))
                return
            if ready:
                put(Piece(ready))


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
