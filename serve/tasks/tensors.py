"""Any model (`python -m export --model ... --example ...`): tensors by name in, tensors by name out.

- POST /predict: `{"inputs": {name: nested list}}` -> `{"outputs": {name: nested list}}`;
- the protocol: the signature's inputs and outputs, as they are.

The request is checked against the signature (serve/model/tensor_inputs.py) before it reaches the batcher, and an answer
larger than one response may carry is refused before it is encoded. Requests whose inputs agree beyond the batch
dimension share a batch. A request the model still cannot run alone (an index out of its vocabulary, a shape it
cannot take) is the client's: a 400 naming the inputs and the model's first line.
"""

from __future__ import annotations

from contract.errors import ClientError
from contract.signature import TASK_TENSORS
from serve.http.endpoint import Endpoint
from serve.model.batching import ModelFailed
from serve.protocols.oip_codec import InferRequest, OutputTensor
from serve.tasks.base import ProtocolTask


class Tensors(ProtocolTask):
    name = TASK_TENSORS
    kind = "any model"

    def client_fault(self, failed: ModelFailed) -> ClientError | None:
        names = ", ".join(t.name for t in self.signature.inputs)
        return ClientError(f"the model could not run on these inputs ({names}): {failed.first_line()}")

    def endpoints(self) -> list[Endpoint]:
        return [self.predict_route()]

    async def infer(self, request: InferRequest) -> list[OutputTensor]:
        return await self.infer_named(request)
