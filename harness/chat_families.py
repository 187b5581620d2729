"""The language-model families people fine-tune, as tiny models built from configs with tokenizers trained on the
spot (nothing is downloaded): each with its family's special tokens, its chat template's shape (Qwen's ChatML with
a default system message, Qwen3's thinking switch, Phi-3's role tags, Gemma's turns that refuse a system role,
Mistral's [INST], SmolLM3's ChatML with metadata), whether its tokenizer adds a beginning-of-sequence token, and
its config's own settings (tied embeddings, sliding windows, no-RoPE layers).

The templates are written here in the shape of each family's published one, trimmed of what the tests never send
(tools, multimodal content); `tests/fixtures/hf_families_trainer.py` fine-tunes each with Trainer."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

QWEN_CHATML = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
QWEN3 = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
    "{% if enable_thinking is defined and enable_thinking is false %}{{ '<think>\n\n</think>\n\n' }}{% endif %}"
    "{% endif %}"
)
PHI3 = (
    "{% for message in messages %}{{ '<|' + message['role'] + '|>\n' + message['content'] + '<|end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}"
)
GEMMA = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
    "{% endif %}{% for message in messages %}{% if message['role'] == 'assistant' %}{% set role = 'model' %}"
    "{% else %}{% set role = message['role'] %}{% endif %}"
    "{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)
MISTRAL = (
    "{{ bos_token }}{% set system = messages[0]['content'] if messages[0]['role'] == 'system' else '' %}"
    "{% for message in messages %}{% if message['role'] == 'user' %}"
    "{{ '[INST] ' + (system + '\n\n' if system and loop.last else '') + message['content'] + '[/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token }}{% endif %}{% endfor %}"
)
SMOLLM3 = (
    "{{ '<|im_start|>system\n## Metadata\n\nReasoning Mode: /no_think\n\n## Custom Instructions\n\n' }}"
    "{{ messages[0]['content'] if messages[0]['role'] == 'system' else 'You are a helpful AI assistant.' }}"
    "{{ '<|im_end|>\n' }}{% for message in messages %}{% if message['role'] != 'system' %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@dataclass(frozen=True)
class Family:
    """A family's tokenizer and config, as its published models have them (module docstring)."""

    config: str  # transformers' config class
    template: str
    eos: tuple[str, ...]  # generation_config.json's eos tokens, the turn's end first
    pad: str
    specials: tuple[str, ...]  # every special token its tokenizer knows
    bos: str | None = None  # the token its tokenizer adds before a text (None: adds none)
    settings: dict[str, Any] = field(default_factory=dict)  # the config's own, beside the tiny sizes


FAMILIES = {
    "qwen2": Family(
        "Qwen2Config",
        QWEN_CHATML,
        ("<|im_end|>", "<|endoftext|>"),
        "<|endoftext|>",
        ("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
        settings={"tie_word_embeddings": True},
    ),
    "qwen3": Family(
        "Qwen3Config",
        QWEN3,
        ("<|im_end|>", "<|endoftext|>"),
        "<|endoftext|>",
        ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"),
        settings={"head_dim": 16},
    ),
    "phi3": Family(
        "Phi3Config",
        PHI3,
        ("<|end|>", "<|endoftext|>"),
        "<|endoftext|>",
        ("<s>", "<|endoftext|>", "<|user|>", "<|assistant|>", "<|system|>", "<|end|>"),
        bos="<s>",
        settings={"original_max_position_embeddings": 256},  # as Phi-3-mini-4k's: no long-context scaling
    ),
    "gemma2": Family(
        "Gemma2Config",
        GEMMA,
        ("<end_of_turn>", "<eos>"),
        "<pad>",
        ("<bos>", "<eos>", "<pad>", "<start_of_turn>", "<end_of_turn>"),
        bos="<bos>",
        settings={"head_dim": 16, "sliding_window": 8, "query_pre_attn_scalar": 16},
    ),
    "mistral": Family(
        "MistralConfig",
        MISTRAL,
        ("</s>",),
        "</s>",
        ("<s>", "</s>", "[INST]", "[/INST]"),
        bos="<s>",
        settings={"sliding_window": None},  # as Mistral v0.3 (a window the build ignores caps the context)
    ),
    "smollm3": Family(
        "SmolLM3Config",
        SMOLLM3,
        ("<|im_end|>", "<|endoftext|>"),
        "<|endoftext|>",
        ("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
        settings={"no_rope_layer_interval": 4},
    ),
}


def family_tokenizer(family: Family, texts: list[str], vocab_size: int = 400) -> Any:
    """A byte-level BPE learnt from `texts` with the family's special tokens, bos (or none) and chat template."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(family.specials),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    backend.train_from_iterator(texts, trainer)
    if family.bos is not None:
        backend.post_processor = processors.TemplateProcessing(
            single=f"{family.bos} $A", special_tokens=[(family.bos, backend.token_to_id(family.bos))]
        )
    named = {"bos_token": family.bos} if family.bos else {}
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=family.eos[0],
        pad_token=family.pad,
        additional_special_tokens=[t for t in family.specials if t not in (family.bos, family.eos[0], family.pad)],
        model_max_length=256,
        chat_template=family.template,
        **named,
    )


def family_config(family: Family, tokenizer: Any) -> Any:
    """The family's config at a tiny size (2 layers of hidden 64; 4 where no-RoPE layers come every 4th), its ids
    the tokenizer's."""
    import transformers

    layers = 4 if "no_rope_layer_interval" in family.settings else 2
    config = getattr(transformers, family.config)(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=[tokenizer.convert_tokens_to_ids(t) for t in family.eos],
        pad_token_id=tokenizer.pad_token_id,
        **family.settings,
    )
    config.architectures = [family.config.removesuffix("Config") + "ForCausalLM"]
    return config
