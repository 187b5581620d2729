"""A language model's text handling, without a model: stop strings held back and cut as vLLM cuts them, incremental
decoding equal to decoding the whole, the chat template rendered as transformers renders it, the manifest's
settings and OpenAI's request checks."""

from __future__ import annotations

import pytest
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from contract.errors import ClientError
from contract.generation import GenerationSettings, PromptTokenizer, TemplateError, TextStream
from serve.model.generation import StopStrings
from serve.protocols.openai_api import error_body, parse_common, parse_messages, parse_prompt

CHATML = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] == 'robot' %}{{ raise_exception('no robots') }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] | trim + '<|im_end|>' + '\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
TEXTS = ["héllo wörld, naïve café", "日本語のテキスト", "emoji 🙂 and more 🙃 text", "plain words here"]


@pytest.fixture(scope="module")
def tokenizers_json() -> bytes:
    """A byte-level BPE small enough that multi-byte characters are split across tokens."""
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    specials = ["<s>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    backend.train_from_iterator(TEXTS * 3, trainer)
    return backend.to_str().encode()


def settings(template: str | None = CHATML) -> GenerationSettings:
    return GenerationSettings(4096, (2,), 0, False, template, {"bos_token": "<s>", "eos_token": "<|im_end|>"}, 2)


@pytest.mark.parametrize("text", TEXTS)
def test_incremental_decoding_gives_the_whole_text(tokenizers_json: bytes, text: str):
    served = PromptTokenizer(tokenizers_json, settings())
    ids = served.tokenizer.encode(text, add_special_tokens=False).ids
    stream = TextStream(served)
    pieces = [stream.add(token) for token in ids]
    assert "".join(pieces) == served.decode(ids) == text
    assert not any("\ufffd" in piece for piece in pieces)  # a split character waits for its other bytes


def test_a_character_cut_off_at_the_end_is_given_as_transformers_decodes_it(tokenizers_json: bytes):
    """Generation may stop inside a character (its last bytes never come): the text held back is given at the end,
    U+FFFD as the whole decode has it."""
    served = PromptTokenizer(tokenizers_json, settings())
    ids = served.tokenizer.encode("emoji 🙂", add_special_tokens=False).ids
    cut = next(n for n in range(len(ids), 0, -1) if served.decode(ids[:n]).endswith("\ufffd"))
    stream = TextStream(served)
    text = "".join(stream.add(token) for token in ids[:cut]) + stream.flush()
    assert text == served.decode(ids[:cut]) and text.endswith("\ufffd")


def test_the_template_renders_as_transformers_renders_it(tokenizers_json: bytes):
    served = PromptTokenizer(tokenizers_json, settings())
    reference = transformers.PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(tokenizers_json.decode()), bos_token="<s>", eos_token="<|im_end|>"
    )
    reference.chat_template = CHATML
    chat = [{"role": "system", "content": " be brief "}, {"role": "user", "content": "héllo"}]
    want = reference.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    assert served.render(chat) == want
    assert served.encode_chat(chat) == reference.apply_chat_template(
        chat, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    with pytest.raises(TemplateError, match="no robots"):
        served.render([{"role": "robot", "content": "x"}])
    with pytest.raises(TemplateError, match="no chat template"):
        PromptTokenizer(tokenizers_json, settings(None)).render(chat)


def test_the_manifest_settings_round_trip_and_a_changed_template_is_refused():
    entry = settings().to_manifest()
    assert GenerationSettings.from_manifest(entry) == settings()
    with pytest.raises(ValueError, match="chat_template_sha256"):
        GenerationSettings.from_manifest(entry | {"chat_template": CHATML + "{{ 'x' }}"})


@pytest.mark.parametrize(
    ("pieces", "stops", "given", "stopped"),
    [
        (["Hello", " wor", "ld"], ("world",), "Hello ", True),  # the stop string met across pieces, cut before it
        (["Hello", " wo", "nder"], ("world",), "Hello wonder", False),  # a prefix held, then given when it is not
        (["abc"], (), "abc", False),
        (["a", "b", "STOP", "c"], ("STOP", "b"), "a", True),  # the earliest stop in the text wins
    ],
)
def test_stop_strings_are_held_back_and_cut(pieces, stops, given, stopped):
    stop = StopStrings(stops)
    out, met = "", False
    for piece in pieces:
        ready, met = stop.add(piece)
        out += ready
        if met:
            break
    if not met:
        out += stop.flush()
    assert (out, met) == (given, stopped)


def test_openai_requests_are_checked_before_anything_runs():
    common = parse_common({"prompt": "x", "max_tokens": 5, "stop": "\n", "top_k": -1, "seed": 3}, "m", "prompt")
    assert common.max_tokens == 5 and common.options["stop"] == ("\n",) and common.options["top_k"] == 0
    for body, says in [
        ({"prompt": "x", "temperature": 3}, "temperature=3"),
        ({"prompt": "x", "max_tokens": 0}, "max_tokens=0"),
        ({"prompt": "x", "stop": ["a"] * 5}, "up to 4"),
        ({"prompt": "x", "stop": "a" * 201}, "at most 200 characters"),
        ({"prompt": "x", "tools": []}, "tools: not supported"),
        ({"prompt": "x", "n": 0}, "n=0: must be a whole number between 1"),
        ({"prompt": "x", "stream": "yes"}, "stream"),
        ([], "JSON object"),
    ]:
        with pytest.raises(ClientError, match=says):
            parse_common(body, "m", "prompt")
    with pytest.raises(ClientError) as wrong_model:
        parse_common({"prompt": "x", "model": "other"}, "m", "prompt")
    assert wrong_model.value.status == 404
    assert error_body(wrong_model.value)["error"]["type"] == "NotFoundError"
    parts = {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]}
    assert parse_messages(parts, 4096) == [{"role": "user", "content": "a\nb"}]
    with pytest.raises(ClientError, match="text only"):
        parse_messages({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}, 4096)
    assert parse_prompt({"prompt": [1, 2, 3]}, 4096) == [1, 2, 3] and parse_prompt({"prompt": ["one"]}, 4096) == "one"
    with pytest.raises(ClientError, match="one prompt per request"):
        parse_prompt({"prompt": ["one", "two"]}, 4096)
