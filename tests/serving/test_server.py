"""End to end: ``python -m serving`` as a real subprocess, driven over HTTP.

The server starts once for the module (readiness is polled with a deadline, no fixed sleeps);
the last test stops it with SIGTERM and checks the exit code.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.serving.serving_testlib import models_config_text
from tests.support import Process, Serving, free_port
from tools.processes import run_to_exit, serving_command, start_serving

READY_DEADLINE_S = 90.0


@dataclass
class Server:
    serving: Serving
    client: httpx.Client
    socket_path: Path | None = None  # --rest_api_socket_path

    @property
    def process(self) -> Process:
        return self.serving.process

    def output(self) -> str:
        return self.serving.log(None)


@pytest.fixture(scope="module")
def server(serving_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    workdir = tmp_path_factory.mktemp("server")
    config = workdir / "models.config"
    config.write_text(models_config_text(serving_model_dir))
    socket_path = workdir / "rest.sock"
    serving = start_serving(
        workdir / "server.log",
        model_config_file=config,
        rest_api_socket_path=socket_path,
        rest_api_num_threads=4,
        tensorflow_intra_op_parallelism=1,
        tensorflow_inter_op_parallelism=1,
        # The config labels versions of "multi" before they are loaded (TF Serving's
        # rule), and "broken" should end at once rather than after 5 retries a minute
        # apart (TF Serving's defaults).
        allow_version_labels_for_unavailable_models=True,
        max_num_load_retries=0,
    )
    with httpx.Client(base_url=serving.rest_url, timeout=10.0) as client:
        try:
            models = ("half_plus_two", "keras_half_plus_two", "multi", "strings")
            serving.wait_available(*models, timeout_s=READY_DEADLINE_S)
            serving.wait_for("broken", "END", READY_DEADLINE_S)
            yield Server(serving, client, socket_path)
        finally:
            serving.stop(timeout_s=30)


def test_the_rest_api_is_also_on_its_unix_socket(server: Server) -> None:
    assert server.socket_path is not None and server.socket_path.is_socket()
    transport = httpx.HTTPTransport(uds=str(server.socket_path))
    with httpx.Client(transport=transport, base_url="http://localhost", timeout=10.0) as client:
        answer = client.post("/v1/models/half_plus_two:predict", json={"instances": [1.0, 2.0]})
        assert answer.status_code == 200, answer.text
        assert answer.json() == {"predictions": [2.5, 3.0]}
        assert client.post("/v1/models/nope:predict", json={"instances": [1.0]}).status_code == 404
    assert "Exporting HTTP/REST API at unix:" in server.output()


def test_status_is_tf_serving_json(server: Server) -> None:
    response = server.client.get("/v1/models/half_plus_two")
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    assert response.json() == {
        "model_version_status": [
            {
                "version": "1",
                "state": "AVAILABLE",
                "status": {"error_code": "OK", "error_message": ""},
            }
        ]
    }


def test_status_of_one_version(server: Server) -> None:
    response = server.client.get("/v1/models/multi/versions/1")
    assert response.status_code == 200
    assert [v["version"] for v in response.json()["model_version_status"]] == ["1"]


def test_status_lists_versions_latest_first(server: Server) -> None:
    response = server.client.get("/v1/models/multi")
    assert [v["version"] for v in response.json()["model_version_status"]] == ["2", "1"]


def test_failed_load_is_end_with_error_while_others_serve(server: Server, serving_model_dir: Path) -> None:
    status = server.client.get("/v1/models/broken").json()["model_version_status"][0]
    assert status["version"] == "1"
    assert status["state"] == "END"
    # TF Serving's reader's words (ReadBinaryProto), the path as text (TensorFlow's Python loader
    # names it as bytes: "Cannot parse file b'...'").
    assert status["status"] == {
        "error_code": "DATA_LOSS",
        "error_message": f"Can't parse {serving_model_dir}/broken/1/saved_model.pb as binary proto",
    }
    response = server.client.post("/v1/models/broken:predict", json={"instances": [1.0]})
    assert response.status_code == 404
    assert response.json() == {"error": "Servable not found for request: Latest(broken)"}


def test_metadata_has_signature_def(server: Server) -> None:
    response = server.client.get("/v1/models/half_plus_two/metadata")
    assert response.status_code == 200
    body = response.json()
    assert body["model_spec"] == {"name": "half_plus_two", "signature_name": "", "version": "1"}
    signature = body["metadata"]["signature_def"]["signature_def"]["serving_default"]
    assert signature["method_name"] == "tensorflow/serving/predict"
    assert signature["inputs"]["x"]["dtype"] == "DT_FLOAT"
    assert signature["inputs"]["x"]["name"] == "x:0"
    assert signature["inputs"]["x"]["tensor_shape"]["dim"] == [{"size": "-1", "name": ""}]
    assert signature["outputs"]["y"]["name"] == "y:0"


def test_row_predict(server: Server) -> None:
    response = server.client.post(
        "/v1/models/half_plus_two:predict", json={"instances": [1.0, 2.0, 5.0]}
    )
    assert response.status_code == 200
    assert response.json() == {"predictions": [2.5, 3.0, 4.5]}


def test_columnar_predict(server: Server) -> None:
    response = server.client.post("/v1/models/half_plus_two:predict", json={"inputs": [1.0, 2.0]})
    assert response.status_code == 200
    assert response.json() == {"outputs": [2.5, 3.0]}


def test_keras_export_predict(server: Server) -> None:
    response = server.client.post(
        "/v1/models/keras_half_plus_two:predict", json={"instances": [[1.0], [2.0], [5.0]]}
    )
    assert response.status_code == 200
    assert response.json() == {"predictions": [[2.5], [3.0], [4.5]]}


def test_versions_and_labels(server: Server) -> None:
    body = {"instances": [2.0]}
    assert server.client.post("/v1/models/half_plus_two/versions/1:predict", json=body).json() == {
        "predictions": [3.0]
    }
    assert server.client.post("/v1/models/multi:predict", json=body).json() == {
        "predictions": [4.0]
    }
    assert server.client.post("/v1/models/multi/versions/1:predict", json=body).json() == {
        "predictions": [3.0]
    }
    assert server.client.post("/v1/models/multi/labels/stable:predict", json=body).json() == {
        "predictions": [3.0]
    }
    assert server.client.post("/v1/models/multi/labels/canary:predict", json=body).json() == {
        "predictions": [4.0]
    }
    response = server.client.post("/v1/models/multi/labels/nope:predict", json=body)
    assert response.status_code == 400
    assert response.json() == {"error": "Unrecognized servable version label: nope"}


def test_unknown_model_is_404(server: Server) -> None:
    response = server.client.post("/v1/models/nope:predict", json={"instances": [1.0]})
    assert response.status_code == 404
    assert response.json() == {"error": "Servable not found for request: Latest(nope)"}
    response = server.client.get("/v1/models/nope")
    assert response.status_code == 404
    assert response.json() == {"error": "Could not find any versions of model nope"}


def test_unknown_version_is_404(server: Server) -> None:
    response = server.client.post(
        "/v1/models/half_plus_two/versions/7:predict", json={"instances": [1.0]}
    )
    assert response.status_code == 404
    assert response.json() == {
        "error": "Servable not found for request: Specific(half_plus_two, 7)"
    }
    response = server.client.get("/v1/models/half_plus_two/versions/7")
    assert response.status_code == 404
    assert response.json() == {"error": "Could not find version 7 of model half_plus_two"}


def test_malformed_json_is_400(server: Server) -> None:
    response = server.client.post(
        "/v1/models/half_plus_two:predict", content=b'{"instances": [1.0, 2.0'
    )
    assert response.status_code == 400
    assert response.json() == {
        "error": "JSON Parse error: Missing a comma or ']' after an array element. at offset: 23"
    }


def test_missing_instances_and_inputs_is_400(server: Server) -> None:
    response = server.client.post("/v1/models/half_plus_two:predict", json={"foo": [1.0]})
    assert response.status_code == 400
    assert response.json() == {"error": "Missing 'inputs' or 'instances' key"}


def test_mismatched_shapes_are_400(server: Server) -> None:
    response = server.client.post(
        "/v1/models/keras_half_plus_two:predict", json={"instances": [[1.0], [2.0, 3.0]]}
    )
    assert response.status_code == 400
    assert response.json() == {
        "error": "Failed to process element: 1 of 'instances' list. Error: INVALID_ARGUMENT: "
        "Expecting tensor size: 1 but got: 2"
    }
    # A dense tensor of the wrong rank reaches TensorFlow, whose error is passed through.
    # Its wording depends on the MatMul kernel TensorFlow picked for this CPU: oneDNN's
    # (TensorFlow turns oneDNN on for CPUs with AVX-512 VNNI and the like) or Eigen's (off, as
    # on many AMD hosts; TF_ENABLE_ONEDNN_OPTS=0 forces that path anywhere).
    response = server.client.post(
        "/v1/models/keras_half_plus_two:predict", json={"inputs": [1.0, 2.0]}
    )
    assert response.status_code == 400
    error = response.json()["error"]
    assert error.startswith(("In[0] is not a matrix", "In[0] and In[1] has different ndims")), error


def test_strings_and_b64(server: Server) -> None:
    response = server.client.post(
        "/v1/models/strings:predict", json={"instances": ["héllo", {"b64": "AAEC"}]}
    )
    assert response.status_code == 200
    assert response.json() == {
        "predictions": [
            {"echo": "héllo", "echo_bytes": {"b64": "aMOpbGxv"}, "length": 6},
            {"echo": "\x00\x01\x02", "echo_bytes": {"b64": "AAEC"}, "length": 3},
        ]
    }


def test_unknown_path_and_method(server: Server) -> None:
    response = server.client.get("/v1/nothing/here")
    assert response.status_code == 400
    assert response.json() == {"error": "Malformed request: GET /v1/nothing/here"}
    response = server.client.get("/healthz")
    assert response.status_code == 404
    assert response.json() == {"error": "Malformed request: GET /healthz"}


def test_sigterm_exits_zero(server: Server) -> None:
    """Runs last in this module: it stops the module's server."""
    server.client.post("/v1/models/half_plus_two:predict", json={"instances": [1.0]})
    server.process.send_signal(signal.SIGTERM)
    assert server.process.wait(30) == 0, server.output()
    assert "Server stopped" in server.output()


def test_bad_flag_fails_with_one_line() -> None:
    result = run_to_exit(serving_command(no_such_flag=1, model_base_path="/models/x"))
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "--no_such_flag" in lines[0]


@pytest.mark.parametrize(
    ("config_text", "expected"),
    [
        (
            "model_config_list { config { name: 'a' base_path: '/m' } bogus: 1 }",
            "Invalid protobuf file",
        ),
        (
            (
                "model_config_list { config { name: 'a' base_path: 'relative'"
                " model_platform: 'tensorflow' } }"
            ),
            "Expected model a to have an absolute path or URI; got base_path()=relative",
        ),
    ],
)
def test_bad_config_file_fails_with_one_line(
    tmp_path: Path, config_text: str, expected: str
) -> None:
    config = tmp_path / "models.config"
    config.write_text(config_text)
    result = run_to_exit(serving_command(rest_api_port=free_port(), model_config_file=config))
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert expected in lines[0]
