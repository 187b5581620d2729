"""How a CPU runs the model (serve/model/lanes.py): the rule that picks lanes and the batch cap from measured rates, and
the arrangement timed on a real ONNX Runtime session."""

import numpy as np
import pytest
from onnx import TensorProto, helper

from contract.signature import Signature, TensorSpec
from serve.config import ServeConfig
from serve.model.lanes import FREE_DIMENSION, LANES_GAIN, arrange, decide, sample_inputs
from serve.model.runtime import OnnxRuntime, RuntimeUnavailable, TorchScriptRuntime


def test_lanes_are_taken_only_when_clearly_faster_and_the_cap_is_the_largest_batch_near_the_best():
    one_lane = {1: 50.0, 2: 56.0, 4: 62.0, 8: 64.0}
    lanes = {1: 90.0, 2: 88.0, 4: 86.0, 8: 74.0}  # a ViT's shape: lanes win, batch 1 best
    chosen = decide(one_lane, lanes, count=2, max_batch=32)
    assert (chosen.count, chosen.threads, chosen.max_batch_size) == (2, 1, 4)  # 86 is within 10% of 90, 74 is not
    assert chosen.rows_per_s == {"1 x 2 threads": one_lane, "2 x 1 thread": lanes}

    barely = {size: rate * (LANES_GAIN - 0.05) for size, rate in one_lane.items()}
    kept = decide(one_lane, barely, count=2, max_batch=32)
    assert (kept.count, kept.threads) == (1, 2)
    assert kept.max_batch_size == 8  # the best: nothing larger was measured

    assert decide({1: 10.0, 32: 100.0}, {1: 10.0}, count=2, max_batch=16).max_batch_size == 16


def test_where_a_lone_call_loses_little_on_one_thread_lanes_are_taken_when_faster_at_all():
    """A small text model: a row's call as fast on one thread as on two (its lanes' rate at batch 1 twice one
    lane's), lanes 5% faster at best: taken. The same gain where one thread halves a lone call's speed: not."""
    one_lane = {1: 300.0, 8: 480.0, 32: 500.0}
    small = decide(one_lane, {1: 580.0, 8: 525.0, 32: 500.0}, count=2, max_batch=32)
    assert (small.count, small.threads) == (2, 1)
    large = decide(one_lane, {1: 320.0, 8: 525.0, 32: 500.0}, count=2, max_batch=32)
    assert (large.count, large.threads) == (1, 2)
    slower = decide({**one_lane, 32: 620.0}, {1: 580.0, 8: 560.0, 32: 500.0}, count=2, max_batch=32)
    assert slower.count == 1  # lanes must be faster


def test_lanes_that_gain_less_than_a_lone_request_loses_are_not_taken():
    """The demo's digits model as timed at load on a 2-core Xeon: lanes 1.20 x faster at best, but a lone row's call
    1.34 x slower on one thread; served, the event loop sets the pace, so lanes only slowed a lone request."""
    one_lane = {1: 1130.4, 2: 1348.0, 4: 1564.1, 8: 1795.0, 16: 2187.7, 32: 2091.3}
    lanes = {1: 1686.3, 2: 2074.7, 4: 1984.4, 8: 2623.3, 16: 2627.5, 32: 2196.4}
    assert decide(one_lane, lanes, count=2, max_batch=32).count == 1
    faster = {size: rate * 1.15 for size, rate in lanes.items()}  # gaining 1.38 x, more than a lone row loses (1.17 x)
    assert decide(one_lane, faster, count=2, max_batch=32).count == 2


def test_a_dimension_that_is_not_fixed_is_timed_at_a_set_size():
    image = Signature((TensorSpec("input", "float32", (-1, 3, 8, 8)),), ())
    text = Signature((TensorSpec("input_ids", "int64", (-1, -1)), TensorSpec("attention_mask", "int64", (-1, -1))), ())
    assert sample_inputs(image, 4)["input"].shape == (4, 3, 8, 8)
    sample = sample_inputs(text, 4)
    assert {name: (a.shape, a.dtype) for name, a in sample.items()} == {
        "input_ids": ((4, FREE_DIMENSION), np.int64),
        "attention_mask": ((4, FREE_DIMENSION), np.int64),
    }


def _matmul_model(fixed: bool, width: int = 64) -> bytes:
    """A real ONNX graph: input N x width (or N x any) times a width x 64 weight."""
    weight = helper.make_tensor("w", TensorProto.FLOAT, [width, 64], [0.01] * width * 64)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["input", "w"], ["logits"])],
        "matmul",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", width if fixed else "D"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 64])],
        [weight],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()


@pytest.mark.parametrize("lanes_env", [None, "2"])
def test_the_arrangement_is_timed_or_set_and_its_runtime_built_with_its_threads(monkeypatch, lanes_env):
    monkeypatch.setenv("HANDOFF_CPU_THREADS", "2") if lanes_env else monkeypatch.delenv("HANDOFF_CPU_THREADS", False)
    monkeypatch.setenv("HANDOFF_WORKERS", "1")
    monkeypatch.setenv("HANDOFF_MAX_BATCH_SIZE", "8")
    if lanes_env:
        monkeypatch.setenv("HANDOFF_LANES", lanes_env)
    else:
        monkeypatch.delenv("HANDOFF_LANES", False)
    config = ServeConfig()
    built: list[int] = []

    def load(threads: int) -> OnnxRuntime:
        built.append(threads)
        return OnnxRuntime(_matmul_model(fixed=True), None, "cpu", "float32", threads=threads)

    signature = Signature((TensorSpec("input", "float32", (-1, 64)),), (TensorSpec("logits", "float32", (-1, 64)),))
    chosen, runtime = arrange(config, signature, load)
    if lanes_env:  # set: nothing timed, each lane on its share of the threads
        assert (chosen.count, chosen.threads, chosen.chosen_by, built) == (2, 1, "HANDOFF_LANES", [1])
        return
    if config.model_threads() < 2:
        assert chosen.chosen_by == "not measured: one core" and built == [1]
        return
    assert chosen.chosen_by == "measured"
    assert built == [config.model_threads(), 1]
    assert set(chosen.rows_per_s) == {f"1 x {built[0]} threads", f"{built[0]} x 1 thread"}
    swept = list(chosen.rows_per_s[f"1 x {built[0]} threads"])  # up to 8; a call descheduled past LONGEST_CALL_S
    assert swept and swept == [1, 2, 4, 8][: len(swept)]  # on a loaded host (CI's other worker) stops it sooner
    assert chosen.count * chosen.threads == built[0] and 1 <= chosen.max_batch_size <= 8
    assert runtime.session.get_session_options().intra_op_num_threads == chosen.threads


def test_lanes_over_one_are_refused_where_they_cannot_run(monkeypatch):
    """Several lanes call one session from several threads: ONNX Runtime on a CPU only (here: TorchScript)."""
    import io

    import torch

    monkeypatch.setenv("HANDOFF_LANES", "2")
    monkeypatch.setenv("HANDOFF_CPU_THREADS", "2")
    module = io.BytesIO()
    torch.jit.save(torch.jit.script(torch.nn.Linear(64, 64)), module)
    manifest = {"signature": {"inputs": [{"name": "input", "dtype": "float32", "shape": [-1, 64]}],
                              "outputs": [{"name": "logits", "dtype": "float32", "shape": [-1, 64]}]}}  # fmt: skip
    signature = Signature((TensorSpec("input", "float32", (-1, 64)),), ())

    def load(threads: int) -> TorchScriptRuntime:
        return TorchScriptRuntime(module.getvalue(), manifest, "cpu", "float32", threads)

    with pytest.raises(RuntimeUnavailable, match="HANDOFF_LANES=2: several lanes run on a CPU with ONNX Runtime only"):
        arrange(ServeConfig(), signature, load)


def test_a_model_that_fails_on_the_sample_is_served_as_it_is_not_timed(monkeypatch):
    """Its input's free dimension must be 50 (a weight of 50 rows): zeros at FREE_DIMENSION fail in ONNX Runtime."""
    for name in ("HANDOFF_LANES", "HANDOFF_CPU_THREADS"):
        monkeypatch.delenv(name, False)
    monkeypatch.setenv("HANDOFF_WORKERS", "1")
    config = ServeConfig()
    if config.model_threads() < 2:
        pytest.skip("one core: nothing is timed")
    signature = Signature((TensorSpec("input", "float32", (-1, -1)),), ())
    chosen, runtime = arrange(
        config,
        signature,
        lambda threads: OnnxRuntime(_matmul_model(False, 50), None, "cpu", "float32", threads=threads),
    )
    assert (chosen.count, chosen.threads) == (1, config.model_threads())
    assert chosen.chosen_by.startswith("not measured: the model failed on a sample (")
    assert runtime.run_named({"input": np.ones((2, 50), np.float32)})["logits"].shape == (2, 64)
