"""Tokenizers trained on the spot for the tests' and benchmarks' Hugging Face models (nothing is downloaded): a
WordPiece one, the way a BERT-style model's is made (`[CLS] text [SEP]`, a pair `[CLS] a [SEP] b [SEP]` with b's
segment 1, lowercased, BERT's pre-tokenizer), and a byte-level BPE with ChatML's chat template, the way a chat
model's is made."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

BOS, EOS, PAD = "<|begin_of_text|>", "<|endoftext|>", "<|pad|>"
TURN_START, TURN_END = "<|im_start|>", "<|im_end|>"
CHATML = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def wordpiece_tokenizer(texts: list[str], vocab_size: int, max_length: int, segments: bool = False) -> Any:
    """A transformers fast tokenizer over a WordPiece vocabulary of at most `vocab_size` learnt from `texts`; with
    `segments`, giving BERT's `token_type_ids` too (a DistilBERT takes none)."""
    import transformers
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers

    backend = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    backend.normalizer = normalizers.BertNormalizer(lowercase=True)
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    backend.train_from_iterator(texts, trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=specials))
    cls, sep = backend.token_to_id("[CLS]"), backend.token_to_id("[SEP]")
    backend.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    names = {"model_input_names": ["input_ids", "token_type_ids", "attention_mask"]} if segments else {}
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        model_max_length=max_length,
        **names,
    )


def shared_wordpiece_tokenizer(
    texts: list[str], vocab_size: int, max_length: int, folder: Path, segments: bool = False
) -> Any:
    """`wordpiece_tokenizer`, made once by rank 0 of a torchrun job and read by every rank from `folder`."""
    return made_by_rank_0(lambda: wordpiece_tokenizer(texts, vocab_size, max_length, segments), folder)


def made_by_rank_0(make: Callable[[], Any], folder: Path) -> Any:
    """The tokenizer `make` gives, made by rank 0 of a torchrun job and read by every rank from `folder`: the
    tokenizers library's trainers break ties in their own hash order, so two processes can learn vocabularies of
    different sizes, and DDP then refuses embeddings whose shapes differ."""
    import transformers

    if int(os.environ.get("RANK", "0")) == 0:
        staging = folder.with_name(folder.name + ".tmp")
        make().save_pretrained(staging)
        staging.rename(folder)
    deadline = time.monotonic() + 120
    while not folder.is_dir():
        if time.monotonic() > deadline:
            raise TimeoutError(f"rank 0 wrote no tokenizer to {folder}")
        time.sleep(0.1)
    return transformers.PreTrainedTokenizerFast.from_pretrained(folder)


def trainer_arguments(out: Path, steps: int, learning_rate: float, seq2seq: bool = False, **more: Any) -> Any:
    """Trainer's arguments as the tests' fixtures train: on the CPU under torchrun's gloo, `steps` steps of 8 rows a
    process, one checkpoint at the end (checkpoint-`steps`), no reports or progress bars; Seq2SeqTrainer's with
    `seq2seq`."""
    import transformers

    kind = transformers.Seq2SeqTrainingArguments if seq2seq else transformers.TrainingArguments
    return kind(
        output_dir=str(out),
        max_steps=steps,
        save_steps=steps,
        per_device_train_batch_size=8,
        learning_rate=learning_rate,
        use_cpu=True,
        ddp_backend="gloo",
        report_to=[],
        logging_steps=10,
        disable_tqdm=True,
        **more,
    )


def bpe_chat_tokenizer(texts: list[str], vocab_size: int, max_length: int) -> Any:
    """A byte-level BPE of at most `vocab_size` learnt from `texts` that adds the beginning-of-sequence token, as
    Llama's does, with ChatML's special tokens and chat template (a turn ends with `<|im_end|>`)."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    specials = [BOS, EOS, PAD, TURN_START, TURN_END]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    backend.train_from_iterator(texts, trainer)
    backend.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, backend.token_to_id(BOS))]
    )
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=BOS,
        eos_token=TURN_END,
        pad_token=PAD,
        additional_special_tokens=[TURN_START, EOS],
        model_max_length=max_length,
        chat_template=CHATML,
    )
