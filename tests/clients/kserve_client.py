"""Run by tests/test_protocol.py with a virtualenv that has the `kserve` package (its own dependencies would
change the project's: httptools and uvloop under uvicorn, an older psutil): KServe's InferenceRESTClient,
protocol v2, against a served model. Prints what it got as JSON.

    python kserve_client.py URL MODEL_NAME TENSOR.npy
"""

import asyncio
import json
import sys

import numpy as np
from kserve import InferenceRESTClient, InferInput, InferRequest, RESTConfig


async def main(url: str, name: str, tensor_path: str) -> dict:
    client = InferenceRESTClient(RESTConfig(protocol="v2", retries=0, timeout=60))
    try:
        found = {
            "live": await client.is_server_live(url),
            "ready": await client.is_server_ready(url),
            "model_ready": await client.is_model_ready(url, name),
        }
        batch = np.load(tensor_path)
        for binary in (False, True):
            tensor = InferInput("input", list(batch.shape), "FP32")
            tensor.set_data_from_numpy(batch, binary_data=binary)
            request = InferRequest(model_name=name, infer_inputs=[tensor], request_id=f"kserve-{binary}")
            response = await client.infer(url, request, model_name=name)
            outputs = {output.name: output.as_numpy().tolist() for output in response.outputs}
            found[f"binary={binary}"] = {"id": response.id, "outputs": outputs}
        return found
    finally:
        await client.close()


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(*sys.argv[1:4]))))
