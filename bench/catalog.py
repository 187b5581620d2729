"""The lasting benchmarks: what each answers, how `make bench` runs it and which of its ratios a reader looks at
first. `python -m bench` runs them by these names (bench/__main__.py); the docs' results page lists them in this
order (bench/report.py)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Benchmark:
    name: str
    """The name `python -m bench NAME` takes, its module's (bench/NAME.py) and its result file's."""
    answers: str
    """The question it answers, in one line."""
    make_bench: tuple[str, ...]
    """The arguments `make bench` (`python -m bench all`) gives it: a full run (about 90 minutes for all, 2 cores)."""
    headline: tuple[str, ...]
    """The ratios a reader compares first (keys of its result's `ratios`)."""


BENCHMARKS = (
    Benchmark(
        "serve_throughput",
        "served images/s against the in-process limit and BentoML, Starlette and LitServe peers (resnet18, 224 px)",
        ("--seconds", "8", "--rounds", "3"),
        ("ours_raw_body_over_limit_c64", "ours_over_limit_c64", "ours_raw_body_over_peer_floor_c64"),
    ),
    Benchmark(
        "app_path",
        "the CPU a protocol binary infer costs in handoff's own Python, layer by layer, against the floor's handler",
        ("--rounds", "5"),
        ("ours_over_floor_handler", "ours_protocol_over_middlewares"),
    ),
    Benchmark(
        "workers",
        "what 1, 2, 4 HTTP workers on one device buy against the in-process limit and the floor peer",
        ("--seconds", "8", "--rounds", "3"),
        ("ours_1_workers_over_limit_c64", "ours_2_workers_over_limit_c64", "peer_floor_over_limit_c64"),
    ),
    Benchmark(
        "int8_serving",
        "served INT8 against served fp32 on the CPU, and the top-1 it costs on the digits",
        ("--seconds", "8", "--rounds", "3"),
        ("int8_over_fp32_served_c64", "int8_over_fp32_limit"),
    ),
    Benchmark(
        "phone_photos",
        "12-megapixel JPEGs with the fast (draft) decode against the exact one, served",
        ("--seconds", "8", "--rounds", "3"),
        ("auto_over_exact_c64", "in_process_auto_over_exact"),
    ),
    Benchmark(
        "text_serving",
        "served texts/s of a Hugging Face classifier against the in-process limit and a batched BentoML peer",
        ("--seconds", "8", "--rounds", "3"),
        ("ours_over_limit_c64", "ours_over_peer_batched_c64"),
    ),
    Benchmark(
        "media_serving",
        "served audio classification (--task audio) and CLIP image embeddings (--task image-text) against the limit",
        ("--seconds", "8", "--rounds", "3"),
        ("ours_over_limit_c16",),
    ),
    Benchmark(
        "detection_serving",
        "served detections (or segmentations) per second against the in-process limit",
        ("--seconds", "8", "--rounds", "3"),
        ("ours_over_limit_c64",),
    ),
    Benchmark(
        "generation_serving",
        "served tokens/s and time to the first token of a language model against the in-process generation loop",
        ("--seconds", "8", "--rounds", "3"),
        ("ours_over_limit_c16", "ours_over_limit_c1", "ours_first_token_over_limit_c16"),
    ),
    Benchmark(
        "llama_cpp_peer",
        "served tokens/s and first token of a fine-tuned Llama against llama.cpp's server, at f32 and Q4_0 / int4",
        ("--seconds", "8", "--rounds", "3"),
        ("handoff_over_llama_cpp_fp32_c8", "handoff_over_llama_cpp_int4_c8", "handoff_over_llama_cpp_int4_c1"),
    ),
    Benchmark(
        "export_time",
        "how long `python -m export` takes for resnet18 and resnet50, phase by phase",
        ("--rounds", "3"),
        ("resnet50_parity_share", "resnet50_onnx_share"),
    ),
    Benchmark(
        "trainer_overhead",
        "the trainer's steps/s and whole run against bare DDP code doing the same work",
        ("--rounds", "5"),
        ("loop_ours_over_bare_steps_per_s", "trainer_over_bare_with_eval_and_save"),
    ),
    Benchmark(
        "checkpoint_stall",
        "what a synchronous and an asynchronous checkpoint cost a training epoch, against no save",
        ("--rounds", "30"),
        (
            "under_load_async_over_no_save_epoch",
            "under_load_sync_over_no_save_epoch",
            "sync_blocked_over_async_blocked",
        ),
    ),
)
BY_NAME = {benchmark.name: benchmark for benchmark in BENCHMARKS}
