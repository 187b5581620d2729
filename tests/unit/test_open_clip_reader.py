"""Which files name an open_clip model (export/readers/open_clip.py), what open_clip_train's params.txt says, and
open_clip's text cleaning as the service applies it (contract/tokenizer_spec.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from contract.tokenizer_spec import CLEANERS, TextTokenizer, TokenizerSettings
from export.readers.open_clip import OPEN_CLIP_CONFIG, find_open_clip, read_params

CONFIG = {"model_cfg": {"embed_dim": 8}, "preprocess_cfg": {}}


def trained_run(tmp_path: Path, **params: object) -> Path:
    """open_clip_train's layout: logs/NAME/params.txt and logs/NAME/checkpoints/epoch_1.pt."""
    run = tmp_path / "logs" / "tiny"
    (run / "checkpoints").mkdir(parents=True)
    lines = {"model": "ViT-B-32", "siglip": False, "image_mean": None, "distill": False, **params}
    (run / "params.txt").write_text("".join(f"{k}: {v}\n" for k, v in lines.items()))
    (run / "checkpoints" / "epoch_1.pt").write_bytes(b"")
    return run / "checkpoints" / "epoch_1.pt"


def test_a_model_folder_is_found_by_its_config_and_weights(tmp_path: Path):
    (tmp_path / OPEN_CLIP_CONFIG).write_text(json.dumps(CONFIG))
    with pytest.raises(ValueError, match="no weights"):
        find_open_clip(tmp_path)
    (tmp_path / "open_clip_pytorch_model.bin").write_bytes(b"")
    (tmp_path / "open_clip_model.safetensors").write_bytes(b"")
    found = find_open_clip(tmp_path)
    assert found is not None and found.weights.name == "open_clip_model.safetensors"  # open_clip's preference
    assert found.model == f"local-dir:{tmp_path.resolve()}" and found.named_by.name == OPEN_CLIP_CONFIG


def test_a_trainers_checkpoint_is_named_by_its_params(tmp_path: Path):
    found = find_open_clip(trained_run(tmp_path, force_quick_gelu=True, image_mean=(0.5, 0.5, 0.5)))
    assert found is not None and found.model == "ViT-B-32"
    assert found.settings == {"force_quick_gelu": True, "image_mean": (0.5, 0.5, 0.5)}
    assert find_open_clip(tmp_path / "elsewhere.pt") is None


@pytest.mark.parametrize(
    ("params", "words"),
    [
        ({"model": "hf-hub:timm/ViT-B-16-SigLIP"}, "nothing is downloaded"),
        ({"model": "local-dir:/nowhere"}, "no open_clip_config.json there"),
        ({"distill": True}, "trained with distill"),
        ({"lock_image": True}, "trained with lock_image"),
    ],
)
def test_what_cannot_be_read_is_refused_in_one_line(tmp_path: Path, params: dict, words: str):
    with pytest.raises(ValueError, match=words):
        find_open_clip(trained_run(tmp_path, **params))


def test_params_are_read_as_open_clip_train_wrote_them(tmp_path: Path):
    (tmp_path / "params.txt").write_text("lr: 0.001\nmodel: ViT-B-32\nimage_std: [0.5, 0.5, 0.5]\nname: 2026_12_08-x\n")
    assert read_params(tmp_path / "params.txt") == {
        "lr": 0.001,
        "model": "ViT-B-32",
        "image_std": [0.5, 0.5, 0.5],
        "name": "2026_12_08-x",
    }


def test_open_clips_cleaning_runs_before_the_tokenizer_file():
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = Tokenizer(models.WordLevel({"[UNK]": 0, "at&t": 1, "été": 2, "abc": 3}, unk_token="[UNK]"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    settings = TokenizerSettings("tokenizer.json", 8, 0, "[UNK]", "right", ("input_ids",), pad_to_max_length=True)
    raw = "AT&amp;T Ã©tÃ©  \uff21\uff22\uff23"
    assert CLEANERS["open_clip"](raw) == "at&t été abc"
    cleaned = TextTokenizer(words.to_str().encode(), settings.__class__(**{**vars(settings), "clean": "open_clip"}))
    assert cleaned.encode([raw]).rows["input_ids"].tolist() == [[1, 2, 3, 0, 0, 0, 0, 0]]
    assert TextTokenizer(words.to_str().encode(), settings).encode([raw]).rows["input_ids"][0, :3].tolist() == [0] * 3
    with pytest.raises(ValueError, match="cleans texts by 'nfkc'"):
        TextTokenizer(words.to_str().encode(), settings.__class__(**{**vars(settings), "clean": "nfkc"}))
