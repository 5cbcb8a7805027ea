"""SavedModel warmup (``--enable_model_warmup``): the replay rules with a recording servable, a real
"counter" SavedModel that proves how many times warmup ran, TF Serving's half_plus_two test model
(predict, classify and regress signatures) replaying every log type with its metrics, the fraud
export, and a real ``python -m serving`` subprocess where a bad warmup file fails only its own
model.

The counter model counts its own Session runs in a variable: ``y = x`` and ``count`` = runs so far
(this one included), so the first request after load answers 1 + records x iterations.
"""

from __future__ import annotations

import logging
import re
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.protobuf.meta_graph_pb2 import SignatureDef
from tensorflow_serving.apis import (
    classification_pb2,
    inference_pb2,
    input_pb2,
    model_pb2,
    predict_pb2,
    prediction_log_pb2,
    regression_pb2,
)

from serving.servables.tensorflow import saved_model_warmup as warmup
from serving.servables.tensorflow.saved_model_warmup import ModelWarmupOptions
from serving.servables.tensorflow.servable import PredictRun
from serving.util.errors import Code, ServingError
from serving.util.metrics import ServingMetrics
from tests.serving.serving_testlib import start_test_serving
from tests.serving.tf_serving_testdata import export_testdata
from tests.support import REPO

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
    """Records predict calls (``prepare_predict``) and Session runs; fails on the predict
    signature named ``fail``. ``signature_defs`` are what Example-based records resolve against."""

    def __init__(self, signature_defs: dict[str, SignatureDef] | None = None) -> None:
        self.calls: list[tuple[str, dict[str, np.ndarray], tuple[str, ...]]] = []
        self.runs: list[tuple[tuple[str, ...], tuple[str, ...]]] = []
        self.prepared: list[tuple[tuple[str, ...], tuple[str, ...], Any]] = []
        self.signature_defs = signature_defs or {}
        self.closed = False

    def prepare_predict(
        self, signature_name: str, inputs: Any, output_filter: Any = ()
    ) -> PredictRun:
        if signature_name == "fail":
            raise ServingError(Code.INVALID_ARGUMENT, "input size does not match signature")
        self.calls.append((signature_name, dict(inputs), tuple(output_filter)))
        return PredictRun(signature_name or "serving_default", dict(inputs), (), ())

    def run_tensors(self, feeds: Any, fetches: Any, timeout_ms: Any = None) -> list[np.ndarray]:
        self.runs.append((tuple(feeds), tuple(fetches)))
        rows = len(next(iter(feeds.values()))) if feeds else 0
        # A classify signature's "scores" output: one score per example.
        return [np.ones((rows, 1), np.float32) for _ in fetches]

    def prepare_run(self, feeds: Any, fetches: Any, timeout_ms: Any) -> None:
        self.prepared.append((tuple(feeds), tuple(fetches), timeout_ms))

    def close(self) -> None:
        self.closed = True


# ---- replay rules ------------------------------------------------------------------------------


def test_no_warmup_file_is_fine(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    servable = RecordingServable()
    with caplog.at_level(logging.INFO, logger="serving.servables.tensorflow.saved_model_warmup"):
        assert warmup.run_saved_model_warmup(servable, str(tmp_path)) == 0
    assert servable.calls == []
    assert f"No warmup data file found at {warmup.warmup_file_path(str(tmp_path))}" in caplog.text


def test_records_replay_in_order_with_iterations(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = write_warmup(tmp_path, [predict_log([1.0]), predict_log([2.0, 3.0], "sig", ["y"])])
    servable = RecordingServable()
    with caplog.at_level(logging.INFO, logger="serving.servables.tensorflow.saved_model_warmup"):
        count = warmup.run_saved_model_warmup(
            servable, str(tmp_path), options=ModelWarmupOptions(num_request_iterations=2)
        )
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
    # ModelWarmupOptions::DebugString(), as TF Serving logs it.
    assert (
        f"Starting to read warmup data for model at {path} with model-warmup-options "
        "num_request_iterations {\n  value: 2\n}\n" in caplog.text
    )


def test_model_warmup_options_follow_the_flag_and_the_proto() -> None:
    # --num_request_iterations_for_warmup sets the option only when > 0 (server.cc).
    assert ModelWarmupOptions.from_flags(0) == ModelWarmupOptions()
    assert ModelWarmupOptions.from_flags(3) == ModelWarmupOptions(num_request_iterations=3)
    assert ModelWarmupOptions().debug_string() == ""


def test_each_record_also_makes_the_callable_of_the_rest_timeout(tmp_path: Path) -> None:
    # A Session callable is made per run timeout: the REST front end's must exist before
    # traffic. Made, not run: the replay's runs stay TF Serving's.
    assert ModelWarmupOptions.from_flags(0, 30000) == ModelWarmupOptions(session_timeouts_ms=(30000,))
    assert ModelWarmupOptions.from_flags(2, 0) == ModelWarmupOptions(num_request_iterations=2)
    write_warmup(tmp_path, [predict_log([1.0]), predict_log([2.0, 3.0])])
    servable = RecordingServable()
    options = ModelWarmupOptions(num_request_iterations=2, session_timeouts_ms=(30000,))
    assert warmup.run_saved_model_warmup(servable, str(tmp_path), options=options) == 2
    assert len(servable.runs) == 4
    assert [timeout for _, _, timeout in servable.prepared] == [30000, 30000]
    assert [(feeds, fetches) for feeds, fetches, _ in servable.prepared] == servable.runs[::2]


def test_zero_iterations_read_and_count_every_record_but_run_none(tmp_path: Path) -> None:
    write_warmup(tmp_path, [predict_log([1.0]), predict_log([2.0])])
    servable = RecordingServable()
    options = ModelWarmupOptions(num_request_iterations=0)  # set: used as is, like TF Serving
    assert warmup.run_saved_model_warmup(servable, str(tmp_path), options=options) == 2
    assert servable.calls == []


def test_log_types_a_session_servable_does_not_replay_are_skipped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """saved_model_warmup.cc's RunWarmupRequest: ``default: break`` -- predict_streamed_log (a
    TFRT-only log type) and a record without a log type are read, counted and skipped."""
    streamed = prediction_log_pb2.PredictionLog(
        predict_streamed_log=prediction_log_pb2.PredictStreamedLog()
    ).SerializeToString()
    empty = prediction_log_pb2.PredictionLog().SerializeToString()
    write_warmup(tmp_path, [streamed, empty, predict_log([1.0])])
    servable = RecordingServable()
    with caplog.at_level(logging.WARNING, logger="serving.servables.tensorflow.saved_model_warmup"):
        options = ModelWarmupOptions(num_request_iterations=3)
        assert warmup.run_saved_model_warmup(servable, str(tmp_path), options=options) == 3
    assert len(servable.calls) == 3  # the predict record, 3 times
    assert "2 warmup record(s)" in caplog.text
    assert "(no log_type: 1, predict_streamed_log: 1)" in caplog.text

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
    options = ModelWarmupOptions(num_request_iterations=3)
    servable = warmup.load_with_warmup(load, str(tmp_path), options=options)
    assert len(servable.calls) == 3 and not servable.closed


CLASSIFY = "tensorflow/serving/classify"
REGRESS = "tensorflow/serving/regress"
WARMUP_MODEL_NAME = "warm"  # what the records' model_spec says; warmup ignores it for routing


def _examples(*xs: float) -> input_pb2.Input:
    examples = input_pb2.Input()
    for x in xs:
        examples.example_list.examples.add().features.feature["x"].float_list.value.append(x)
    return examples


def _spec(signature: str) -> model_pb2.ModelSpec:
    return model_pb2.ModelSpec(name=WARMUP_MODEL_NAME, signature_name=signature)


def classify_log(signature: str, *xs: float) -> bytes:
    request = classification_pb2.ClassificationRequest(
        model_spec=_spec(signature), input=_examples(*xs)
    )
    log = prediction_log_pb2.PredictionLog(
        classify_log=prediction_log_pb2.ClassifyLog(request=request)
    )
    return log.SerializeToString()


def regress_log(signature: str, *xs: float) -> bytes:
    request = regression_pb2.RegressionRequest(model_spec=_spec(signature), input=_examples(*xs))
    log = prediction_log_pb2.PredictionLog(
        regress_log=prediction_log_pb2.RegressLog(request=request)
    )
    return log.SerializeToString()


def multi_inference_log(tasks: Sequence[tuple[str, str]], *xs: float) -> bytes:
    request = inference_pb2.MultiInferenceRequest(input=_examples(*xs))
    for signature, method in tasks:
        request.tasks.add(model_spec=_spec(signature), method_name=method)
    log = prediction_log_pb2.PredictionLog(
        multi_inference_log=prediction_log_pb2.MultiInferenceLog(request=request)
    )
    return log.SerializeToString()


def _classify_signature(method_name: str) -> SignatureDef:
    signature = SignatureDef(method_name=method_name)
    signature.inputs["inputs"].name = "tf_example:0"
    signature.outputs["scores"].name = "scores:0"
    return signature


def test_example_records_run_like_their_requests(tmp_path: Path) -> None:
    """classify/regress/multi_inference records are checked, fed and fetched as TF Serving's
    RunClassify / RunRegress / RunMultiInference do (no "Missing ModelSpec": none is needed)."""
    signatures = {"serving_default": _classify_signature(CLASSIFY)}
    bare = prediction_log_pb2.PredictionLog(
        classify_log=prediction_log_pb2.ClassifyLog(
            request=classification_pb2.ClassificationRequest(input=_examples(1.0, 2.0))
        )
    ).SerializeToString()
    write_warmup(tmp_path, [bare, multi_inference_log([("", CLASSIFY)], 3.0)])
    servable = RecordingServable(signatures)
    assert warmup.run_saved_model_warmup(servable, str(tmp_path)) == 2
    assert servable.runs == [(("tf_example:0",), ("scores:0",))] * 2


def test_example_records_honour_the_method_name_check(tmp_path: Path) -> None:
    """--enable_signature_method_name_check applies to replayed records as to requests."""
    write_warmup(tmp_path, [classify_log("c", 1.0)])
    servable = RecordingServable({"c": _classify_signature("tensorflow/serving/predict")})
    assert warmup.run_saved_model_warmup(servable, str(tmp_path)) == 1  # layout suffices
    with pytest.raises(ServingError) as info:
        warmup.run_saved_model_warmup(servable, str(tmp_path), method_name_check=True)
    assert (info.value.code, info.value.message) == (
        Code.INVALID_ARGUMENT,
        "Expected classification signature method_name to be tensorflow/serving/classify. "
        "Was: tensorflow/serving/predict",
    )


@pytest.fixture(scope="module")
def testdata(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """TF Serving's half_plus_two (:mod:`tf_serving_testdata`), exported once."""
    return export_testdata(tmp_path_factory.mktemp("testdata"))


def _half_plus_two(testdata: Path, destination: Path, records: Sequence[bytes]) -> Path:
    """A copy of half_plus_two/123 with ``records`` as its warmup file."""
    export_dir = destination / "123"
    shutil.copytree(testdata / "half_plus_two" / "123", export_dir)
    write_warmup(export_dir, records)
    return export_dir


#: One record of each replayable log type, for half_plus_two's signatures.
EVERY_LOG_TYPE = (
    classify_log("classify_x_to_y", 2.0),
    regress_log("regress_x_to_y", 2.0, 4.0),
    predict_log([[1.0], [2.0]]),  # serving_default: x [batch, 1] -> y
    multi_inference_log(
        [("regress_x_to_y", REGRESS), ("classify_x_to_y", CLASSIFY)], 1.0, 2.0, 3.0
    ),
)


def _samples(metrics: ServingMetrics) -> dict[str, str]:
    lines = metrics.render().decode().splitlines()
    return dict(line.rsplit(" ", 1) for line in lines if not line.startswith("#"))


def test_every_replayable_log_type_runs_on_the_loaded_session_with_its_metrics(
    testdata: Path, tmp_path: Path
) -> None:
    from serving.servables.tensorflow.servable import Servable

    export_dir = _half_plus_two(testdata, tmp_path / "half_plus_two", EVERY_LOG_TYPE)
    metrics = ServingMetrics()
    options = ModelWarmupOptions(num_request_iterations=2)
    servable = warmup.load_with_warmup(
        Servable.load, str(export_dir), options=options, metrics=metrics
    )
    servable.close()
    samples = _samples(metrics)
    # Each record ran twice, recording what its API records in TF Serving, under the record's
    # model name: runtime_latency for Predict/Classify/Regress, example counts for MultiInference.
    runtime = ":tensorflow:serving:runtime_latency_count"
    for model, api in (
        (WARMUP_MODEL_NAME, "Classify"),
        (WARMUP_MODEL_NAME, "Regress"),
        ("any name: warmup ignores it", "Predict"),  # predict_log's model_spec
    ):
        assert samples[f'{runtime}{{model_name="{model}",API="{api}",runtime="TF1"}}'] == "2"
    examples = f'{{model="{WARMUP_MODEL_NAME}"}}'
    assert samples[f":tensorflow:serving:request_example_count_total{examples}"] == "6"
    assert samples[f":tensorflow:serving:request_example_counts_count{examples}"] == "2"
    warmup_latency = ":tensorflow:serving:model_warmup_latency_count"
    assert samples[f'{warmup_latency}{{model_path="{export_dir}",status="OK"}}'] == "1"


@pytest.mark.parametrize(
    ("record", "code", "message"),
    [
        (
            classify_log("nope", 1.0),
            Code.INVALID_ARGUMENT,
            "No signature was found with the name: nope",
        ),
        (regress_log("regress_x_to_y"), Code.INVALID_ARGUMENT, "Input is empty."),
        (
            multi_inference_log([("regress_x_to_y", REGRESS)] * 2, 1.0),
            Code.INVALID_ARGUMENT,
            "Duplicate evaluation of signature: regress_x_to_y",
        ),
        (
            multi_inference_log([("regress_x_to_y", "tensorflow/serving/predict")], 1.0),
            Code.UNIMPLEMENTED,
            "Unsupported signature method_name: tensorflow/serving/predict",
        ),
        (
            predict_log([[1.0]], "nope"),
            Code.FAILED_PRECONDITION,
            'Serving signature key "nope" not found.',
        ),
    ],
)
def test_a_failing_record_fails_the_load_with_its_requests_error(
    testdata: Path, tmp_path: Path, record: bytes, code: Code, message: str
) -> None:
    from serving.servables.tensorflow.servable import Servable

    export_dir = _half_plus_two(testdata, tmp_path / "half_plus_two", [EVERY_LOG_TYPE[0], record])
    metrics = ServingMetrics()
    with pytest.raises(ServingError) as info:
        warmup.load_with_warmup(Servable.load, str(export_dir), metrics=metrics)
    assert (info.value.code, info.value.message) == (code, message)
    # TF Serving returns before recording model_warmup_latency when a request fails.
    assert not any("model_warmup_latency_count" in key for key in _samples(metrics))


def test_a_reader_error_is_recorded_with_its_status(tmp_path: Path) -> None:
    path = Path(warmup.warmup_file_path(str(tmp_path)))
    path.parent.mkdir()
    path.write_bytes(b"\x00" * 64)
    metrics = ServingMetrics()
    with pytest.raises(ServingError) as info:
        warmup.run_saved_model_warmup(RecordingServable(), str(tmp_path), metrics=metrics)
    assert info.value.code is Code.DATA_LOSS
    key = (
        f':tensorflow:serving:model_warmup_latency_count{{model_path="{tmp_path}",'
        'status="DATA_LOSS: corrupted record at 0 (Is this even a TFRecord file?)"}'
    )
    assert _samples(metrics)[key] == "1"


# ---- real SavedModels --------------------------------------------------------------------------


def test_warmup_runs_on_the_loaded_session(tmp_path: Path) -> None:
    from serving.servables.tensorflow.servable import Servable

    export_dir = export_counter(tmp_path / "counter" / "1", [predict_log([1.0])] * 3)
    options = ModelWarmupOptions(num_request_iterations=2)
    servable = warmup.load_with_warmup(Servable.load, str(export_dir), options=options)
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
    from serving.servables.tensorflow.servable import Servable

    export_dir = REPO / "models" / "fraud" / "1"
    with caplog.at_level(logging.INFO, logger="serving.servables.tensorflow.saved_model_warmup"):
        servable = warmup.load_with_warmup(Servable.load, str(export_dir))
    servable.close()
    assert (
        f"Finished reading warmup data for model at {warmup.warmup_file_path(str(export_dir))}. "
        "Number of warmup records read: 3." in caplog.text
    )


# ---- the server ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def warmup_models(testdata: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("warmup_models")
    export_counter(root / "counter" / "1", [predict_log([1.0]), predict_log([2.0, 3.0])] * 2)
    corrupt = export_counter(root / "corrupt" / "1")
    Path(warmup.warmup_file_path(str(corrupt))).parent.mkdir()
    Path(warmup.warmup_file_path(str(corrupt))).write_bytes(b"\x00" * 64)
    _half_plus_two(testdata, root / "half_plus_two", EVERY_LOG_TYPE)
    _half_plus_two(testdata, root / "bad_classify", [classify_log("nope", 1.0)])
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
            ("fraud", REPO / "models" / "fraud"),
            ("half_plus_two", warmup_models / "half_plus_two"),
            ("bad_classify", warmup_models / "bad_classify"),
        ]
    )
    config.write_text(f"model_config_list {{ {entries}}}")
    monitoring = workdir / "monitoring.config"
    monitoring.write_text('prometheus_config { enable: true path: "/metrics" }')
    log = workdir / "server.log"
    serving = start_test_serving(
        config,
        log,
        monitoring_config_file=monitoring,
        num_request_iterations_for_warmup=2,
        max_num_load_retries=0,
    )
    try:
        wanted = {
            "counter": "AVAILABLE",
            "corrupt": "END",
            "fraud": "AVAILABLE",
            "half_plus_two": "AVAILABLE",
            "bad_classify": "END",
        }
        for name, state in wanted.items():
            serving.wait_for(name, state, READY_DEADLINE_S)
        with httpx.Client(base_url=serving.rest_url, timeout=10.0) as client:
            yield client, log
    finally:
        serving.stop(timeout_s=30)


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
    fraud_warmup = warmup.warmup_file_path(str(REPO / "models" / "fraud" / "1"))
    assert (
        f"Finished reading warmup data for model at {fraud_warmup}. Number of warmup records "
        "read: 3." in log.read_text()
    )
    response = client.post("/v1/models/fraud:predict", json={"instances": [[0.0] * 11]})
    assert response.status_code == 200


def test_server_replays_every_log_type_before_available(server: tuple[httpx.Client, Path]) -> None:
    client, log = server
    body = {"signature_name": "classify_x_to_y", "examples": [{"x": 2.0}]}
    response = client.post("/v1/models/half_plus_two:classify", json=body)
    assert response.json() == {"results": [[["", 3.0]]]}
    assert "Number of warmup records read: 4." in log.read_text()
    page = client.get("/metrics").text
    # --num_request_iterations_for_warmup=2: each record ran twice, under its model name.
    for api in ("Classify", "Regress"):
        assert (
            f':tensorflow:serving:runtime_latency_count{{model_name="{WARMUP_MODEL_NAME}",'
            f'API="{api}",runtime="TF1"}} 2\n' in page
        )
    assert (
        f':tensorflow:serving:request_example_count_total{{model="{WARMUP_MODEL_NAME}"}} 6\n'
        in page
    )
    assert re.search(
        r'^:tensorflow:serving:model_warmup_latency_count\{model_path="[^"]*/half_plus_two/123",'
        r'status="OK"\} 1$',
        page,
        re.MULTILINE,
    )


def test_server_failing_classify_record_fails_only_that_model(
    server: tuple[httpx.Client, Path],
) -> None:
    client, _ = server
    status = client.get("/v1/models/bad_classify").json()["model_version_status"]
    assert status == [
        {
            "version": "123",
            "state": "END",
            "status": {
                "error_code": "INVALID_ARGUMENT",
                "error_message": "No signature was found with the name: nope",
            },
        }
    ]
