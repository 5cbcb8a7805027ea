"""Runs OIP calls with Triton's gRPC client and KServe's REST and gRPC clients, as a user would.

    .venv-oip-clients/bin/python tests/oip/client_driver.py < jobs.json > results.json

Run by tests/oip/clients.py in a venv of its own (these clients pin protobuf < 7; the project
needs >= 7.35), so it imports nothing of the project. Reads a JSON list of jobs, answers a
JSON list of results in the same order. A job:

    {"client": "triton_grpc" | "kserve_rest" | "kserve_grpc", "url": "host:port" or "http://...",
     "op": "live" | "ready" | "model_ready" | "server_metadata" | "model_metadata" | "infer",
     "model": "fraud", "version": "1" (optional), "binary": true, "id": "7" (optional),
     "parameters": {...} (optional), "outputs": ["name", ...] (optional),
     "inputs": [{"name", "datatype", "shape", "dtype": numpy dtype, "b64": raw bytes} |
                {"name", "datatype", "shape", "items": [b64 of each BYTES element]}]}

A result: {"ok": true, "value": ...} with, for infer, {"model_version", "id", "outputs": {name:
{"datatype", "dtype", "shape", "b64" | "items"}}}; or {"ok": false, "status": <HTTP status or
gRPC code name>, "message": "..."}.
"""

from __future__ import annotations

import asyncio
import base64
import json
import sys
from typing import Any

import numpy as np


def _array(spec: dict[str, Any]) -> np.ndarray:
    if "items" in spec:
        items = [base64.b64decode(i) for i in spec["items"]]
        return np.array(items, dtype=np.object_).reshape(spec["shape"])
    dtype: Any = spec["dtype"]
    if dtype == "bfloat16":
        import ml_dtypes

        dtype = ml_dtypes.bfloat16
    return np.frombuffer(base64.b64decode(spec["b64"]), dtype=dtype).reshape(spec["shape"])


def _encoded(array: np.ndarray, datatype: str) -> dict[str, Any]:
    if array.dtype == np.object_ or array.dtype.kind in "SU":
        items = [v if isinstance(v, bytes) else str(v).encode() for v in array.ravel().tolist()]
        encoded = [base64.b64encode(i).decode() for i in items]
        return {"datatype": datatype, "shape": list(array.shape), "items": encoded}
    contiguous = np.ascontiguousarray(array)
    return {
        "datatype": datatype,
        "dtype": "bfloat16" if contiguous.dtype.name == "bfloat16" else contiguous.dtype.str,
        "shape": list(contiguous.shape),
        "b64": base64.b64encode(contiguous.tobytes()).decode(),
    }


def triton_grpc(job: dict[str, Any]) -> Any:
    import tritonclient.grpc as tg
    from tritonclient.utils import InferenceServerException

    client = tg.InferenceServerClient(job["url"])
    try:
        op = job["op"]
        if op == "live":
            return client.is_server_live()
        if op == "ready":
            return client.is_server_ready()
        if op == "model_ready":
            return client.is_model_ready(job["model"], job.get("version", ""))
        if op == "server_metadata":
            return client.get_server_metadata(as_json=True)
        if op == "model_metadata":
            return client.get_model_metadata(job["model"], job.get("version", ""), as_json=True)
        inputs = []
        for spec in job["inputs"]:
            tensor = tg.InferInput(spec["name"], spec["shape"], spec["datatype"])
            tensor.set_data_from_numpy(_array(spec))
            inputs.append(tensor)
        outputs = [tg.InferRequestedOutput(name) for name in job.get("outputs", [])] or None
        result = client.infer(
            job["model"],
            inputs,
            model_version=job.get("version", ""),
            outputs=outputs,
            request_id=job.get("id", ""),
            parameters=job.get("parameters"),
        )
        response = result.get_response(as_json=True)
        return {
            "model_version": response.get("model_version"),
            "id": response.get("id", ""),
            "outputs": {o["name"]: _encoded(result.as_numpy(o["name"]), o["datatype"]) for o in response["outputs"]},
        }
    except InferenceServerException as exc:
        # Its gRPC status is str(grpc.StatusCode.X): "StatusCode.X"; the code's name, as KServe's gives it.
        return {"__error__": True, "status": str(exc.status()).removeprefix("StatusCode."), "message": exc.message()}
    finally:
        client.close()


def _kserve_request(job: dict[str, Any]) -> Any:
    from kserve import InferInput, InferRequest
    from kserve.protocol.infer_type import RequestedOutput

    binary = job.get("binary", False)
    inputs = []
    for spec in job["inputs"]:
        tensor = InferInput(spec["name"], spec["shape"], spec["datatype"])
        tensor.set_data_from_numpy(_array(spec), binary_data=binary)
        inputs.append(tensor)
    outputs = [RequestedOutput(name, parameters={"binary_data": binary}) for name in job.get("outputs", [])] or None
    parameters = dict(job.get("parameters") or {})
    if binary and not outputs:
        parameters["binary_data_output"] = True
    return InferRequest(
        model_name=job["model"],
        infer_inputs=inputs,
        request_id=job.get("id"),
        parameters=parameters or None,
        request_outputs=outputs,
        model_version=job.get("version"),
    )


def _kserve_result(response: Any) -> dict[str, Any]:
    return {
        "model_version": response.model_version,
        "id": response.id or "",
        "outputs": {o.name: _encoded(o.as_numpy(), o.datatype) for o in response.outputs},
    }


async def kserve_rest(job: dict[str, Any]) -> Any:
    import httpx
    from kserve import InferenceRESTClient, RESTConfig

    client = InferenceRESTClient(RESTConfig(protocol="v2", retries=0, timeout=30))
    base = job["url"]
    try:
        op = job["op"]
        if op == "live":
            return await client.is_server_live(base)
        if op == "ready":
            return await client.is_server_ready(base)
        if op == "model_ready":
            return await client.is_model_ready(base, job["model"])
        if op != "infer":
            raise ValueError(f"KServe's REST client has no {op}")
        request = _kserve_request(job)
        path_model = job["model"] if not job.get("version") else f"{job['model']}/versions/{job['version']}"
        return _kserve_result(await client.infer(base, request, model_name=path_model))
    except httpx.HTTPStatusError as exc:
        return {"__error__": True, "status": exc.response.status_code, "message": str(exc)}
    finally:
        await client.close()


async def kserve_grpc(job: dict[str, Any]) -> Any:
    import grpc
    from kserve import InferenceGRPCClient

    client = InferenceGRPCClient(job["url"], retries=2, timeout=30)
    try:
        op = job["op"]
        if op == "live":
            return await client.is_server_live()
        if op == "ready":
            return await client.is_server_ready()
        if op == "model_ready":
            return await client.is_model_ready(job["model"])
        if op != "infer":
            raise ValueError(f"KServe's gRPC client has no {op}")
        return _kserve_result(await client.infer(_kserve_request(job)))
    except grpc.RpcError as exc:
        return {"__error__": True, "status": exc.code().name, "message": exc.details()}
    finally:
        await client.close()


def run(job: dict[str, Any]) -> dict[str, Any]:
    client = job["client"]
    if client == "triton_grpc":
        value = triton_grpc(job)
    elif client == "kserve_rest":
        value = asyncio.run(kserve_rest(job))
    elif client == "kserve_grpc":
        value = asyncio.run(kserve_grpc(job))
    else:
        raise ValueError(f"unknown client {client}")
    if isinstance(value, dict) and value.get("__error__"):
        return {"ok": False, "status": value["status"], "message": value["message"]}
    return {"ok": True, "value": value}


def main() -> None:
    jobs = json.load(sys.stdin)
    results = []
    for job in jobs:
        try:
            results.append(run(job))
        except Exception as exc:  # the client itself failed: reported, the test says which
            results.append({"ok": False, "status": "client_exception", "message": f"{type(exc).__name__}: {exc}"})
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()
