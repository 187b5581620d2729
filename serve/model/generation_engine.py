"""The generation engine: a process of its own that holds the language model (ONNX Runtime GenAI holds the GIL while
it computes, serve/model/generation.py), and the serving process's side of it.

    serving process (event loop)                              engine process
    Generations.start -> ("start", id, prompt ids, sampling) ->  a thread per generation: generate()
    Generation.pieces <- a reader thread <- [("piece", id, text, finish reason, tokens), ...] (what waited, at once)
    Generation.cancel -> ("cancel", id)                      ->  its generation ends at its next token

The engine is started with `spawn` (a fork would copy the serving process's threads' locks) and loads the model from
a private copy of the verified files, which is removed once it has. It ends when the serving process closes the
pipe, or dies. At most HANDOFF_MAX_GENERATIONS run at once; one more is refused at once (429) rather than queued.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import sys
import threading
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from contract.errors import ClientError
from contract.generation import GENAI_MODEL, TOKENIZER, GenerationSettings, PromptTokenizer
from contract.manifest import Manifest, read_artifact
from serve.model.generation import Piece, Sampling, generate, open_model, verified_copy

log = logging.getLogger("bentoml.handoff")
LOAD_TIMEOUT_S = 600


class GenerationEngine:
    """The serving process's handle on the engine process (the service's runtime for a language model)."""

    name = "onnxruntime-genai"
    artifact = GENAI_MODEL

    def __init__(self, folder: Path, manifest: Manifest, device: str, limit: int) -> None:
        context = multiprocessing.get_context("spawn")
        self.conn, theirs = context.Pipe()
        self.tokenizer_json = tokenizer_json = read_artifact(folder, manifest, TOKENIZER)  # the task's too
        # generations asked for (written here only) and past their first token (written by the engine only): while
        # the first is ahead, running generations let a new one have the GIL between their tokens
        self.asked, past_first = context.Value("q", 0, lock=False), context.Value("q", 0, lock=False)
        with verified_copy(folder, manifest, keep_config=True) as private:
            counters = (self.asked, past_first)
            arguments = (theirs, str(private), device, tokenizer_json, manifest["generation"], limit, counters)
            self.process = context.Process(target=engine_main, args=arguments, name="handoff-generation", daemon=True)
            self.process.start()
            theirs.close()
            if not self.conn.poll(LOAD_TIMEOUT_S):
                self.process.kill()
                raise RuntimeError(f"the generation engine did not load the model in {LOAD_TIMEOUT_S} s")
            try:
                kind, detail = self.conn.recv()
            except EOFError:
                raise RuntimeError(
                    f"the generation engine ended while loading (exit {self.process.exitcode})"
                ) from None
        if kind != "ready":
            raise RuntimeError(f"the generation engine cannot load the model: {detail}")
        self.device = detail
        self.provider = "CUDAExecutionProvider" if detail == "cuda" else "CPUExecutionProvider"
        self.failure: str | None = None
        self._targets: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Queue[Any]]] = {}
        self._next_id = 0
        self._send_lock = threading.Lock()
        threading.Thread(target=self._read, name="handoff-generation-reader", daemon=True).start()

    def __call__(self, batch: np.ndarray) -> np.ndarray:
        raise TypeError("a language model is called through Generations")

    def run_named(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        raise TypeError("a language model is called through Generations")

    def _send(self, *message: Any) -> None:
        with self._send_lock:
            self.conn.send(message)

    def _read(self) -> None:
        """The engine's messages, a batch at a time: a generation's pieces in one batch become one piece (its texts
        joined), handed to its queue on its event loop."""
        while True:
            try:
                batch = self.conn.recv()
            except (EOFError, OSError):
                break
            for ident, item in merged(batch).items():
                target = self._targets.get(ident)
                if target is not None:
                    target[0].call_soon_threadsafe(target[1].put_nowait, item)
        self.failure = f"the generation engine's process ended (exit {self.process.exitcode})"
        log.error("%s: restart the service", self.failure)
        for loop, waiting in list(self._targets.values()):
            loop.call_soon_threadsafe(waiting.put_nowait, ClientError(self.failure, 503))

    def start(self, prompt: list[int], sampling: Sampling) -> Generation:
        if self.failure is not None:
            raise ClientError(f"{self.failure}; the service must be restarted", 503)
        ident, self._next_id = self._next_id, self._next_id + 1
        queue: asyncio.Queue[Any] = asyncio.Queue()
        self._targets[ident] = (asyncio.get_running_loop(), queue)
        self.asked.value += 1
        self._send("start", ident, prompt, asdict(sampling))
        return Generation(self, ident, queue)

    def cancel(self, ident: int) -> None:
        try:
            self._send("cancel", ident)
        except OSError:
            pass  # the engine is gone: nothing to stop

    def forget(self, ident: int) -> None:
        self._targets.pop(ident, None)


def merged(batch: list[tuple[Any, ...]]) -> dict[int, Piece | BaseException]:
    """A batch of the engine's messages as one item per generation, in order: its pieces joined (a piece that
    ends it ends the joined one), or its error."""
    items: dict[int, Piece | BaseException] = {}
    for kind, ident, *rest in batch:
        before = items.get(ident)
        if kind == "refused":
            items[ident] = ClientError(rest[0])
        elif kind != "piece":
            items[ident] = RuntimeError(f"the generation failed: {rest[0]}")
        elif isinstance(before, Piece):
            items[ident] = Piece(before.text + rest[0], rest[1], rest[2], before.logprobs + rest[3])
        elif before is None:
            items[ident] = Piece(*rest)
    return items


class Generation:
    """One generation in the engine: its pieces as they come, and a way to stop it."""

    def __init__(self, engine: GenerationEngine, ident: int, queue: asyncio.Queue[Any]) -> None:
        self.engine, self.ident, self.queue = engine, ident, queue
        self.finished = False

    async def pieces(self) -> AsyncIterator[Piece]:
        try:
            while not self.finished:
                item = await self.queue.get()
                if isinstance(item, BaseException):
                    self.finished = True
                    raise item
                self.finished = item.finish_reason is not None
                yield item
        finally:
            self.close()

    def cancel(self) -> None:
        """Stop it (a client that left): the engine ends it at its next token."""
        if not self.finished:
            self.engine.cancel(self.ident)

    def close(self) -> None:
        self.cancel()
        self.engine.forget(self.ident)


class Generations:
    """The task's side: the slots, the requests' checks against the context, and generations started on the engine."""

    def __init__(self, engine: GenerationEngine, settings: GenerationSettings, vocab_size: int, limit: int) -> None:
        self.engine, self.settings, self.vocab_size, self.limit = engine, settings, vocab_size, limit
        self.running = 0  # changed on the event loop only

    def sampling_for(self, prompt_tokens: int, max_tokens: int | None, **options: Any) -> Sampling:
        """The request's sampling, its `max_tokens` checked against the context: a prompt that leaves no room, or a
        completion that would not fit, is a 400 that says so (never cut silently); unset, the rest of the context."""
        context = self.settings.context_length
        if prompt_tokens >= context:
            raise ClientError(
                f"This model's maximum context length is {context} tokens. However, your prompt is {prompt_tokens} "
                "tokens: shorten it"
            )
        if max_tokens is None:  # generation_config.json's max_new_tokens, else the rest of the context (vLLM's)
            max_tokens = min(
                int(self.settings.request_defaults.get("max_new_tokens", context)), context - prompt_tokens
            )
        elif prompt_tokens + max_tokens > context:
            raise ClientError(
                f"This model's maximum context length is {context} tokens. However, you requested "
                f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the prompt, {max_tokens} in the completion). "
                "Please reduce the length of the prompt or the completion."
            )
        return Sampling(max_tokens=max_tokens, **options)

    def reserve(self, count: int = 1) -> None:
        """Take `count` generation slots (a request's choices), or refuse with 429 (checked before the prompt is
        tokenized)."""
        if self.running + count > self.limit:
            raise ClientError(
                f"{self.limit} generations are running (HANDOFF_MAX_GENERATIONS); retry shortly", 429, retry_after_s=1
            )
        self.running += count

    def release(self, count: int = 1) -> None:
        self.running -= count

    def start(self, prompt: list[int], sampling: Sampling) -> Generation:
        return self.engine.start(prompt, sampling)


def engine_main(
    conn: Any, private: str, device: str, tokenizer_json: bytes, entry: dict[str, Any], limit: int, counters: Any
) -> None:
    """The engine process: load the model, then run each generation asked for on a thread of its own."""
    asked, past_first = counters
    counting = threading.Lock()
    handler = logging.StreamHandler(sys.stderr)  # the serving process's log, which `bentoml serve` shows
    handler.setFormatter(logging.Formatter("%(asctime)s [%(levelname)s] [generation] %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        model, where = open_model(Path(private), device)
    except Exception as err:  # noqa: BLE001 - said to the serving process, which reports it as not ready
        conn.send(("failed", f"{type(err).__name__}: {str(err).splitlines()[0]}"))
        return
    conn.send(("ready", where))
    settings = GenerationSettings.from_manifest(entry)
    tokenizer = PromptTokenizer(tokenizer_json, settings)
    running: dict[int, threading.Event] = {}
    waiting: list[tuple[Any, ...]] = []
    waiting_lock, sending = threading.Lock(), threading.Lock()

    def send(*message: Any) -> None:
        """Everything waiting, in one pipe write, by whichever generation thread finds the pipe free: when many
        run, one write carries a token of each (and the serving process wakes once for them); when one runs, each
        token goes at once. No thread of its own: one would wait for the GIL behind the generations."""
        with waiting_lock:
            waiting.append(message)
        while waiting and sending.acquire(blocking=False):
            try:
                with waiting_lock:
                    batch = waiting[:]
                    waiting.clear()
                if batch:
                    conn.send(batch)
            finally:
                sending.release()  # then `waiting` is looked at again: what came meanwhile is not left behind

    def let_a_new_one_start() -> None:
        """The GIL let go between tokens while a generation asked for has not given its first token (ONNX Runtime
        GenAI keeps the GIL while it computes, and a thread that waits for it is not first in line): its start is
        not queued behind every running generation's tokens. Otherwise the running ones keep it."""
        if asked.value > past_first.value:
            time.sleep(0)

    def run(ident: int, prompt: list[int], sampling: Sampling, cancelled: threading.Event) -> None:
        first = True

        def past_its_first() -> None:
            nonlocal first
            if first:
                first = False
                with counting:
                    past_first.value += 1

        def put(piece: Piece) -> None:
            past_its_first()
            send("piece", ident, piece.text, piece.finish_reason, piece.completion_tokens, piece.logprobs)

        try:
            generate(model, tokenizer, settings.eos_token_ids, prompt, sampling, cancelled, put, let_a_new_one_start)
        except ClientError as err:  # the request's own fault (a schema llguidance refuses): a 400
            send("refused", ident, str(err))
        except Exception as err:  # noqa: BLE001 - the request's error, not the engine's end
            log.exception("generation %d failed", ident)
            send("error", ident, f"{type(err).__name__}: {err}")
        finally:
            past_its_first()
            running.pop(ident, None)

    with ThreadPoolExecutor(limit, thread_name_prefix="handoff-generate") as pool:
        while True:
            try:
                kind, ident, *rest = conn.recv()
            except (EOFError, OSError):
                break  # the serving process is gone
            if kind == "start":
                running[ident] = threading.Event()
                pool.submit(run, ident, rest[0], Sampling(**rest[1]), running[ident])
            elif kind == "cancel" and ident in running:
                running[ident].set()
        for cancelled in list(running.values()):
            cancelled.set()
