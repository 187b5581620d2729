"""A text classifier's serving pieces in process: padding to the longest text, the batch's token bound, and the
bodies /classify and the protocol take (serve/tasks/text_classification.py, contract/tokenizer_spec.py)."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from contract.errors import ClientError
from contract.tokenizer_spec import TokenizerSettings, pad_to_longest
from serve.model.batching import ModelBatcher
from serve.tasks.texts import PaddedSequences, text_of_body, texts_of_elements

SETTINGS = TokenizerSettings("tokenizer.json", 8, 0, "[PAD]", "right", ("input_ids", "attention_mask"))


def tokens(*ids: int) -> dict[str, np.ndarray]:
    return {"input_ids": np.array([ids], dtype=np.int64), "attention_mask": np.ones((1, len(ids)), dtype=np.int64)}


def test_texts_are_padded_to_the_longest_on_the_tokenizers_side_with_a_zero_mask():
    right = pad_to_longest([tokens(5, 6, 7), tokens(9)], SETTINGS)
    assert right["input_ids"].tolist() == [[5, 6, 7], [9, 0, 0]]
    assert right["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    left = pad_to_longest(
        [tokens(5, 6, 7), tokens(9)], TokenizerSettings(**{**SETTINGS.__dict__, "padding_side": "left", "pad_id": 3})
    )
    assert left["input_ids"].tolist() == [[5, 6, 7], [3, 3, 9]] and left["attention_mask"].tolist()[1] == [0, 0, 1]


def test_a_batch_holds_at_most_the_token_bound():
    shape = PaddedSequences(SETTINGS, max_tokens=12)
    assert shape.key(tokens(1)) == shape.key(tokens(1, 2, 3, 4)), "any lengths share a batch"
    assert shape.fits([tokens(1, 2, 3)], tokens(4, 5, 6))  # 2 x 3 tokens
    assert not shape.fits([tokens(1, 2, 3), tokens(1)], tokens(*range(5)))  # 3 x 5 = 15 > 12


def lengths_batched(*lengths: int) -> tuple[list[float], list[tuple[int, int]]]:
    """Requests of these lengths sent at once: each one's answer (its own length, as the model counts it from the
    mask) and the shape of every model call."""
    seen = []
    release = threading.Event()

    def model(rows):
        seen.append(rows["input_ids"].shape)
        if len(seen) == 1:
            release.wait(10)  # the first request holds the model until the others have all queued
        return {"logits": rows["attention_mask"].sum(1, keepdims=True).astype(np.float32)}

    async def at_once():
        batcher = ModelBatcher(model, 8, 10_000, shape=PaddedSequences(SETTINGS))
        first = asyncio.ensure_future(batcher(tokens(1)))
        while not seen:
            await asyncio.sleep(0.001)
        queued = [asyncio.ensure_future(batcher(tokens(*range(1, n + 1)))) for n in lengths]
        while len(batcher.queue) < len(lengths):
            await asyncio.sleep(0.001)
        release.set()
        await first
        return await asyncio.gather(*queued)

    answers = asyncio.run(at_once())
    return [a["logits"].item() for a in answers], seen[1:]


def test_the_batcher_pads_texts_of_near_lengths_into_one_call_and_splits_the_answers():
    answers, calls = lengths_batched(7, 8, 6)
    assert answers == [7.0, 8.0, 6.0], "each row's own length"
    assert calls == [(3, 8)], "three near lengths, one call padded to the longest"


def test_a_batch_of_far_apart_lengths_runs_as_calls_of_like_lengths():
    answers, calls = lengths_batched(1, 8, 2, 7)
    assert answers == [1.0, 8.0, 2.0, 7.0], "answers in the callers' order"
    # padded to 8, the 1- and 2-token texts would make the call's tokens 32 for 18 real ones
    assert calls == [(1, 1), (1, 2), (2, 8)]
    assert PaddedSequences(SETTINGS).groups([tokens(*range(n)) for n in (5, 1, 6)]) == [[1], [0, 2]]


@pytest.mark.parametrize(
    "body, kind, error",
    [
        (b'{"text": ""}', "application/json", "empty"),
        (b'{"text": ["a"]}', "application/json", "must be a string"),
        (b'{"text": "a", "extra": 1}', "application/json", "expected a JSON object"),
        (b"[1, 2]", "application/json", "expected a JSON object"),
        (b"{", "application/json", "not valid JSON"),
        (b"\xc3\x28", "text/plain", "UTF-8"),
        (b"   ", "text/plain", "empty"),
    ],
)
def test_a_bad_body_is_refused_with_what_is_wrong(body, kind, error):
    with pytest.raises(ClientError, match=error) as refused:
        text_of_body(body, kind, 100, {"top_k": "K"})
    assert refused.value.status == 400


def test_a_long_text_is_413_and_good_ones_pass():
    with pytest.raises(ClientError) as refused:
        text_of_body(b"x" * 101, "text/plain", 100, {"top_k": "K"})
    assert refused.value.status == 413
    assert text_of_body(b'{"text": "caf\\u00e9", "top_k": 2}', "application/json", 100, {"top_k": "K"}) == (
        "café",
        {"top_k": 2},
    )
    assert texts_of_elements(["naïve".encode(), b"ok"], 100) == ["naïve", "ok"]
    with pytest.raises(ClientError, match=r"text\[1\] is not valid UTF-8"):
        texts_of_elements([b"ok", b"\xff"], 100)


@pytest.mark.parametrize("kind", ["sentences", "long words", "lines"])
def test_a_long_text_is_tokenized_only_as_far_as_the_model_reads_and_gives_the_same_ids(kind):
    """Security round 4, item 3: a text was tokenized whole before it was truncated (100,000 characters of 99-letter
    words: ~1 s of CPU each). Now only a prefix a few times the model's maximum is tokenized, and its ids, truncated,
    are exactly the whole text's, the truncated flag included."""
    from tokenizers import Tokenizer

    from contract.tokenizer_spec import CHARS_PER_TOKEN, TextTokenizer
    from harness.tiny_text import wordpiece_tokenizer

    words = ["the film was superb", "our trip was dull and slow", "a joy to watch"]
    backend = wordpiece_tokenizer(words, vocab_size=80, max_length=32).backend_tokenizer
    settings = TokenizerSettings("tokenizer.json", 32, 0, "[PAD]", "right", ("input_ids", "attention_mask"))
    served = TextTokenizer(backend.to_str().encode(), settings)
    rng = np.random.default_rng(0)
    if kind == "sentences":
        text = " ".join(rng.choice(words, 5000))
    elif kind == "long words":
        text = " ".join("".join(rng.choice(list("abcdefghij"), 99)) for _ in range(1000))  # 100,000 characters
    else:
        text = "\n".join(rng.choice(words, 5000))
    whole = Tokenizer.from_str(backend.to_str())
    whole.enable_truncation(32)  # the whole text tokenized, then truncated to the model's maximum
    assert served.encode([text]).rows["input_ids"][0].tolist() == whole.encode(text).ids
    assert served.encode([text]).truncated == [True]
    read, _ = served._enough_of(text)
    assert len(read) <= 16 * CHARS_PER_TOKEN * settings.max_length < len(text) // 10  # at most the third prefix
    short = "the film was superb"
    assert served._enough_of(short) == (short, None) and served.encode([short]).truncated == [False]


@pytest.mark.parametrize("max_length", [32, 33])  # the pair's budget odd (32 - 3) and even
def test_pairs_are_truncated_longest_first_as_transformers_truncates_them(max_length):
    """A pair model's texts: each tokenized only as far as the model reads, except when both overflow an odd
    budget, where the longer in full takes the odd token; ids, segments and the truncated flag equal transformers'
    for every mix of short and long, the longer first and second, and two of the same length."""
    from contract.tokenizer_spec import TextTokenizer
    from harness.tiny_text import wordpiece_tokenizer

    words = ["the film was superb", "our trip was dull and slow", "a joy to watch"]
    tokenizer = wordpiece_tokenizer(words, vocab_size=80, max_length=max_length)
    inputs = ("input_ids", "attention_mask", "token_type_ids")
    settings = TokenizerSettings("tokenizer.json", max_length, 0, "[PAD]", "right", inputs, pairs=True)
    served = TextTokenizer(tokenizer.backend_tokenizer.to_str().encode(), settings)
    rng = np.random.default_rng(1)
    lengths = [1, 3, 14, 15, 16, 40, 41, 300, 301]
    texts = [" ".join(rng.choice(words, n)) for n in lengths]
    pairs = [(a, b) for a in texts for b in texts]
    encoded = served.encode_pairs(pairs)
    for row, (a, b) in enumerate(pairs):
        theirs = tokenizer(a, b, truncation=True, max_length=max_length, return_token_type_ids=True)
        ours = {
            name: values[row][encoded.rows["attention_mask"][row] == 1].tolist()
            for name, values in encoded.rows.items()
        }
        assert ours["input_ids"] == theirs["input_ids"], (len(a), len(b))
        assert ours["token_type_ids"] == theirs["token_type_ids"]
        whole = len(tokenizer(a, b)["input_ids"])
        assert encoded.truncated[row] == (whole > max_length)


def test_a_long_query_against_many_texts_is_tokenized_whole_once():
    """/rerank's amplification (a long query beside each of many long texts, an odd budget): the query's whole text
    is tokenized once per call, not once a text; the answers stay transformers' (the test above)."""
    from contract.tokenizer_spec import TextTokenizer
    from harness.tiny_text import wordpiece_tokenizer

    words = ["the film was superb", "our trip was dull and slow", "a joy to watch"]
    tokenizer = wordpiece_tokenizer(words, vocab_size=80, max_length=32)
    inputs = ("input_ids", "attention_mask", "token_type_ids")
    settings = TokenizerSettings("tokenizer.json", 32, 0, "[PAD]", "right", inputs, pairs=True)
    served = TextTokenizer(tokenizer.backend_tokenizer.to_str().encode(), settings)
    query, texts = " ".join(words * 400), [" ".join(words[i % 3 :] * 60) for i in range(12)]

    class Counting:
        def __init__(self, inner):
            self.inner, self.whole_query = inner, 0

        def encode_batch(self, texts, **options):
            self.whole_query += texts == [query]
            return self.inner.encode_batch(texts, **options)

    served.untruncated = counting = Counting(served.untruncated)
    encoded = served.encode_pairs([(query, text) for text in texts])
    assert counting.whole_query == 1 and all(encoded.truncated)
    for row, text in enumerate(texts[:3]):
        theirs = tokenizer(query, text, truncation=True, max_length=32)["input_ids"]
        assert encoded.rows["input_ids"][row].tolist() == theirs
