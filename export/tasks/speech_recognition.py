"""A fine-tuned Whisper (`WhisperForConditionalGeneration`, as the "Fine-Tune Whisper" recipe's Seq2SeqTrainer writes
it: checkpoint-N or save_pretrained, with its processor and generation_config.json), exported as two towers
(export/towers.py): the encoder (log-mel features in, `encoder_hidden_states` out) and the decoder (token ids and the
encoder's states in, `logits` out), with the feature extractor's settings (contract/audio_features.py: `log_mel`) and
the generation config's (contract/speech.py: the prompt, suppressed tokens, lengths) in the manifest.

The reference is the library's own call: `generate` on the folder's model with its generation config, and the
processor's decode. On synthesised clips the export never trained on, the service's greedy token ids (its features,
the two ONNX towers, contract/speech.py's decoding) equal `generate`'s, up to a near-tie as for language models
(export/generation_parity.py), and its text, decoded by the served tokenizer, equals the processor's decode; how
often `pipeline("automatic-speech-recognition")`'s text is the same is counted beside them.

A generation config that asks for what the service does not do (beam search, sampling by default, a repetition
penalty, timestamps by default) is refused in one line, never served as greedy decoding without a word.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn as nn

from contract.audio_features import AudioFeatures
from contract.signature import TASK_SPEECH_RECOGNITION
from contract.speech import TASKS, SpeechSettings
from contract.tokenizer_spec import TOKENIZER_JSON
from export.audio import FEATURE_EXTRACTOR, features_check, features_of, load_extractor, parity_clips
from export.generation_parity import NEAR_TIE_TOP
from export.hf_text import hf_manifest, load_hf_text
from export.job import Job, log_loading
from export.parity import Tolerance
from export.pipeline import Check, ExportRequest, ExportTask, tolerance_of, write_tensor_export
from export.readers.hf_checkpoint import CONFIG, PROCESSOR_CONFIGS, HfCheckpoint, processor_folder
from export.reference import Reference, ServedModel, folder_is_the_model
from export.tensor_model import Example, describe
from export.towers import towers_manifest, write_towers

AUTO_CLASS = "AutoModelForSpeechSeq2Seq"
GENERATION_CONFIG = "generation_config.json"
# what a generation config may ask for that the service does not do: refused, never dropped
UNSERVED = {
    "num_beams": (1, "beam search"),
    "do_sample": (False, "sampling by default"),
    "repetition_penalty": (1.0, "a repetition penalty"),
    "no_repeat_ngram_size": (0, "a no-repeat n-gram size"),
    "return_timestamps": (False, "timestamps by default"),
}


def is_speech_recognizer(hf: HfCheckpoint) -> bool:
    """Whether transformers' speech recognition pipeline loads this architecture as a sequence-to-sequence model for
    the config's model type (Whisper's is a `*ForConditionalGeneration`, as a text-to-text model's is)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES

    return MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES.get(str(hf.config.get("model_type"))) == hf.architecture


def _heads(states: torch.Tensor, heads: int) -> torch.Tensor:
    """batch x positions x width -> batch x heads x positions x head width."""
    batch, positions, width = states.shape
    return states.reshape(batch, positions, heads, width // heads).transpose(1, 2)


def _attention(
    query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None
) -> torch.Tensor:
    """Heads' attention (the query already scaled, as Whisper scales it), back to batch x positions x width."""
    scores = query @ keys.transpose(-1, -2)
    if mask is not None:
        scores = scores + mask
    out = torch.softmax(scores, dim=-1) @ values
    return out.transpose(1, 2).reshape(query.shape[0], query.shape[2], -1)


class Encoder(nn.Module):
    """Whisper's encoder, and each decoder layer's cross-attention keys and values of its states, computed once a
    clip (the decoder, run once a token, would otherwise project the 1,500 states again at every token)."""

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_features: torch.Tensor) -> dict[str, torch.Tensor]:
        states = self.model.get_encoder()(input_features=input_features).last_hidden_state
        layers = self.model.get_decoder().layers
        heads = layers[0].encoder_attn.num_heads
        keys = torch.stack([_heads(layer.encoder_attn.k_proj(states), heads) for layer in layers], dim=1)
        values = torch.stack([_heads(layer.encoder_attn.v_proj(states), heads) for layer in layers], dim=1)
        return {"cross_keys": keys, "cross_values": values}


class Decoder(nn.Module):
    """Whisper's decoder and its output projection on token ids and the encoder's cross-attention keys and values:
    each position's logits, as the decoder computes them (self-attention causal; eval mode: no dropout)."""

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.model = model

    def forward(
        self, input_ids: torch.Tensor, cross_keys: torch.Tensor, cross_values: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        decoder = self.model.get_decoder()
        length = input_ids.shape[1]
        hidden = decoder.embed_tokens(input_ids) + decoder.embed_positions.weight[:length]
        causal = torch.full((length, length), float("-inf"), dtype=hidden.dtype).triu(1)
        for index, layer in enumerate(decoder.layers):
            own, cross = layer.self_attn, layer.encoder_attn
            residual, hidden = hidden, layer.self_attn_layer_norm(hidden)
            query = _heads(own.q_proj(hidden) * own.scaling, own.num_heads)
            keys, values = _heads(own.k_proj(hidden), own.num_heads), _heads(own.v_proj(hidden), own.num_heads)
            hidden = residual + own.out_proj(_attention(query, keys, values, causal))
            residual, hidden = hidden, layer.encoder_attn_layer_norm(hidden)
            query = _heads(cross.q_proj(hidden) * cross.scaling, cross.num_heads)
            hidden = residual + cross.out_proj(_attention(query, cross_keys[:, index], cross_values[:, index], None))
            residual, hidden = hidden, layer.final_layer_norm(hidden)
            hidden = residual + layer.fc2(layer.activation_fn(layer.fc1(hidden)))
        return {"logits": self.model.proj_out(decoder.layer_norm(hidden))}


def speech_settings(model: Any, tokenizer: Any, generation: Any, window_seconds: float) -> SpeechSettings:
    """The generation config's settings as the service decodes with them; ValueError, in one line, for a setting
    the service does not honour."""
    for name, (plain, what) in UNSERVED.items():
        value = getattr(generation, name, None)
        if value is not None and value != plain:
            raise ValueError(f"{GENERATION_CONFIG}: {name}={value!r} asks for {what}; handoff decodes greedily")
    from transformers.models.whisper.tokenization_whisper import LANGUAGES

    languages = {token.strip("<|>"): int(i) for token, i in (getattr(generation, "lang_to_id", None) or {}).items()}
    names = {LANGUAGES[code]: code for code in languages if code in LANGUAGES}
    default = getattr(generation, "language", None)
    code = None
    if default is not None:
        wanted = str(default).strip("<|>").lower()
        code = names.get(wanted, wanted)
        if code not in languages:
            raise ValueError(f"{GENERATION_CONFIG}: language {default!r} is not one of its lang_to_id")
    elif getattr(generation, "forced_decoder_ids", None):
        raise ValueError(f"{GENERATION_CONFIG}: forced_decoder_ids without a language; set language and task")
    task = getattr(generation, "task", None) or "transcribe"
    if task not in TASKS:
        raise ValueError(f"{GENERATION_CONFIG}: task {task!r}; Whisper's are {', '.join(TASKS)}")
    tasks = {name: int(i) for name, i in (getattr(generation, "task_to_id", None) or {}).items() if name in TASKS}
    return SpeechSettings(
        start=int(generation.decoder_start_token_id),
        end=int(generation.eos_token_id),
        max_length=int(generation.max_length or 448),
        positions=int(model.config.max_target_positions),
        languages=languages,
        names=names,
        tasks=tasks,
        no_timestamps=getattr(generation, "no_timestamps_token_id", None),
        previous=getattr(generation, "prev_sot_token_id", None),
        suppress=tuple(int(i) for i in generation.suppress_tokens or ()),
        begin_suppress=tuple(int(i) for i in generation.begin_suppress_tokens or ()),
        language=code,
        task=task,
        window_seconds=window_seconds,
        special=tuple(sorted(int(i) for i in tokenizer.all_special_ids)),
    )


def speech_job(request: ExportRequest) -> Job:
    import transformers

    options, hf = request.options, request.hf
    assert hf is not None  # export/tasks/__init__.py chose this task for it
    folder = processor_folder(hf, FEATURE_EXTRACTOR)
    extractor = load_extractor(folder, options.read.trust_remote_code)
    features = features_of(extractor)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder, local_files_only=True)
    loaded = load_hf_text(request, hf, AUTO_CLASS)
    model = loaded.model
    generation = (
        transformers.GenerationConfig.from_pretrained(hf.config_dir, local_files_only=True)
        if (hf.config_dir / GENERATION_CONFIG).is_file()
        else model.generation_config
    )
    window = float(extractor.chunk_length)
    settings = speech_settings(model, tokenizer, generation, window)
    clips = parity_clips(features.sampling_rate)
    rows = torch.from_numpy(np.stack([features(clip) for clip in clips[:3]]))
    encoder = _tower(request, hf, loaded, Encoder(model), Example({"input_features": rows}, keywords=True), {})
    with torch.inference_mode():
        cross = Encoder(model)(rows)
    prompt = settings.prompt(settings.language, settings.task, None)
    ids = torch.tensor([prompt + [settings.end] * 3] * len(rows))
    example = Example({"input_ids": ids, **cross}, keywords=True)
    decoder = _tower(request, hf, loaded, Decoder(model), example, {"input_ids": (1,)})
    towers = {"encoder": encoder, "decoder": decoder}
    manifest = towers_manifest(request, loaded.origin(hf), hf.architecture, towers, TASK_SPEECH_RECOGNITION)
    manifest["audio"] = features.to_manifest()
    manifest["speech"] = settings.to_manifest()
    manifest["tokenizer"] = {"file": TOKENIZER_JSON}
    manifest["hf"] = {"model_type": hf.config["model_type"], "architecture": hf.architecture, "config": CONFIG}
    reference = speech_reference(hf, model, folder, generation, features, settings, tolerance_of(options))
    manifest["reference"] = reference.to_manifest()

    def files(out: Path) -> list[str]:
        """The extractor's tables, the processor's config, the served tokenizer and the generation config."""
        (out / "audio_features.npz").write_bytes(features.tables())
        copied = [name for name in (*PROCESSOR_CONFIGS, GENERATION_CONFIG) if (folder / name).is_file()]
        for name in copied:
            shutil.copyfile(folder / name, out / name)
        backend = tokenizer.backend_tokenizer
        (out / TOKENIZER_JSON).write_text(backend.to_str())
        return ["audio_features.npz", *copied, TOKENIZER_JSON]

    assert reference.checks is not None
    checks = reference.checks

    def write(out: Path) -> int:
        return write_towers(out, manifest, towers, "speech", lambda out: checks(clips, out), files)

    kind = f"{len(settings.languages)} languages" if settings.languages else "one language"
    described = f"{hf.architecture} ({kind}, {features.sampling_rate} Hz, {window:g} s windows) with its processor"
    return Job(manifest, write, described)


def _tower(
    request: ExportRequest, hf: HfCheckpoint, loaded: Any, module: nn.Module, example: Example, dynamic: dict
) -> Job:
    """One tower as an export of its own, proved as any model is."""
    signature, wrapped = describe(module.eval(), example, dynamic)
    log_loading(loaded.src, loaded.unwrapped)
    manifest = hf_manifest(hf, signature, dynamic, loaded.src, loaded.unwrapped, loaded.provenance, request.timings)
    options = request.options

    def write(out: Path) -> int:
        formats, tol = options.write.formats, tolerance_of(options)
        return write_tensor_export(wrapped, example, dynamic, formats, request.device, tol, manifest, out, None)

    return Job(manifest, write, type(module).__name__)


def speech_reference(
    hf: HfCheckpoint,
    model: Any,
    processor_folder: Path,
    generation: Any,
    features: AudioFeatures,
    settings: SpeechSettings,
    tol: Tolerance,
) -> Reference:
    """`generate` with the folder's generation config, the processor's decode and the speech recognition pipeline,
    against the export as the service runs it (features, towers, contract/speech.py's greedy decoding, the served
    tokenizer's decode)."""
    call = (
        "WhisperForConditionalGeneration.from_pretrained(folder).generate(input_features) with generation_config.json; "
        "processor.batch_decode(ids, skip_special_tokens=True); pipeline('automatic-speech-recognition', model=folder)"
    )

    def checks(clips: list[np.ndarray], out: Path) -> list[Check]:
        import transformers
        from tokenizers import Tokenizer

        processor = transformers.AutoProcessor.from_pretrained(processor_folder, local_files_only=True)
        library = (
            transformers.AutoModelForSpeechSeq2Seq.from_pretrained(hf.config_dir, local_files_only=True).eval()
            if folder_is_the_model(hf)
            else model
        )
        extractor = processor.feature_extractor
        found: list[Check] = [features_check(extractor, features, clips, tol)]
        encoder, decoder = ServedModel(out / "encoder"), _decoder_of(out / "decoder")
        served_tokenizer = Tokenizer.from_str((out / TOKENIZER_JSON).read_text())
        pipe = transformers.pipeline(
            "automatic-speech-recognition",
            model=str(hf.config_dir) if folder_is_the_model(hf) else library,
            tokenizer=processor.tokenizer,
            feature_extractor=extractor,
            device="cpu",
        )
        worst, texts_differ, heard_alike = None, None, 0
        for index, clip in enumerate(clips):
            inputs = extractor(clip, sampling_rate=features.sampling_rate, return_tensors="pt")
            with torch.inference_mode():
                # one call's sequences (the prompt, then what it generated): generate's own tokens, before its
                # segment post-processing, which reads any token past <|notimestamps|> as a timestamp
                theirs = library.generate(
                    inputs.input_features, generation_config=generation, return_dict_in_generate=True
                ).sequences
            prompt = settings.prompt(settings.language, settings.task, None)
            cross = _outputs(encoder, {"input_features": features(clip)[None]})

            def run(ids: np.ndarray, cross: dict[str, np.ndarray] = cross) -> np.ndarray:
                return decoder(ids, {name: np.repeat(value, len(ids), axis=0) for name, value in cross.items()})

            prompt = settings.with_language(run, prompt, settings.task)
            (ours,), (logits,) = settings.decode(run, prompt, 1)
            want = [int(t) for t in theirs[0].tolist()]
            if want[: len(prompt)] != prompt:  # several calls: generate read a token as a timestamp, decoded again
                worst = worst or (
                    f"clip {index}: generate decoded the window in segments (the model gave a timestamp token, "
                    "<|notimestamps|> notwithstanding); handoff decodes one window, without timestamps"
                )
                continue
            want = [t for t in want[len(prompt) :] if t != settings.end]

            def eager(ids: list[int], given: Any = inputs.input_features) -> np.ndarray:
                with torch.inference_mode():
                    answer = library(input_features=given, decoder_input_ids=torch.tensor([ids]))
                scores = answer.logits[0, -1].double().numpy()
                scores[list(settings.suppress)] = -np.inf
                return scores

            why = _same_or_near_tie(want, ours, logits, eager, prompt)
            if why is not None and worst is None:
                worst = f"clip {index}: {why}"
                continue
            if why is None and ours == want:
                text = served_tokenizer.decode(settings.text_tokens(ours), skip_special_tokens=True).strip()
                expected = processor.batch_decode(theirs, skip_special_tokens=True)[0].strip()
                if text != expected:
                    texts_differ = f"clip {index}: {text!r} where the processor decodes {expected!r}"
                answer: Any = pipe({"raw": clip, "sampling_rate": features.sampling_rate})
                heard_alike += text == str(answer["text"]).strip()
        found.append(("generate", worst))
        found.append(("processor decode", texts_differ))
        # the pipeline calls generate with the extractor's attention mask, and its text can differ from generate's
        # where the model is near a tie: counted, not held (docs/speech.md)
        found.append((f"pipeline: same text, {heard_alike} of {len(clips)} clips", None))
        return found

    return Reference("transformers", call, checks)


def _outputs(model: ServedModel, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every output of a tower's session, by name."""
    names = [output.name for output in model.session.get_outputs()]
    return dict(zip(names, model.session.run(None, inputs), strict=True))


def _decoder_of(folder: Path) -> Any:
    session = ServedModel(folder)

    def run(ids: np.ndarray, cross: dict[str, np.ndarray]) -> np.ndarray:
        return session({"input_ids": ids.astype(np.int64), **cross})

    return run


def _same_or_near_tie(
    want: list[int], got: list[int], logits: list[np.ndarray], eager: Any, prompt: list[int]
) -> str | None:
    """None where the served tokens are `generate`'s; where they first differ, a near-tie (each side's token among
    the other's best NEAR_TIE_TOP: transformers' logits on its own tokens, the service's on its) ends the comparison
    (the two go on from different tokens); else why not."""
    for step, token in enumerate(want):
        if step >= len(got):
            return f"stopped after {len(got)} tokens where generate made {len(want)}"
        if got[step] == token:
            continue
        theirs, mine = eager(prompt + want[:step]), logits[step]
        if got[step] in np.argsort(-theirs)[:NEAR_TIE_TOP] and token in np.argsort(-mine)[:NEAR_TIE_TOP]:
            return None
        return f"step {step}: token {got[step]} where generate chose {token}, not a near-tie"
    if len(got) != len(want):
        return f"made {len(got)} tokens where generate made {len(want)}"
    return None


TASK = ExportTask(TASK_SPEECH_RECOGNITION, "Hugging Face Whisper speech recognition", speech_job)
