"""A language model's prompt side, as the service runs it and the export proves it: the manifest's `generation`
settings, the chat template rendered as transformers renders it, and the tokenizer (the `tokenizers` library, no
transformers or torch).

Two rules come from transformers and vLLM, and the export checks both against transformers on its prompts:
- a chat is rendered by the template (which writes the beginning-of-sequence token itself where the model wants one)
  and then tokenized without special tokens (`apply_chat_template`'s `add_special_tokens=False`);
- a plain completion prompt is tokenized with them: the tokenizer's post-processor adds bos where it does.
ONNX Runtime GenAI's own tokenizer drops the bos that the real tokenizer adds, so the service never uses it: it
hands the generator these ids.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from typing import Any

from tokenizers import Tokenizer

HF_FOLDER, GENAI_FOLDER = "hf", "genai"  # a language model's export: its consolidated folder and its GenAI model
GENAI_INT4_FOLDER = "genai-int4"  # with --int4: the int4 GenAI model, served where it held the accuracy gate
TOKENIZER = f"{HF_FOLDER}/tokenizer.json"  # the served tokenizer, as the manifest lists it
GENAI_MODEL = f"{GENAI_FOLDER}/model.onnx"
Message = dict[str, Any]  # {"role": ..., "content": ...}, as OpenAI's chat API and transformers take them
GENERATION_TEMPLATE_SCRATCH = "Done."  # an assistant's reply whose end shows the token that ends a turn


class TemplateError(ValueError):
    """The chat template refused the conversation (its `raise_exception`), or could not render it."""


@dataclass(frozen=True)
class GenerationSettings:
    """The manifest's `generation`: what the service needs besides the model to answer as transformers would."""

    context_length: int
    """prompt and completion together, in tokens"""
    eos_token_ids: tuple[int, ...]
    bos_token_id: int | None
    adds_bos: bool
    """the tokenizer adds bos to a plain prompt"""
    chat_template: str | None
    template_tokens: dict[str, str] = field(default_factory=dict)
    """the special tokens a template may name (bos_token, eos_token, ...), as transformers passes them"""
    turn_end_token_id: int | None = None
    """the token that ends an assistant's turn in the template (one of the eos ids: the export checks it)"""
    repetition_penalty: float = 1.0
    """generation_config.json's, applied to every generation unless a request gives its own (vLLM's field)"""
    request_defaults: dict[str, float] = field(default_factory=dict)
    """generation_config.json's temperature, top_p, top_k, max_new_tokens: what a request that leaves them out gets"""

    def to_manifest(self) -> dict[str, Any]:
        return {
            "context_length": self.context_length,
            "eos_token_ids": list(self.eos_token_ids),
            "bos_token_id": self.bos_token_id,
            "adds_bos": self.adds_bos,
            "chat_template": self.chat_template,
            "chat_template_sha256": template_sha256(self.chat_template),
            "template_tokens": self.template_tokens,
            "turn_end_token_id": self.turn_end_token_id,
            "repetition_penalty": self.repetition_penalty,
            "request_defaults": self.request_defaults,
        }

    @classmethod
    def from_manifest(cls, entry: dict[str, Any]) -> GenerationSettings:
        template = entry.get("chat_template")
        if template_sha256(template) != entry.get("chat_template_sha256"):
            raise ValueError("generation.chat_template does not match its chat_template_sha256")
        return cls(
            int(entry["context_length"]),
            tuple(int(i) for i in entry["eos_token_ids"]),
            None if entry.get("bos_token_id") is None else int(entry["bos_token_id"]),
            bool(entry["adds_bos"]),
            template,
            {str(k): str(v) for k, v in (entry.get("template_tokens") or {}).items()},
            None if entry.get("turn_end_token_id") is None else int(entry["turn_end_token_id"]),
            float(entry.get("repetition_penalty", 1.0)),
            {str(k): float(v) for k, v in (entry.get("request_defaults") or {}).items()},
        )


def template_sha256(template: str | None) -> str | None:
    return None if template is None else hashlib.sha256(template.encode()).hexdigest()


class PromptTokenizer:
    """Chats and prompts to token ids, and ids back to text, as transformers does for this model."""

    def __init__(self, tokenizer_json: bytes, settings: GenerationSettings) -> None:
        self.tokenizer = Tokenizer.from_str(tokenizer_json.decode())
        self.tokenizer.no_padding()
        self.tokenizer.no_truncation()  # a prompt past the context is refused, never cut (the caller checks)
        self.settings = settings

    @cached_property
    def _template(self) -> Any:
        import jinja2
        import jinja2.ext
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message: str) -> None:
            raise TemplateError(message)

        def tojson(
            x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None, sort_keys: bool = False
        ) -> str:
            return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

        # transformers' environment: a sandbox, blocks trimmed, loop controls, its two globals and its tojson
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
        env.filters["tojson"] = tojson
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        assert self.settings.chat_template is not None
        return env.from_string(self.settings.chat_template)

    def render(self, messages: list[Message], add_generation_prompt: bool = True) -> str:
        """The conversation as the template writes it; TemplateError where the template refuses it."""
        if self.settings.chat_template is None:
            raise TemplateError("this model's tokenizer has no chat template")
        import jinja2

        try:
            return str(
                self._template.render(
                    messages=messages,
                    tools=None,
                    documents=None,
                    add_generation_prompt=add_generation_prompt,
                    **self.settings.template_tokens,
                )
            )
        except TemplateError:
            raise
        except jinja2.exceptions.TemplateError as err:
            raise TemplateError(f"the chat template cannot render this conversation: {err}") from None

    def encode_chat(self, messages: list[Message], add_generation_prompt: bool = True) -> list[int]:
        return self._encode(self.render(messages, add_generation_prompt), add_special_tokens=False)

    def encode_prompt(self, text: str) -> list[int]:
        return self._encode(text, add_special_tokens=True)

    def _encode(self, text: str, add_special_tokens: bool) -> list[int]:
        """Through `encode_batch`, which lets Python's GIL go while it works (`encode` holds it: the service's event
        loop would wait for a long text's whole tokenization in its decoding thread)."""
        return list(self.tokenizer.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)


class TextStream:
    """Token ids in, text out as it becomes whole (text-generation-inference's incremental decoding): each step
    decodes a window that starts a token or more before the new ones, so a decoder that drops a leading space at
    the start of what it decodes (SentencePiece's) drops it inside the window, and a byte-level token that ends
    inside a character (decoded as U+FFFD until the rest arrive) waits for them."""

    def __init__(self, tokenizer: PromptTokenizer) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.prefix = 0  # where the window starts
        self.read = 0  # ids up to here have been given as text

    def add(self, token: int) -> str:
        self.ids.append(token)
        before = self.tokenizer.decode(self.ids[self.prefix : self.read])
        now = self.tokenizer.decode(self.ids[self.prefix :])
        if len(now) <= len(before) or now.endswith("\ufffd"):
            return ""
        self.prefix, self.read = self.read, len(self.ids)
        return now[len(before) :]

    def flush(self) -> str:
        """What is still held at the end (a character whose bytes never all came: U+FFFD, as transformers decodes
        it)."""
        before = self.tokenizer.decode(self.ids[self.prefix : self.read])
        rest = self.tokenizer.decode(self.ids[self.prefix :])[len(before) :]
        self.prefix = self.read = len(self.ids)
        return rest
