"""OpenAI's completions and chat completions, as vLLM's OpenAI-compatible server takes and answers them: the request
bodies checked (`parse_common`, `parse_messages`, `parse_prompt`), the answers and the server-sent events' chunks
built (`Reply`), and the error body (`{"error": {"message", "type", "param", "code"}}`).

Taken: `model` (this model's name, or left out), `max_tokens` (`max_completion_tokens` too), vLLM's `min_tokens`,
`temperature`, `top_p`, `top_k`, `seed`, `stop` (a string or up to 4, each at most 200 characters), `stream`,
`stream_options.include_usage`, vLLM's `repetition_penalty`; `n` choices (generations of the one prompt, each taking
a generation slot); `logprobs` (a chat's with `top_logprobs`, a completion's count: each generated token's
log-probability, the model's log-softmax before any sampling step); `response_format` (`text`, `json_object`,
`json_schema`: decoding constrained to the schema by ONNX Runtime GenAI's guidance, llguidance, its JSON compact).
Where a request leaves `temperature`, `top_p`, `top_k` or `repetition_penalty` out, the model's generation_config.json
gives them, as vLLM takes them from it. A parameter that would change the answer and is not implemented (tools,
`logit_bias`, ...) is a 400 that names it, never ignored.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from contract.errors import ClientError
from contract.generation import Message

ROLES = ("system", "user", "assistant", "developer")
MAX_STOPS = 4
MAX_STOP_CHARS = 200
# Fields a client may send that change nothing here (OpenAI's bookkeeping, penalties at their neutral value)
IGNORED = {"user", "metadata", "store", "service_tier", "stream_options", "model"}
NEUTRAL = {
    "frequency_penalty": 0,
    "presence_penalty": 0,
    "echo": False,
}
SAMPLING = {"max_tokens", "max_completion_tokens", "min_tokens", "temperature", "top_p", "top_k", "seed", "stop"}
SAMPLING |= {"repetition_penalty"}
MAX_REPETITION_PENALTY = 2.0
MAX_SEED = (1 << 31) - 1  # ONNX Runtime GenAI's random_seed: a larger one raised (a 500), so it is a 400 here
SAMPLING |= {"stream", "response_format", "logprobs", "top_logprobs", "n"}
MAX_LOGPROBS = 20  # the likeliest tokens a token's log-probability may come with (OpenAI's top_logprobs, vLLM's)
MAX_SCHEMA_BYTES = 32_768  # a response_format's schema, as JSON: compiled into a grammar for each request
# llguidance's JSON without whitespace between its tokens: a model that is unsure would otherwise write spaces until
# max_tokens, which JSON allows (OpenAI warns of it for JSON mode); a schema's own "x-guidance" settings win
COMPACT = {"whitespace_flexible": False}
FORMATS = '{"type": "text"}, {"type": "json_object"} or {"type": "json_schema", "json_schema": {"name", "schema"}}'
ERROR_TYPES = {400: "BadRequestError", 404: "NotFoundError", 413: "BadRequestError", 429: "RateLimitError"}


ERROR_SCHEMA = {
    "type": "object",
    "properties": {
        "error": {
            "type": "object",
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": "string", "nullable": True},
                "code": {"type": "integer"},
            },
            "required": ["message", "type", "code"],
        }
    },
    "required": ["error"],
}


def error_body(error: ClientError) -> dict[str, Any]:
    """OpenAI's (and vLLM's) error body for `error`."""
    kind = ERROR_TYPES.get(error.status, "ServiceUnavailableError" if error.status >= 500 else "BadRequestError")
    return {"error": {"message": str(error), "type": kind, "param": None, "code": error.status}}


@dataclass(frozen=True)
class Common:
    """What both endpoints take besides the prompt."""

    max_tokens: int | None
    options: dict[str, Any]
    """Sampling's other fields (serve/model/generation.py)"""
    stream: bool
    include_usage: bool
    n: int = 1
    """choices: generations of the one prompt, each a generation slot (a seed gives choice i the seed + i)"""


def _number(body: dict[str, Any], name: str, default: float, low: float, high: float) -> float:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise ClientError(f"{name}={str(value)[:20]}: must be a number between {low:g} and {high:g}")
    return float(value)


def _integer(body: dict[str, Any], name: str, low: int, high: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ClientError(f"{name}={str(value)[:20]}: must be a whole number between {low} and {high}")
    return value


def parse_common(body: Any, model_name: str, prompt_field: str, defaults: dict[str, float] | None = None) -> Common:
    """The fields both endpoints take; `defaults`: the model's own for those a request leaves out (temperature,
    top_p, top_k, repetition_penalty)."""
    defaults = defaults or {}
    if not isinstance(body, dict):
        raise ClientError("the body must be a JSON object")
    allowed = {prompt_field, *SAMPLING, *IGNORED, *NEUTRAL}
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise ClientError(f"{', '.join(unknown)}: not supported by this server (it takes {', '.join(sorted(allowed))})")
    for name, neutral in NEUTRAL.items():
        if name in body and body[name] not in (None, neutral):
            raise ClientError(f"{name}={str(body[name])[:20]}: not supported by this server (only {neutral})")
    if body.get("model") not in (None, model_name):
        raise ClientError(
            f"The model `{str(body['model'])[:100]}` does not exist; this server serves `{model_name}`", 404
        )
    stop = body.get("stop")
    stops = [stop] if isinstance(stop, str) else stop if stop is not None else []
    if not isinstance(stops, list) or len(stops) > MAX_STOPS or not all(isinstance(s, str) for s in stops):
        raise ClientError(f"stop: a string or a list of up to {MAX_STOPS} strings")
    if any(len(s) > MAX_STOP_CHARS for s in stops):  # each token's text is matched against every stop's prefixes
        raise ClientError(f"stop: each at most {MAX_STOP_CHARS} characters")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise ClientError("stream: true or false")
    stream_options = body.get("stream_options") or {}
    if not isinstance(stream_options, dict):
        raise ClientError("stream_options: an object")
    max_tokens = _integer(body, "max_tokens", 1, 1 << 20)
    max_completion = _integer(body, "max_completion_tokens", 1, 1 << 20)
    top_k = _integer(body, "top_k", -1, 1 << 20)
    options = {
        "temperature": _number(body, "temperature", defaults.get("temperature", 1.0), 0.0, 2.0),
        "top_p": _number(body, "top_p", defaults.get("top_p", 1.0), 1e-6, 1.0),
        "top_k": int(defaults.get("top_k", 0)) if top_k is None else max(0, top_k),  # -1 and 0: every token (vLLM's -1)
        "repetition_penalty": _number(
            body, "repetition_penalty", defaults.get("repetition_penalty", 1.0), 1e-6, MAX_REPETITION_PENALTY
        ),
        "seed": _integer(body, "seed", 0, MAX_SEED),
        "min_tokens": _integer(body, "min_tokens", 0, 1 << 20) or 0,  # vLLM's: eos is not chosen before
        "stop": tuple(stops),
        "guidance": parse_response_format(body.get("response_format")),
        "logprobs": parse_logprobs(body, chat=prompt_field == "messages"),
    }
    return Common(
        max_completion if max_completion is not None else max_tokens,
        options,
        stream,
        bool(stream_options.get("include_usage", False)),
        _integer(body, "n", 1, 1 << 20) or 1,
    )


def parse_logprobs(body: dict[str, Any], chat: bool) -> int | None:
    """How many of the likeliest tokens each token's log-probability comes with, None where none is asked: a chat's
    `logprobs: true` with `top_logprobs` (0 to 20), a completion's `logprobs` (0 to 20), as OpenAI takes them."""
    if not chat:
        if "top_logprobs" in body:
            raise ClientError("top_logprobs: a chat's; a completion takes logprobs (how many of the likeliest tokens)")
        return _integer(body, "logprobs", 0, MAX_LOGPROBS)
    asked, top = body.get("logprobs"), _integer(body, "top_logprobs", 0, MAX_LOGPROBS)
    if asked not in (None, True, False):
        raise ClientError("logprobs: true or false (top_logprobs says how many of the likeliest tokens)")
    if top is not None and asked is not True:
        raise ClientError("top_logprobs needs logprobs: true")
    return (top or 0) if asked else None


def parse_response_format(value: Any) -> tuple[str, str] | None:
    """OpenAI's `response_format` as ONNX Runtime GenAI's guidance (its kind, its data): None for text; JSON mode as
    the schema of any object; a JSON schema as given, its JSON compact unless it says otherwise."""
    if value is None:
        return None
    kind = value.get("type") if isinstance(value, dict) else None
    if kind not in ("text", "json_object", "json_schema"):
        raise ClientError(f"response_format: one of {FORMATS}")
    if kind == "text":
        return None
    schema: Any = {"type": "object"}
    if kind == "json_schema":
        spec = value.get("json_schema")
        schema = spec.get("schema", {}) if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise ClientError('response_format: json_schema must be {"name": ..., "schema": {a JSON schema}}')
    guided = {**schema, "x-guidance": {**COMPACT, **(schema.get("x-guidance") or {})}}
    data = orjson.dumps(guided).decode()
    if len(data) > MAX_SCHEMA_BYTES:
        raise ClientError(f"response_format: the schema takes {len(data)} bytes as JSON; at most {MAX_SCHEMA_BYTES}")
    return "json_schema", data


def parse_messages(body: dict[str, Any], context: int) -> list[Message]:
    """The chat's messages: a role and a text each (content parts of type `text` are joined, as vLLM does). More
    messages than the `context` holds tokens are refused before any is read: every template writes at least a token
    for each, and a chat of 600,000 empty ones was rendered and tokenized for 34 s (security round 5)."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ClientError('messages: a non-empty list of {"role": ..., "content": ...}')
    if len(messages) > context:
        raise ClientError(
            f"This model's maximum context length is {context} tokens. However, your chat holds {len(messages)} "
            "messages, each at least a token: shorten it"
        )
    found = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            raise ClientError(f"messages[{i}]: needs a role, one of {', '.join(ROLES)}")
        found.append({"role": message["role"], "content": _text_content(message.get("content"), i)})
    return found


def _text_content(content: Any, i: int) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content):
        if all(isinstance(p.get("text"), str) for p in content):
            return "\n".join(p["text"] for p in content)
    raise ClientError(f"messages[{i}].content: a text, or a list of text parts (this model takes text only)")


def parse_prompt(body: dict[str, Any], context: int) -> str | list[int]:
    """/v1/completions' prompt: one text, or one prompt's token ids, as many as the `context` holds at most (counted
    before they are walked: 9 million ids held the event loop 2 s, security round 5)."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and len(prompt) >= context:
        raise ClientError(
            f"This model's maximum context length is {context} tokens. However, your prompt is {len(prompt)} "
            "tokens: shorten it"
        )
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return prompt
    raise ClientError("prompt: a text, or one prompt's token ids (one prompt per request)")


# One choice's answer: its text, finish reason, tokens generated and log-probabilities (None: not asked for)
Choice = tuple[str, str, int, Sequence[Any] | None]


class Reply:
    """The answer to one request, whole or as chunks of server-sent events, in the endpoint's shape."""

    def __init__(self, chat: bool, model_name: str, prompt_tokens: int, token_text: Callable[[int], str] = str) -> None:
        self.chat, self.model, self.prompt_tokens = chat, model_name, prompt_tokens
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.token_text = token_text  # a token id's text, for log-probabilities
        self.offsets: dict[int, int] = {}  # each choice's characters so far, for its tokens' text_offset

    def usage(self, completion_tokens: int) -> dict[str, int]:
        total = self.prompt_tokens + completion_tokens
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": completion_tokens, "total_tokens": total}

    def whole(self, choices: Sequence[Choice]) -> dict[str, Any]:
        """The answer of every choice, in order, their tokens counted together."""
        answers = []
        for index, (text, finish_reason, _, logprobs) in enumerate(choices):
            choice = {"index": index, "logprobs": self.logprobs(logprobs, index), "finish_reason": finish_reason}
            choice |= {"message": {"role": "assistant", "content": text}} if self.chat else {"text": text}
            answers.append(choice)
        return {
            "id": self.id,
            "object": "chat.completion" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": answers,
            "usage": self.usage(sum(tokens for _, _, tokens, _ in choices)),
        }

    def chunk(
        self,
        text: str | None,
        finish_reason: str | None = None,
        first: bool = False,
        logprobs: Sequence[Any] | None = None,
        index: int = 0,
    ) -> bytes:
        """One event of choice `index`: new text (the chat's first carries the role), the last with its finish
        reason."""
        choice = {"index": index, "logprobs": self.logprobs(logprobs, index), "finish_reason": finish_reason}
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant"} if first else {}
            if text is not None:
                delta["content"] = text
            choice["delta"] = delta
        else:
            choice["text"] = text or ""
        return self._event({"choices": [choice]})

    def logprobs(self, scored: Sequence[Any] | None, index: int = 0) -> dict[str, Any] | None:
        """Tokens' log-probabilities (serve/model/generation.py's TokenLogprob) as OpenAI gives them: a chat's
        `content` list, a completion's `tokens`, `token_logprobs`, `top_logprobs` and `text_offset`."""
        if scored is None:
            return None
        if self.chat:
            return {"content": [self._entry(token, logprob, top) for token, logprob, top in scored]}
        tokens, offsets = [self.token_text(token) for token, _, _ in scored], []
        for text in tokens:
            offsets.append(self.offsets.get(index, 0))
            self.offsets[index] = offsets[-1] + len(text)
        return {
            "tokens": tokens,
            "token_logprobs": [logprob for _, logprob, _ in scored],
            "top_logprobs": [{self.token_text(i): value for i, value in top} for _, _, top in scored],
            "text_offset": offsets,
        }

    def _entry(self, token: int, logprob: float, top: Sequence[tuple[int, float]]) -> dict[str, Any]:
        text = self.token_text(token)
        alternatives = [
            {"token": self.token_text(i), "logprob": value, "bytes": list(self.token_text(i).encode())}
            for i, value in top
        ]
        return {"token": text, "logprob": logprob, "bytes": list(text.encode()), "top_logprobs": alternatives}

    def usage_chunk(self, completion_tokens: int) -> bytes:
        return self._event({"choices": [], "usage": self.usage(completion_tokens)})

    def _event(self, fields: dict[str, Any]) -> bytes:
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        head = {"id": self.id, "object": kind, "created": self.created, "model": self.model}
        return b"data: " + orjson.dumps(head | fields) + b"\n\n"


DONE = b"data: [DONE]\n\n"


def error_event(error: ClientError) -> bytes:
    """An error after the stream began (the status is already sent): an event with the error body, then [DONE]."""
    return b"data: " + orjson.dumps(error_body(error)) + b"\n\n" + DONE


def models_list(model_name: str, context_length: int, created: int, precision: str) -> dict[str, Any]:
    """GET /v1/models: the one model served, with vLLM's `max_model_len` and the precision of its weights (fp32,
    fp16, or int4 where it held --int4's accuracy gate)."""
    entry = {"id": model_name, "object": "model", "created": created, "owned_by": "handoff", "root": model_name}
    return {"object": "list", "data": [entry | {"max_model_len": context_length, "precision": precision}]}
