"""The OIP clients the tests score with, and TF Serving's own Predict to compare them with.

Triton's HTTP client (`tritonclient[http]`) is in the dev extra and runs in the test process.
Triton's gRPC client and KServe's SDK pin protobuf < 7, which the project's generated code
(protobuf >= 7.35) cannot share, so they live in a venv of their own, `.venv-oip-clients/`,
made from the registry on first use (about 70 s on 2 cores, then reused while its pins are
unchanged) and driven through `tests/oip/client_driver.py`, a script that imports nothing of
the project. Without the registry the venv cannot be made: the tests that need it skip,
saying so.

Tensors cross to the driver as raw bytes with their numpy dtype (`encode` / `decode`).
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from tests.support import REPO

VENV = REPO / ".venv-oip-clients"
#: Pinned: the versions the tests were written against.
REQUIREMENTS = ("tritonclient[grpc]==2.73.0", "kserve==0.21.0")
DRIVER = Path(__file__).with_name("client_driver.py")
_STAMP = VENV / ".requirements"
INSTALL_TIMEOUT_S = 900


def client_python() -> Path:
    """The clients' venv's python, made when missing or its pins changed (pytest.skip when the
    registry cannot be reached)."""
    python = VENV / "bin" / "python"
    wanted = "\n".join(REQUIREMENTS)
    VENV.parent.mkdir(parents=True, exist_ok=True)
    with open(REPO / ".venv-oip-clients.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one maker at a time; released if the holder dies
        if python.exists() and _STAMP.exists() and _STAMP.read_text() == wanted:
            return python
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(VENV)], check=True, timeout=120)
        install = subprocess.run(
            [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *REQUIREMENTS],
            capture_output=True,
            text=True,
            timeout=INSTALL_TIMEOUT_S,
        )
        if install.returncode != 0:
            tail = install.stderr.strip()[-1500:]
            if "Could not find a version" in tail or "Failed to establish" in tail or "No matching" in tail:
                pytest.skip(f"the OIP clients' venv cannot be installed from the registry: {tail[-300:]}")
            raise RuntimeError(f"installing {REQUIREMENTS} failed:\n{tail}")
        _STAMP.write_text(wanted)
    return python


def run_jobs(jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Run `jobs` with the driver (see its doc); one result per job, in order.

    Triton's and KServe's clients each register the protocol's messages (`inference.*`) in
    protobuf's default pool, which refuses a second definition: each family runs in a driver
    process of its own."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    results: list[dict[str, Any] | None] = [None] * len(jobs)
    for family in ("triton", "kserve"):
        indices = [i for i, job in enumerate(jobs) if job["client"].startswith(family)]
        if not indices:
            continue
        out = subprocess.run(
            [str(client_python()), str(DRIVER)],
            input=json.dumps([jobs[i] for i in indices]),
            capture_output=True,
            text=True,
            timeout=300,
            env=env,
        )
        assert out.returncode == 0, out.stderr[-3000:]
        answers = json.loads(out.stdout)
        assert len(answers) == len(indices)
        for index, answer in zip(indices, answers, strict=True):
            results[index] = answer
    assert all(r is not None for r in results), "a job of no known client family"
    return [r for r in results if r is not None]


def encode(name: str, datatype: str, array: np.ndarray) -> dict[str, Any]:
    """A driver input: `array` as `datatype`."""
    if array.dtype == np.object_:
        items = [base64.b64encode(v).decode() for v in array.ravel()]
        return {"name": name, "datatype": datatype, "shape": list(array.shape), "items": items}
    contiguous = np.ascontiguousarray(array)
    return {
        "name": name,
        "datatype": datatype,
        "shape": list(array.shape),
        "dtype": "bfloat16" if contiguous.dtype.name == "bfloat16" else contiguous.dtype.str,
        "b64": base64.b64encode(contiguous.tobytes()).decode(),
    }


def decode(spec: dict[str, Any]) -> np.ndarray:
    """A driver output as a numpy array."""
    if "items" in spec:
        items = [base64.b64decode(i) for i in spec["items"]]
        return np.array(items, dtype=np.object_).reshape(spec["shape"])
    dtype: Any = ml_dtypes.bfloat16 if spec["dtype"] == "bfloat16" else spec["dtype"]
    return np.frombuffer(base64.b64decode(spec["b64"]), dtype=dtype).reshape(spec["shape"])


def serving_predict(
    grpc_target: str, model: str, inputs: dict[str, np.ndarray], *, signature: str = "serving_default",
    version: int | None = None, dtypes: dict[str, Any] | None = None,
) -> dict[str, np.ndarray]:
    """TF Serving's own Predict (the official `tensorflow-serving-api` protos, over gRPC to the
    serving tier itself) on `inputs`: each output as numpy."""
    import grpc
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    request = predict_pb2.PredictRequest()
    request.model_spec.name = model
    request.model_spec.signature_name = signature
    if version is not None:
        request.model_spec.version.value = version
    for name, array in inputs.items():
        dtype = (dtypes or {}).get(name)
        request.inputs[name].CopyFrom(tf.make_tensor_proto(array, dtype=dtype))
    with grpc.insecure_channel(grpc_target) as channel:
        response = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(request, timeout=30)
    return {name: tf.make_ndarray(proto) for name, proto in response.outputs.items()}
