"""Guards every serving benchmark applies before it trusts a figure."""

from __future__ import annotations

EXPECTED_PROVIDER = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}


def assert_provider(side: str, providers: list[str], device: str) -> None:
    """A silent CPU fallback must not pass for a GPU figure: every side runs where it was asked to."""
    if providers[0] != EXPECTED_PROVIDER[device]:
        raise SystemExit(
            f"{side}: ONNX Runtime runs on {providers[0]}, not {EXPECTED_PROVIDER[device]}; "
            "the comparison would not be like with like"
        )
