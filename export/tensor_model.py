"""Any nn.Module, described by an example input: its signature, its outputs by name, and one calling
convention every exporter and the parity check share.

    python -m export ckpt.pth --model mypkg.models:TextClassifier --example example.pt --dynamic tokens:1

The example (`.pt`, loaded with weights_only=True, or `.npz`) holds one tensor, passed positionally and named
`input`, or a dict of named tensors, passed by keyword. Its dtypes and shapes become the signature; its values
are what parity runs on (nothing is invented: a random token id out of the embedding's range proves nothing).
Dimension 0 of every input and output is the batch, and is dynamic; `--dynamic NAME:DIM[,DIM]` makes more
dimensions dynamic (a sequence length). Outputs: a tensor (`output`), a tuple or list (`output_0`, ...) or a
dict of tensors (its keys), each with the batch first.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn as nn

from contract.signature import DTYPES, Signature, TensorSpec

SINGLE_INPUT = "input"  # the name a lone example tensor gets
MAX_BATCH = 4096


@dataclass(frozen=True)
class Example:
    inputs: dict[str, torch.Tensor]  # in the order the model takes them
    keywords: bool  # a dict of tensors: passed by name; one tensor: positionally

    @property
    def rows(self) -> int:
        return next(iter(self.inputs.values())).shape[0]

    def described(self) -> str:
        return ", ".join(f"{n} {str(t.dtype).removeprefix('torch.')} {list(t.shape)}" for n, t in self.inputs.items())

    def select(self, rows: list[int]) -> Example:
        index = torch.tensor(rows)
        return Example({n: t.index_select(0, index) for n, t in self.inputs.items()}, self.keywords)

    def narrowed(self, dims: dict[str, tuple[int, ...]], length: int, original: int) -> Example:
        """The example with every `dims` dimension of size `original` cut to its first `length` entries."""
        cut = {}
        for name, tensor in self.inputs.items():
            for dim in dims.get(name, ()):
                if tensor.shape[dim] == original:
                    tensor = tensor.narrow(dim, 0, length)
            cut[name] = tensor
        return Example(cut, self.keywords)


def load_example(path: Path) -> Example:
    """The example file's tensors; ValueError for anything that is not one tensor or a dict of them."""
    if not path.is_file():
        raise ValueError(f"--example={path}: no such file (a .pt or .npz holding a tensor or a dict of tensors)")
    if path.suffix == ".npz":
        with np.load(path, allow_pickle=False) as archive:
            found: Any = {name: torch.from_numpy(archive[name].copy()) for name in archive.files}
    else:
        try:
            found = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as err:  # noqa: BLE001 - unpickling refusals and damaged files alike: one line
            raise ValueError(f"--example={path}: cannot be read with weights_only=True ({err})") from None
    if isinstance(found, torch.Tensor):
        inputs, keywords = {SINGLE_INPUT: found}, False
    elif (
        isinstance(found, dict)
        and found
        and all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in found.items())
    ):
        inputs, keywords = dict(found), True
    else:
        raise ValueError(
            f"--example={path}: holds {type(found).__name__}; expected a tensor or a dict of named tensors"
        )
    for name, tensor in inputs.items():
        dtype = str(tensor.dtype).removeprefix("torch.")
        if dtype not in DTYPES:
            raise ValueError(f"--example={path}: input {name!r} is {dtype}; supported: {', '.join(DTYPES)}")
        if tensor.ndim == 0 or tensor.shape[0] < 1:
            raise ValueError(
                f"--example={path}: input {name!r} has shape {list(tensor.shape)}; dimension 0 is the batch"
            )
    batches = {t.shape[0] for t in inputs.values()}
    if len(batches) != 1:
        raise ValueError(
            f"--example={path}: inputs disagree on the batch (dimension 0): {Example(inputs, keywords).described()}"
        )
    return Example({n: t.contiguous() for n, t in inputs.items()}, keywords)


def parse_dynamic(flags: list[str], example: Example) -> dict[str, tuple[int, ...]]:
    """--dynamic NAME:DIM[,DIM] (one flag per input) -> {name: dims}, checked against the example."""
    dynamic: dict[str, tuple[int, ...]] = {}
    for flag in flags:
        name, _, dims = flag.partition(":")
        if name not in example.inputs:
            raise ValueError(f"--dynamic {flag}: no input {name!r}; the example has {', '.join(example.inputs)}")
        if name in dynamic:
            raise ValueError(f"--dynamic {flag}: {name!r} is named twice; give its dimensions once, NAME:1,2")
        try:
            numbers = tuple(int(d) for d in dims.split(","))
        except ValueError:
            raise ValueError(f"--dynamic {flag}: expected NAME:DIM[,DIM], e.g. tokens:1") from None
        ndim = example.inputs[name].ndim
        for d in numbers:
            if d == 0:
                raise ValueError(f"--dynamic {flag}: dimension 0 is the batch, always dynamic; name the others")
            if not 0 < d < ndim:
                raise ValueError(f"--dynamic {flag}: {name!r} has dimensions 0..{ndim - 1}")
        dynamic[name] = tuple(sorted(set(numbers)))
    return dynamic


def name_outputs(output: Any) -> dict[str, torch.Tensor]:
    """The model's output by name: a tensor -> output; a tuple or list -> output_0...; a dict -> its keys."""
    if isinstance(output, torch.Tensor):
        named = {"output": output}
    elif isinstance(output, (tuple, list)):
        named = {f"output_{i}": value for i, value in enumerate(output)}
    elif isinstance(output, dict) and all(isinstance(k, str) for k in output):
        named = dict(output)
    else:
        raise ValueError(
            f"the model returns {type(output).__name__}; export takes a tensor, a tuple/list or a dict of tensors"
        )
    bad = [name for name, value in named.items() if not isinstance(value, torch.Tensor)]
    if bad or not named:
        raise ValueError(f"the model's outputs {', '.join(bad) or '(none)'} are not tensors; every output must be one")
    return named


def first_line(err: BaseException) -> str:
    """The first non-empty line of an error (the user's model's, an exporter's), cut to 300 characters."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return (lines[0] if lines else type(err).__name__)[:300]


class SignatureModule(nn.Module):
    """The user's module called as the signature says (by keyword, or one tensor positionally), giving a tuple
    of tensors in the signature's output order: one convention for ONNX, torch.export, TorchScript and parity."""

    def __init__(self, model: nn.Module, input_names: list[str], keywords: bool, output_names: list[str]) -> None:
        super().__init__()
        self.model = model
        self.input_names = input_names
        self.keywords = keywords
        self.output_names = output_names

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        output = self.model(**dict(zip(self.input_names, inputs))) if self.keywords else self.model(*inputs)
        named = name_outputs(output)
        return tuple(named[name] for name in self.output_names)


def describe(
    model: nn.Module, example: Example, dynamic: dict[str, tuple[int, ...]]
) -> tuple[Signature, SignatureModule]:
    """Run the model on the example once: its signature, and the module every exporter is given. ValueError
    with the model's own message when the example does not fit it, or an output lacks the batch dimension."""
    try:
        outputs = name_outputs(_call(model, example))
    except Exception as err:  # noqa: BLE001 - the user's model: whatever it raises is the answer to give
        raise ValueError(
            f"the example does not fit the model: {type(err).__name__}: {first_line(err)} (given {example.described()})"
        ) from None
    for name, tensor in outputs.items():
        if tensor.ndim == 0 or tensor.shape[0] != example.rows:
            raise ValueError(
                f"output {name!r} has shape {list(tensor.shape)}: every output needs the batch ({example.rows} rows) "
                "as dimension 0"
            )
        dtype = str(tensor.dtype).removeprefix("torch.")
        if dtype not in DTYPES:
            raise ValueError(f"output {name!r} is {dtype}; supported: {', '.join(DTYPES)}")
    inputs = tuple(
        TensorSpec(
            n,
            str(t.dtype).removeprefix("torch."),
            (-1, *(-1 if d in dynamic.get(n, ()) else s for d, s in enumerate(t.shape) if d)),
        )
        for n, t in example.inputs.items()
    )
    following = _dims_following_dynamic(model, example, dynamic, outputs)
    signature = Signature(
        inputs,
        tuple(
            TensorSpec(
                n,
                str(t.dtype).removeprefix("torch."),
                (-1, *(-1 if d in following.get(n, ()) else s for d, s in enumerate(t.shape) if d)),
            )
            for n, t in outputs.items()
        ),
    )
    return signature, SignatureModule(model, list(example.inputs), example.keywords, list(outputs))


def _call(model: nn.Module, example: Example) -> Any:
    with torch.inference_mode():
        return model(**example.inputs) if example.keywords else model(*example.inputs.values())


def _dims_following_dynamic(
    model: nn.Module, example: Example, dynamic: dict[str, tuple[int, ...]], outputs: dict[str, torch.Tensor]
) -> dict[str, set[int]]:
    """The output dimensions (beyond the batch) whose size follows a dynamic input dimension: the model is run
    again with each dynamic length cut to about half, and a dimension that changed with it is -1 in the signature
    (a segmenter's H and W, a sequence model's length), not the example's size."""
    following: dict[str, set[int]] = {}
    lengths = sorted({example.inputs[n].shape[d] for n, dims in dynamic.items() for d in dims})
    for length in lengths:
        shorter = max(2, length // 2)
        if shorter >= length:
            continue  # a length of 2 cannot be cut and still tell a dynamic dimension (torch.export's 0/1 rule)
        try:
            probe = name_outputs(_call(model, example.narrowed(dynamic, shorter, length)))
        except Exception:  # noqa: BLE001 - a model that needs the example's length: its outputs keep their sizes
            continue
        for name, tensor in outputs.items():
            if name in probe and probe[name].ndim == tensor.ndim:
                changed = {d for d in range(1, tensor.ndim) if probe[name].shape[d] != tensor.shape[d]}
                following.setdefault(name, set()).update(changed)
    return following


def traceable(example: Example) -> Example:
    """An example the exporters keep dynamic: torch.export specialises a dimension of size 1 (or 0) to that
    size, so a single row is repeated to two (the same values: nothing invented)."""
    return example if example.rows >= 2 else example.select([0, 0])


def dynamic_shapes(example: Example, dynamic: dict[str, tuple[int, ...]]) -> tuple[tuple[dict[int, Any], ...]]:
    """torch.export's dynamic_shapes for SignatureModule: one entry for its `*inputs`, holding one per input. One
    batch Dim shared by all (the batch is one size for every input), and Dim.AUTO for each --dynamic dimension,
    so that the exporter itself works out which of them must be equal (a sequence's tokens and its mask)."""
    batch = torch.export.Dim("batch", min=1, max=MAX_BATCH)
    per_input = tuple(
        {0: batch, **{d: torch.export.Dim.AUTO for d in dynamic.get(name, ())}} for name in example.inputs
    )
    return (per_input,)
