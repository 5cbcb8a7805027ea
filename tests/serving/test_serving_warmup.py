"""SavedModel warmup (``--enable_model_warmup``): the replay rules with a recording servable, a real
"counter" SavedModel that proves how many times warmup ran, the fraud export, and a real
``python -m serving`` subprocess where a bad warmup file fails only its own model.

The counter model counts its own Session runs in a variable: ``y = x`` and ``count`` = runs so far
(this one included), so the first request after load answers 1 + records x iterations.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from serving_testlib import REPO_ROOT, free_port

import tensorflow as tf
from tensorflow_serving.apis import (
    classification_pb2,
    model_pb2,
    predict_pb2,
    prediction_log_pb2,
)

from serving import warmup
from serving.errors import Code, ServingError

READY_DEADLINE_S = 90.0


def predict_log(x: Sequence[float], signature: str = "", outputs: Sequence[str] = ()) -> bytes:
    request = predict_pb2.PredictRequest(
        model_spec=model_pb2.ModelSpec(name="any name: warmup ignores it", signature_name=signature)
    )
    request.inputs["x"].CopyFrom(tf.make_tensor_proto(np.asarray(x, np.float32)))
    request.output_filter.extend(outputs)
    log = prediction_log_pb2.PredictionLog(
        predict_log=prediction_log_pb2.PredictLog(request=request)
    )
    return log.SerializeToString()


def write_warmup(export_dir: Path, records: Sequence[bytes]) -> Path:
    path = Path(warmup.warmup_file_path(str(export_dir)))
    path.parent.mkdir(parents=True, exist_ok=True)
    with tf.io.TFRecordWriter(str(path)) as writer:
        for record in records:
            writer.write(record)
    return path


def export_counter(path: Path, warmup_records: Sequence[bytes] = ()) -> Path:
    """TF1 SavedModel: ``x`` float32 [-1] -> ``y`` (= x) and ``count`` int64 [-1] (runs so far)."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, shape=[None], name="x")
        counter = tf.compat.v1.Variable(0, dtype=tf.int64, name="counter")
        runs = tf.compat.v1.assign_add(counter, 1)
        y = tf.identity(x, name="y")
        count = tf.fill(tf.shape(x), runs, name="count")
        with tf.compat.v1.Session(graph=graph) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            builder = tf.compat.v1.saved_model.builder.SavedModelBuilder(str(path))
            signature = tf.compat.v1.saved_model.signature_def_utils.predict_signature_def(
                inputs={"x": x}, outputs={"y": y, "count": count}
            )
            builder.add_meta_graph_and_variables(
                session, ["serve"], signature_def_map={"serving_default": signature}
            )
            builder.save()
    if warmup_records:
        write_warmup(path, warmup_records)
    return path


class RecordingServable:
    """Records ``run`` calls; fails on the signature named ``fail``."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, np.ndarray], tuple[str, ...]]] = []
        self.closed = False

    def run(
        self, signature_name: str, inputs: Any, output_filter: Any = (), timeout_ms: Any = None
    ) -> Any:
        if signature_name == "fail":
            raise ServingError(Code.INVALID_ARGUMENT, "input size does not match signature")
        self.calls.append((signature_name, dict(inputs), tuple(output_filter)))
        return signature_name, {}

    def close(self) -> None:
        self.closed = True


# ---- replay rules ------------------------------------------------------------------------------


def test_no_warmup_file_is_fine(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    servable = RecordingServable()
    with caplog.at_level(logging.INFO, logger="serving.warmup"):
        assert warmup.run_saved_model_warmup(servable, str(tmp_path)) == 0
    assert servable.calls == []
    assert f"No warmup data file found at {warmup.warmup_file_path(str(tmp_path))}" in caplog.text


def test_records_replay_in_order_with_iterations(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = write_warmup(tmp_path, [predict_log([1.0]), predict_log([2.0, 3.0], "sig", ["y"])])
    servable = RecordingServable()
    with caplog.at_level(logging.INFO, logger="serving.warmup"):
        count = warmup.run_saved_model_warmup(servable, str(tmp_path), num_request_iterations=2)
    assert count == 2
    assert [(name, list(inputs["x"]), outputs) for name, inputs, outputs in servable.calls] == [
        ("", [1.0], ()),
        ("", [1.0], ()),
        ("sig", [2.0, 3.0], ("y",)),
        ("sig", [2.0, 3.0], ("y",)),
    ]
    assert servable.calls[0][1]["x"].dtype == np.float32
    assert (
        f"Finished reading warmup data for model at {path}. Number of warmup records read: 2."
        in caplog.text
    )


def test_other_log_types(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    request = classification_pb2.ClassificationRequest()
    classify = prediction_log_pb2.PredictionLog(
        classify_log=prediction_log_pb2.ClassifyLog(request=request)
    ).SerializeToString()
    empty = prediction_log_pb2.PredictionLog().SerializeToString()
    write_warmup(tmp_path, [classify, empty, predict_log([1.0])])
    servable = RecordingServable()
    with caplog.at_level(logging.WARNING, logger="serving.warmup"):
        assert warmup.run_saved_model_warmup(servable, str(tmp_path)) == 3
    assert len(servable.calls) == 1
    assert "1 warmup record(s)" in caplog.text and "not replayed" in caplog.text

    session_run = prediction_log_pb2.PredictionLog(
        session_run_log=prediction_log_pb2.SessionRunLog()
    ).SerializeToString()
    write_warmup(tmp_path, [session_run])
    with pytest.raises(ServingError) as info:
        warmup.run_saved_model_warmup(servable, str(tmp_path))
    assert (info.value.code, info.value.message) == (
        Code.UNIMPLEMENTED,
        "Unsupported log_type for warmup: 5",
    )


def test_too_many_records(tmp_path: Path) -> None:
    path = write_warmup(tmp_path, [predict_log([1.0])] * (warmup.MAX_NUM_RECORDS + 1))
    servable = RecordingServable()
    with pytest.raises(ServingError) as info:
        warmup.run_saved_model_warmup(servable, str(tmp_path))
    assert (info.value.code, info.value.message) == (
        Code.INVALID_ARGUMENT,
        f"Number of warmup records exceeds the maximum (1000) at {path}",
    )
    assert len(servable.calls) == 1001  # TF Serving runs the record, then counts it
    write_warmup(tmp_path, [predict_log([1.0])] * warmup.MAX_NUM_RECORDS)
    assert warmup.run_saved_model_warmup(RecordingServable(), str(tmp_path)) == 1000


@pytest.mark.parametrize(
    ("content", "code", "message"),
    [
        (
            b"not a TFRecord file at all, just some text",
            Code.DATA_LOSS,
            "corrupted record at 0 (Is this even a TFRecord file?). Please verify your warmup data "
            "is in TFRecord format.",
        ),
        (None, Code.INVALID_ARGUMENT, "Failed to parse warmup record: hello from {path}"),
    ],
)
def test_malformed_warmup_files(
    tmp_path: Path, content: bytes | None, code: Code, message: str
) -> None:
    if content is None:
        path = write_warmup(tmp_path, [b"hello"])  # a valid TFRecord, not a PredictionLog
    else:
        path = Path(warmup.warmup_file_path(str(tmp_path)))
        path.parent.mkdir(parents=True)
        path.write_bytes(content)
    with pytest.raises(ServingError) as info:
        warmup.run_saved_model_warmup(RecordingServable(), str(tmp_path))
    assert (info.value.code, info.value.message) == (code, message.format(path=path))


def test_truncated_warmup_file_is_data_loss(tmp_path: Path) -> None:
    path = write_warmup(tmp_path, [predict_log([1.0]), predict_log([2.0])])
    path.write_bytes(path.read_bytes()[:-7])
    with pytest.raises(ServingError) as info:
        warmup.run_saved_model_warmup(RecordingServable(), str(tmp_path))
    assert info.value.code is Code.DATA_LOSS
    assert info.value.message.startswith("truncated record at ")
    assert info.value.message.endswith(". Please verify your warmup data is in TFRecord format.")


def test_a_failing_request_fails_the_load_and_closes_the_servable(tmp_path: Path) -> None:
    write_warmup(tmp_path, [predict_log([1.0], "fail")])
    loaded: list[RecordingServable] = []

    def load(path: str) -> RecordingServable:
        loaded.append(RecordingServable())
        return loaded[-1]

    with pytest.raises(ServingError, match="input size does not match signature"):
        warmup.load_with_warmup(load, str(tmp_path))
    assert loaded[0].closed
    write_warmup(tmp_path, [predict_log([1.0])])
    servable = warmup.load_with_warmup(load, str(tmp_path), num_request_iterations=3)
    assert len(servable.calls) == 3 and not servable.closed


# ---- real SavedModels --------------------------------------------------------------------------


def test_warmup_runs_on_the_loaded_session(tmp_path: Path) -> None:
    from serving.servable import Servable

    export_dir = export_counter(tmp_path / "counter" / "1", [predict_log([1.0])] * 3)
    servable = warmup.load_with_warmup(Servable.load, str(export_dir), num_request_iterations=2)
    try:
        _, outputs = servable.run("", {"x": np.asarray([5.0, 6.0], np.float32)})
        assert outputs["count"].tolist() == [7, 7]  # 3 records x 2 iterations, then this run
        assert outputs["y"].tolist() == [5.0, 6.0]
    finally:
        servable.close()
    cold = Servable.load(str(export_dir))  # without warmup: the first run is the first
    try:
        assert cold.run("", {"x": np.asarray([1.0], np.float32)})[1]["count"].tolist() == [1]
    finally:
        cold.close()


def test_fraud_export_warms_up(caplog: pytest.LogCaptureFixture) -> None:
    from serving.servable import Servable

    export_dir = REPO_ROOT / "models" / "fraud" / "1"
    with caplog.at_level(logging.INFO, logger="serving.warmup"):
        servable = warmup.load_with_warmup(Servable.load, str(export_dir))
    servable.close()
    assert (
        f"Finished reading warmup data for model at {warmup.warmup_file_path(str(export_dir))}. "
        "Number of warmup records read: 3." in caplog.text
    )


# ---- the server ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def warmup_models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("warmup_models")
    export_counter(root / "counter" / "1", [predict_log([1.0]), predict_log([2.0, 3.0])] * 2)
    corrupt = export_counter(root / "corrupt" / "1")
    Path(warmup.warmup_file_path(str(corrupt))).parent.mkdir()
    Path(warmup.warmup_file_path(str(corrupt))).write_bytes(b"\x00" * 64)
    return root


@pytest.fixture(scope="module")
def server(
    warmup_models: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[httpx.Client, Path]]:
    workdir = tmp_path_factory.mktemp("warmup_server")
    config = workdir / "models.config"
    entries = "".join(
        f'config {{ name: "{name}" base_path: "{path}" model_platform: "tensorflow" }} '
        for name, path in [
            ("counter", warmup_models / "counter"),
            ("corrupt", warmup_models / "corrupt"),
            ("fraud", REPO_ROOT / "models" / "fraud"),
        ]
    )
    config.write_text(f"model_config_list {{ {entries}}}")
    port = free_port()
    log = workdir / "server.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "serving",
                f"--port={free_port()}",
                f"--rest_api_port={port}",
                "--rest_api_host=127.0.0.1",
                f"--model_config_file={config}",
                "--num_request_iterations_for_warmup=2",
                "--max_num_load_retries=0",
                "--tensorflow_intra_op_parallelism=1",
                "--tensorflow_inter_op_parallelism=1",
            ],
            cwd=REPO_ROOT,
            stdout=sink,
            stderr=subprocess.STDOUT,
            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
        )
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10.0) as client:
            deadline = time.monotonic() + READY_DEADLINE_S
            wanted = {"counter": "AVAILABLE", "corrupt": "END", "fraud": "AVAILABLE"}
            while wanted and time.monotonic() < deadline:
                assert process.poll() is None, log.read_text()
                for name, state in list(wanted.items()):
                    try:
                        response = client.get(f"/v1/models/{name}")
                    except httpx.TransportError:
                        break
                    if response.status_code == 200 and state in {
                        v["state"] for v in response.json()["model_version_status"]
                    }:
                        del wanted[name]
                time.sleep(0.05)
            assert not wanted, f"not ready: {wanted}\n{log.read_text()}"
            yield client, log
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def test_server_replays_warmup_before_available(server: tuple[httpx.Client, Path]) -> None:
    client, log = server
    response = client.post("/v1/models/counter:predict", json={"instances": [4.0]})
    assert response.status_code == 200
    # 4 records x 2 iterations ran before the version became AVAILABLE; this is run 9.
    assert response.json() == {"predictions": [{"y": 4.0, "count": 9}]}
    assert "Number of warmup records read: 4." in log.read_text()


def test_server_bad_warmup_file_fails_only_that_model(server: tuple[httpx.Client, Path]) -> None:
    client, log = server
    status = client.get("/v1/models/corrupt").json()["model_version_status"]
    assert status == [
        {
            "version": "1",
            "state": "END",
            "status": {
                "error_code": "DATA_LOSS",
                "error_message": "corrupted record at 0 (Is this even a TFRecord file?). Please "
                "verify your warmup data is in TFRecord format.",
            },
        }
    ]
    fraud_warmup = warmup.warmup_file_path(str(REPO_ROOT / "models" / "fraud" / "1"))
    assert (
        f"Finished reading warmup data for model at {fraud_warmup}. Number of warmup records "
        "read: 3." in log.read_text()
    )
    response = client.post("/v1/models/fraud:predict", json={"instances": [[0.0] * 11]})
    assert response.status_code == 200
