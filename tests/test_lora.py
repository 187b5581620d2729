"""LoRA adapters end to end: a DistilBERT classifier's adapter trained with PEFT by Trainer under torchrun (2 gloo
processes), its checkpoint-N (adapter_config.json and adapter_model.safetensors, no config.json) exported with no
flags, merged into the base its config names, served, and answering as PEFT's model does on texts the export never
saw; --hf-config for a base named by a hub id; what is not merged yet refused in one line."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import httpx
import numpy as np
import peft
import pytest
import torch
import transformers
from conftest import Server, run
from safetensors.torch import load_file

from contract.manifest import read_manifest_unchecked, sha256_file

pytestmark = pytest.mark.xdist_group("lora")

TEXTS = ["the film was superb and moving.", "our trip was a waste of time.", "the meal was dull", "Great!"]
ATOL = 1e-4


def peft_model(run_dir: Path) -> peft.PeftModel:
    base = transformers.AutoModelForSequenceClassification.from_pretrained(run_dir / "base", local_files_only=True)
    return peft.PeftModel.from_pretrained(base, run_dir / "checkpoint-60").eval()


def logits(model, tokenizer, texts: list[str]) -> np.ndarray:
    with torch.no_grad():
        return np.stack([model(**tokenizer(t, truncation=True, return_tensors="pt")).logits[0].numpy() for t in texts])


def test_an_adapter_checkpoint_exports_with_no_flags_merged_into_its_base(lora_run: Path):
    manifest = read_manifest_unchecked(lora_run / "checkpoint-60.export")
    assert manifest["task"] == "text-classification" and manifest["status"] == "passed", manifest["parity"]["summary"]
    provenance = manifest["provenance"]
    assert provenance["pass"] and provenance["matched"] == provenance["model_tensors"] > 0, provenance
    adapter = provenance["adapter"]
    assert adapter["merged"] == 4 and adapter["tensors"] == 12 and adapter["scale"] == 2.0, adapter  # q, v x 2 layers
    assert sorted(adapter["replaced"]) == [
        "classifier.bias",
        "classifier.weight",
        "pre_classifier.bias",
        "pre_classifier.weight",
    ]
    assert adapter["sha256"] == sha256_file(lora_run / "checkpoint-60" / "adapter_model.safetensors")
    assert "LoRA adapter merged" in provenance["summary"]


def test_the_merged_weights_are_peft_merge_and_unloads(lora_run: Path):
    theirs = peft_model(lora_run).merge_and_unload().state_dict()
    ours = load_file(str(lora_run / "checkpoint-60.export" / "model.safetensors"))
    ours = {k.removeprefix("model."): v for k, v in ours.items()}
    assert set(theirs) <= set(ours), set(theirs) - set(ours)
    for name, tensor in theirs.items():
        assert torch.allclose(ours[name], tensor, atol=1e-6), name
    base = load_file(str(lora_run / "base" / "model.safetensors"))
    changed = [k for k in base if not torch.equal(base[k], ours[k])]
    assert len(changed) == 8, changed  # 4 merged weights, 4 replaced tensors of the head


def test_the_served_adapter_answers_as_peft_does_on_new_texts(lora_run: Path, tmp_path: Path):
    tokenizer = transformers.AutoTokenizer.from_pretrained(lora_run / "checkpoint-60", local_files_only=True)
    expected = logits(peft_model(lora_run), tokenizer, TEXTS)
    base_alone = transformers.AutoModelForSequenceClassification.from_pretrained(lora_run / "base").eval()
    assert np.abs(logits(base_alone, tokenizer, TEXTS) - expected).max() > 100 * ATOL  # the adapter changes answers
    with Server(tmp_path / "serve.log", HANDOFF_MODEL_DIR=str(lora_run / "checkpoint-60.export")) as server:
        server.wait_ready()
        for text, row in zip(TEXTS, expected):
            answer = httpx.post(f"{server.url}/classify", json={"text": text}, timeout=30)
            assert answer.status_code == 200, answer.text
            probabilities = {p["index"]: p["probability"] for p in answer.json()["predictions"]}
            softmax = np.exp(row - row.max()) / np.exp(row - row.max()).sum()
            assert [probabilities[i] for i in range(2)] == pytest.approx(softmax.tolist(), abs=ATOL)


def _adapter_copy(lora_run: Path, tmp_path: Path, **changes) -> Path:
    folder = tmp_path / "adapter"
    shutil.copytree(lora_run / "checkpoint-60", folder)
    config = json.loads((folder / "adapter_config.json").read_text()) | changes
    (folder / "adapter_config.json").write_text(json.dumps(config))
    return folder


def test_a_base_named_by_a_hub_id_needs_hf_config_and_then_exports(lora_run: Path, tmp_path: Path):
    folder = _adapter_copy(lora_run, tmp_path, base_model_name_or_path="someone/distilbert-base")
    refused = run([sys.executable, "-m", "export", str(folder), "--out", str(tmp_path / "a.export"), "--no-bento"])
    last = refused.stderr.strip().splitlines()[-1]
    assert refused.returncode != 0 and "--hf-config" in last and "someone/distilbert-base" in last, last
    assert not (tmp_path / "a.export").exists()
    done = run(
        [sys.executable, "-m", "export", str(folder), "--hf-config", str(lora_run / "base"), "--formats", "onnx"]
        + ["--out", str(tmp_path / "b.export"), "--no-bento"]
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert read_manifest_unchecked(tmp_path / "b.export")["provenance"]["adapter"]["merged"] == 4


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"init_lora_weights": "pissa"}, "rewrites the base"),
        ({"peft_type": "IA3"}, "IA3"),
        ({"rank_pattern": {"q_lin": 8}}, "rank_pattern"),
        ({"a_setting_of_a_later_peft": 3}, "a_setting_of_a_later_peft=3"),
    ],
)
def test_what_is_not_merged_yet_is_refused_in_one_line(lora_run: Path, tmp_path: Path, change, words):
    folder = _adapter_copy(lora_run, tmp_path, **change)
    refused = run([sys.executable, "-m", "export", str(folder), "--out", str(tmp_path / "x.export"), "--no-bento"])
    last = refused.stderr.strip().splitlines()[-1]
    assert refused.returncode != 0 and words in last, refused.stderr[-1500:]
    assert not (tmp_path / "x.export").exists()


def _tiny_base(kind: str, folder: Path) -> transformers.PreTrainedModel:
    """A tiny BERT (Linear layers, word embeddings) or GPT-2 (Conv1D layers), saved to `folder`."""
    torch.manual_seed(0)
    if kind == "bert":
        config = transformers.BertConfig(
            vocab_size=60, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32
        )
        model = transformers.BertModel(config)
    else:
        config = transformers.GPT2Config(vocab_size=60, n_embd=16, n_layer=1, n_head=2, n_positions=32)
        model = transformers.GPT2Model(config)
    model.save_pretrained(folder)
    return model


def _trained_adapter(base: transformers.PreTrainedModel, folder: Path, **settings) -> peft.PeftModel:
    """A PEFT adapter on `base` whose every trainable tensor is random (as training leaves it: B is zero at
    initialisation, DoRA's magnitude the base's norm), saved to `folder`."""
    model = peft.get_peft_model(base, peft.LoraConfig(r=4, lora_alpha=8, **settings))
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_" in name:
                parameter.copy_(parameter + 0.3 * torch.randn(parameter.shape, generator=generator))
    model.save_pretrained(folder)
    return model.eval()


@pytest.mark.parametrize(
    ("kind", "settings"),
    [
        ("bert", {"target_modules": ["query", "word_embeddings"]}),  # an embedding's pair has no .weight suffix
        ("bert", {"target_modules": ["query", "value"], "fan_in_fan_out": True}),  # PEFT ignores it on Linear
        ("bert", {"target_modules": ["query", "dense"], "use_dora": True}),
        ("bert", {"target_modules": ["word_embeddings"], "use_dora": True}),
        ("gpt2", {"target_modules": ["c_attn", "c_proj"], "fan_in_fan_out": True}),  # Conv1D: (in, out)
        ("gpt2", {"target_modules": ["c_attn"], "use_dora": True, "fan_in_fan_out": True, "use_rslora": True}),
    ],
)
def test_every_merge_equals_peft_merge_and_unload(tmp_path: Path, kind: str, settings: dict):
    from export.hf_text import build_hf_model
    from export.readers.hf_checkpoint import find_hf_checkpoint
    from export.readers.lora import read_adapter

    base = _tiny_base(kind, tmp_path / "base")
    base_state = {k: v.clone() for k, v in base.state_dict().items()}
    expected = _trained_adapter(base, tmp_path / "adapter", **settings).merge_and_unload().state_dict()
    hf = find_hf_checkpoint(tmp_path / "base", None)
    model, _, provenance = build_hf_model(
        hf, base_state, "AutoModel", False, adapter=read_adapter(tmp_path / "adapter")
    )
    ours = model.state_dict()
    changed = [name for name, tensor in expected.items() if not torch.equal(tensor, base_state[name])]
    assert changed, "the adapter changes nothing"
    for name, tensor in expected.items():
        torch.testing.assert_close(ours[name], tensor, atol=1e-5, rtol=1e-5, msg=name)
    assert provenance.complete


def test_an_activated_lora_is_refused_as_peft_refuses_to_merge_it(lora_run: Path, tmp_path: Path):
    folder = _adapter_copy(lora_run, tmp_path, alora_invocation_tokens=[5, 6])
    refused = run([sys.executable, "-m", "export", str(folder), "--out", str(tmp_path / "x.export"), "--no-bento"])
    last = refused.stderr.strip().splitlines()[-1]
    assert refused.returncode != 0 and "activated LoRA" in last, refused.stderr[-1500:]
    assert not (tmp_path / "x.export").exists()
