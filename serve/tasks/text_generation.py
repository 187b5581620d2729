"""Text generation: a causal language model's export (export/tasks/text_generation.py), served as vLLM's
OpenAI-compatible server serves it:

    GET  /v1/models                 the model, with its context length
    POST /v1/chat/completions       {"messages": [...], "max_tokens", "temperature", "top_p", "top_k", "seed", "stop",
                                    "stream", "stream_options": {"include_usage": true}} -> a chat.completion
    POST /v1/completions            {"prompt": text or token ids, ...the same} -> a text_completion

The chat is rendered by the model's chat template and tokenized by the service itself (contract/generation.py: the
ids the export proved equal to transformers'); generation runs on ONNX Runtime GenAI off the event loop
(serve/model/generation.py). `stream` answers server-sent events ending `data: [DONE]`, the finish reason on the last
text chunk. A client that disconnects stops its generation. Errors are OpenAI's body (serve/protocols/openai_api.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from contract.errors import ClientError
from contract.generation import GenerationSettings, Message, PromptTokenizer, TemplateError
from contract.manifest import Manifest
from contract.signature import TASK_TEXT_GENERATION
from serve.config import ServeConfig
from serve.http.endpoint import HANDOFF, Answer, Endpoint, Incoming
from serve.http.front_door import Receive
from serve.http.json_body import parse_json
from serve.model.generation import Piece, TokenLogprob
from serve.model.generation_engine import Generation, GenerationEngine, Generations
from serve.model.lanes import Lanes
from serve.model.runtime import Runtime
from serve.protocols.openai_api import (
    DONE,
    ERROR_SCHEMA,
    MAX_SEED,
    Choice,
    Common,
    Reply,
    error_body,
    error_event,
    models_list,
    parse_common,
    parse_messages,
    parse_prompt,
)
from serve.tasks.base import ServedTask, Serving, json_route

CHAT, COMPLETIONS, MODELS = "/v1/chat/completions", "/v1/completions", "/v1/models"
BODY_BYTES_PER_TOKEN = 64  # an empty message, `{"role": "assistant", "content": ""}, `, or a token id and its comma
BODY_SLACK = 64 * 1024  # the request's other fields: sampling, stop strings, the model's name


class TextGeneration(ServedTask):
    name = TASK_TEXT_GENERATION
    kind = "a language model"

    @classmethod
    def own_runtime(cls, config: ServeConfig, folder: Path, manifest: Manifest) -> tuple[Lanes, Runtime]:
        why = f"a language model: up to {config.max_generations} generations at once (HANDOFF_MAX_GENERATIONS)"
        engine = GenerationEngine(folder, manifest, config.device, config.max_generations)
        return Lanes(1, config.cores_per_worker(), 1, why), engine

    def __init__(self, serving: Serving) -> None:
        super().__init__(serving)
        self.settings = GenerationSettings.from_manifest(self.manifest["generation"])
        engine = serving.runtime
        assert isinstance(engine, GenerationEngine)
        self.tokenizer = PromptTokenizer(engine.tokenizer_json, self.settings)  # the bytes the engine verified
        vocab = self.tokenizer.tokenizer.get_vocab_size(with_added_tokens=True)
        self.generations = Generations(engine, self.settings, vocab, self.config.max_generations)
        # what a request leaves out, from the model's generation_config.json (max_new_tokens: Generations')
        self.request_defaults = {k: v for k, v in self.settings.request_defaults.items() if k != "max_new_tokens"}
        self.request_defaults["repetition_penalty"] = self.settings.repetition_penalty
        self.created = int(time.time())

    def endpoints(self) -> list[Endpoint]:
        """OpenAI's routes, their errors in OpenAI's body; a body is bounded by what the context can take."""
        messages = {"type": "array", "items": {"type": "object", "required": ["role", "content"]}}
        numbers = ("max_tokens", "temperature", "top_p", "top_k", "seed", "repetition_penalty")
        common = {name: {"type": "number"} for name in numbers}
        common |= {"stop": {}, "stream": {"type": "boolean"}, "model": {"type": "string"}}
        chat = {"type": "object", "properties": {"messages": messages, **common}, "required": ["messages"]}
        completion = {"type": "object", "properties": {"prompt": {}, **common}, "required": ["prompt"]}
        return [
            json_route(
                CHAT,
                "a language model's reply to a chat, as OpenAI's (and vLLM's) chat completions answer: "
                '{"messages": [...], "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "stream"}',
                self.chat,
                chat,
                max_bytes=self.max_body_bytes,
                error_body=error_body,
                error_schema=ERROR_SCHEMA,
            ),
            json_route(
                COMPLETIONS,
                "a language model's completion of a prompt, as OpenAI's (and vLLM's) completions answer: "
                '{"prompt": text or token ids, "max_tokens", ...as the chat\'s}',
                self.complete,
                completion,
                max_bytes=self.max_body_bytes,
                error_body=error_body,
                error_schema=ERROR_SCHEMA,
            ),
            Endpoint(
                "GET",
                MODELS,
                "the model served, as OpenAI's API lists models",
                HANDOFF,
                self.models,
                errors=(404, 503),
                error_body=error_body,
                error_schema=ERROR_SCHEMA,
            ),
        ]

    async def models(self, request: Incoming) -> Answer:
        """GET /v1/models."""
        precision = str(self.manifest.get("genai", {}).get("precision", "fp32"))
        return Answer(models_list(self.config.model_name, self.settings.context_length, self.created, precision))

    async def chat(self, request: Incoming) -> Answer:
        """POST /v1/chat/completions."""
        return await self._complete(True, request)

    async def complete(self, request: Incoming) -> Answer:
        """POST /v1/completions."""
        return await self._complete(False, request)

    async def _complete(self, chat: bool, request: Incoming) -> Answer:
        body = parse_json(request.body)
        common = parse_common(body, self.config.model_name, "messages" if chat else "prompt", self.request_defaults)
        context = self.settings.context_length
        if chat:
            messages = parse_messages(body, context)
            chars = sum(len(m["content"]) + len(m["role"]) for m in messages)  # what the template writes, at least
            tokenize: Callable[[], list[int]] = lambda: self._chat_ids(messages)  # noqa: E731
        else:
            prompt = parse_prompt(body, context)
            chars = len(prompt) if isinstance(prompt, str) else 0  # token ids: the context's check bounds them
            tokenize = lambda: self._prompt_ids(prompt)  # noqa: E731
        if chars > self.config.max_text_chars:  # checked before tokenizing: a 20 MB prompt costs seconds of it
            raise ClientError(f"the prompt holds {chars} characters, past HANDOFF_MAX_TEXT_CHARS", 413)
        if common.n > self.generations.limit:  # each choice is a generation: never more than the service runs
            raise ClientError(f"n={common.n}: at most {self.generations.limit} choices (HANDOFF_MAX_GENERATIONS)")
        self.generations.reserve(common.n)
        generations: list[Generation] = []
        watcher: asyncio.Task[None] | None = None
        handed_over = False  # a stream ends its generations and releases their slots when it ends
        try:
            ids = await self.serving.decoders.run(tokenize)
            sampling = self.generations.sampling_for(len(ids), common.max_tokens, **common.options)
            reply = Reply(chat, self.config.model_name, len(ids), self._token_text)
            for index in range(common.n):  # a seed: choice i samples with seed + i, so that choices differ
                seed = None if sampling.seed is None else (sampling.seed + index) % (MAX_SEED + 1)
                generations.append(self.generations.start(ids, dataclasses.replace(sampling, seed=seed)))
            watcher = asyncio.create_task(_watch_disconnect(request.receive, generations))
            if common.stream:
                handed_over = True
                return Answer(b"", "text/event-stream", stream=self._events(reply, generations, common, watcher))
            asked = sampling.logprobs is not None
            choices = await asyncio.gather(*(_whole(generation, asked) for generation in generations))
            return Answer(reply.whole(choices))
        finally:
            if not handed_over:
                if watcher is not None:
                    watcher.cancel()
                self._end(generations, common.n)

    def _end(self, generations: list[Generation], reserved: int) -> None:
        for generation in generations:
            generation.close()
        self.generations.release(reserved)

    async def _events(
        self, reply: Reply, generations: list[Generation], common: Common, watcher: asyncio.Task[None]
    ) -> AsyncIterator[bytes]:
        """The choices' chunks as each comes (the chat's first of each carries the role), the usage of them all once
        all have ended, then [DONE]."""
        asked = common.options.get("logprobs") is not None
        arrived: asyncio.Queue[tuple[int, Piece | Exception]] = asyncio.Queue()

        async def relay(index: int, generation: Generation) -> None:
            try:
                async for piece in generation.pieces():
                    await arrived.put((index, piece))
            except Exception as err:  # noqa: BLE001 - given to the stream, which ends with it
                await arrived.put((index, err))

        relays = [asyncio.create_task(relay(i, g)) for i, g in enumerate(generations)]
        try:
            if reply.chat:
                for index in range(len(generations)):
                    yield reply.chunk("", first=True, index=index)
            ended, tokens = 0, 0
            while ended < len(generations):
                index, item = await arrived.get()
                if isinstance(item, ClientError):
                    yield error_event(item)
                    return
                if isinstance(item, Exception):
                    raise item
                yield reply.chunk(item.text, item.finish_reason, logprobs=item.logprobs if asked else None, index=index)
                if item.finish_reason is not None:
                    ended, tokens = ended + 1, tokens + item.completion_tokens
            if common.include_usage:
                yield reply.usage_chunk(tokens)
            yield DONE
        finally:
            for task in relays:
                task.cancel()
            watcher.cancel()
            self._end(generations, common.n)

    def _token_text(self, token: int) -> str:
        """A token's own text, a special token's name included, as vLLM names a token in log-probabilities."""
        return str(self.tokenizer.tokenizer.decode([token], skip_special_tokens=False))

    def _chat_ids(self, messages: list[Message]) -> list[int]:
        """A chat's token ids, as transformers makes them (in a decoding thread: a template may be slow)."""
        try:
            return self.tokenizer.encode_chat(messages)
        except TemplateError as err:
            raise ClientError(str(err)) from None

    def _prompt_ids(self, prompt: str | list[int]) -> list[int]:
        """A completion prompt's token ids: a text tokenized as transformers does, or ids checked against its vocabulary
        (in a decoding thread)."""
        if isinstance(prompt, str):
            return self.tokenizer.encode_prompt(prompt)
        vocab = self.generations.vocab_size
        if any(not 0 <= token < vocab for token in prompt):
            raise ClientError(f"prompt: token ids must be between 0 and {vocab - 1}")
        return prompt

    @property
    def max_body_bytes(self) -> int:
        """The most a chat or a prompt the context can take needs as JSON: its characters (HANDOFF_MAX_TEXT_CHARS)
        escaped, 6 bytes each at most, and for each token of the context a message's fields or a token id's digits;
        a larger body is refused at the door (413) before it is read whole or parsed."""
        needed = 6 * self.config.max_text_chars + BODY_BYTES_PER_TOKEN * self.settings.context_length + BODY_SLACK
        return min(self.config.max_body_bytes, needed)

    def trouble(self) -> str | None:
        return self.generations.engine.failure

    def info(self) -> dict[str, Any]:
        return {
            "generation": {
                "context_length": self.settings.context_length,
                "eos_token_ids": list(self.settings.eos_token_ids),
                "chat_template": self.settings.chat_template is not None,
                "max_generations": self.generations.limit,
                "running": self.generations.running,
            },
            "genai": {
                key: self.manifest["genai"][key]
                for key in ("folder", "precision", "gate")
                if key in self.manifest["genai"]
            },
        }


async def _whole(generation: Generation, logprobs: bool) -> Choice:
    """One choice, whole: its text, finish reason, tokens and (where asked) log-probabilities."""
    text, scored, last = [], list[TokenLogprob](), Piece("")
    async for piece in generation.pieces():
        text.append(piece.text)
        scored.extend(piece.logprobs)
        last = piece
    assert last.finish_reason is not None
    return "".join(text), last.finish_reason, last.completion_tokens, scored if logprobs else None


async def _watch_disconnect(receive: Receive | None, generations: list[Generation]) -> None:
    """Stops the `generations` when the client leaves (the body is read: the next message is the disconnect)."""
    if receive is None:
        return
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            for generation in generations:
                generation.cancel()
            return
