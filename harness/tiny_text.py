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


LANGUAGES = ("<|en|>", "<|fr|>")  # a tiny Whisper's languages
SPECIALS = (
    "<|endoftext|>",
    "<|startoftranscript|>",
    *LANGUAGES,
    "<|translate|>",
    "<|transcribe|>",
    "<|startoflm|>",
    "<|startofprev|>",
    "<|nospeech|>",
    "<|notimestamps|>",
)


def whisper_tokenizer(texts: list[str], vocab_size: int = 320) -> Any:
    """A byte-level BPE learnt from `texts`, laid out as Whisper's: the text's tokens, then the special tokens, then
    the timestamps (<|0.00|> to <|30.00|>), which `generate` finds by their place after <|notimestamps|>."""
    import transformers
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    backend.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=alphabet))
    backend.add_special_tokens([AddedToken(token, special=True) for token in SPECIALS])
    backend.add_tokens([AddedToken(f"<|{i * 0.02:.2f}|>", special=False) for i in range(1501)])
    end = "<|endoftext|>"
    return transformers.WhisperTokenizer(  # transformers 5's one Whisper tokenizer (WhisperTokenizerFast is its alias)
        tokenizer_object=backend, bos_token=end, eos_token=end, unk_token=end, pad_token=end
    )


def whisper_generation_config(tokenizer: Any, max_length: int, quiet_timestamps: bool = False) -> Any:
    """A Whisper's generation config as the fine-tuning recipe leaves it: language and task set (forced decoder ids
    cleared), the special tokens' ids, the no-speech and language-model tokens suppressed (with `quiet_timestamps`,
    the timestamps too: a model of random weights would otherwise emit them, which `generate` then reads as the end
    of a segment and decodes the rest of the window again)."""
    import transformers

    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in SPECIALS}
    end = ids["<|endoftext|>"]
    timestamps = list(range(ids["<|notimestamps|>"] + 1, len(tokenizer))) if quiet_timestamps else []
    return transformers.GenerationConfig(
        decoder_start_token_id=ids["<|startoftranscript|>"],
        eos_token_id=end,
        pad_token_id=end,
        max_length=max_length,
        is_multilingual=True,
        lang_to_id={language: ids[language] for language in LANGUAGES},
        task_to_id={"transcribe": ids["<|transcribe|>"], "translate": ids["<|translate|>"]},
        no_timestamps_token_id=ids["<|notimestamps|>"],
        prev_sot_token_id=ids["<|startofprev|>"],
        suppress_tokens=[ids["<|nospeech|>"], ids["<|startoflm|>"], *timestamps],
        begin_suppress_tokens=[end],
        language="en",
        task="transcribe",
        forced_decoder_ids=None,
    )


def whisper_config(tokenizer: Any, width: int, layers: int, heads: int, positions: int = 448) -> Any:
    """A Whisper of `width` and `layers` (encoder and decoder alike) over `tokenizer`, 80 mel bins, 30 s windows."""
    import transformers

    end = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    return transformers.WhisperConfig(
        vocab_size=len(tokenizer),
        num_mel_bins=80,
        d_model=width,
        encoder_layers=layers,
        encoder_attention_heads=heads,
        decoder_layers=layers,
        decoder_attention_heads=heads,
        encoder_ffn_dim=4 * width,
        decoder_ffn_dim=4 * width,
        max_target_positions=positions,
        pad_token_id=end,
        bos_token_id=end,
        eos_token_id=end,
        decoder_start_token_id=tokenizer.convert_tokens_to_ids("<|startoftranscript|>"),
    )
