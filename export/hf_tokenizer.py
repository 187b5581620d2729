"""A Hugging Face model's training tokenizer: read from the folder's own files, checked to be this model's, and the
settings the service tokenizes with (contract/tokenizer_spec.py), SigLIP's padding among them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from contract.tokenizer_spec import MASK, TOKENIZER_JSON, TokenizerSettings
from export.readers.hf_checkpoint import TOKENIZER_READS, check_own_files
from export.tensor_model import first_line

# What parity runs on: real sentences, short and long, so a padded batch holds rows of very different lengths.
SENTENCES = (
    "Great.",
    "The film was a delight from start to finish, and the cast was superb.",
    "I would not recommend this product to anyone.",
    "The delivery was late, the box was damaged and nobody answered my emails for a week.",
    "It works.",
    "An honest, moving and beautifully shot story about a family that keeps going when everything falls apart.",
)


def load_tokenizer(folder: Path, trust_remote_code: bool, vocab_size: int) -> Any:
    """The training tokenizer, from files that are the folder's own, checked to fit a model of `vocab_size` ids."""
    import transformers

    check_own_files(folder, TOKENIZER_READS)
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(
            folder, local_files_only=True, trust_remote_code=trust_remote_code
        )
    except (OSError, ValueError, TypeError, KeyError) as err:
        raise ValueError(f"the tokenizer in {folder} cannot be loaded: {first_line(err)}") from None
    if getattr(tokenizer, "backend_tokenizer", None) is None:
        raise ValueError(
            f"the tokenizer in {folder} is a slow (Python) tokenizer with no tokenizer.json; the service runs the "
            "tokenizers library: save it with use_fast=True"
        )
    _check_vocabulary(tokenizer, folder, vocab_size)
    return tokenizer


def _check_vocabulary(tokenizer: Any, folder: Path, vocab_size: int) -> None:
    """ValueError for a tokenizer that is not the model's: ids past its embedding, or the parity sentences' words
    mostly its unknown token (a tokenizer_config.json beside no vocabulary gives a 5-token tokenizer)."""
    if len(tokenizer) > vocab_size:
        raise ValueError(
            f"the tokenizer in {folder} has {len(tokenizer)} tokens, more than the model's {vocab_size} embeddings: "
            "it is not this model's tokenizer (--tokenizer DIR names another)"
        )
    try:
        ids = [i for text in SENTENCES for i in tokenizer(text, add_special_tokens=False)["input_ids"]]
    except Exception as err:  # noqa: BLE001 - the tokenizers library's own words (no unknown token, ...)
        raise ValueError(f"the tokenizer in {folder} cannot tokenize a sentence: {first_line(err)}") from None
    unknown = sum(i == tokenizer.unk_token_id for i in ids) if tokenizer.unk_token_id is not None else 0
    if not ids or unknown > len(ids) / 2:
        raise ValueError(
            f"the tokenizer in {folder} reads {unknown} of the {len(ids)} tokens of plain English sentences as its "
            "unknown token: its vocabulary is missing or not this model's"
        )


SIGLIP_TEXT_LENGTH = 64  # transformers' zero-shot image pipeline pads a SigLIP's texts to 64 tokens, and truncates


def tokenizer_settings(
    tokenizer: Any, config: Any, pairs: bool = False, takes_pairs: bool = False
) -> TokenizerSettings:
    """The served tokenizer's settings; a SigLIP's texts padded to the length its pipeline pads them to (its text
    tower reads the last position, so the padding is part of the answer)."""
    text_config = getattr(config, "text_config", config)  # an image-text model's text tower
    positions = getattr(text_config, "max_position_embeddings", None)
    limits = [n for n in (tokenizer.model_max_length, positions) if n]
    max_length = min(n for n in limits if n < 10**6) if any(n < 10**6 for n in limits) else 512
    siglip = "siglip" in str(getattr(config, "model_type", ""))
    if siglip:
        max_length = SIGLIP_TEXT_LENGTH
    inputs = tuple(n for n in ("input_ids", MASK, "token_type_ids") if n in tokenizer.model_input_names)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    return TokenizerSettings(
        TOKENIZER_JSON,
        max_length,
        pad_id,
        str(tokenizer.pad_token or ""),
        tokenizer.padding_side,
        inputs,
        pairs,
        takes_pairs,
        siglip,
    )
