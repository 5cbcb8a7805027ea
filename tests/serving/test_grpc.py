"""The gRPC front end's server settings: flags, message limits, UNIX socket, start-up errors.

TF Serving's answers over gRPC are in test_conformance.py. This module starts a gRPC-only
server (``--rest_api_port=0``) with non-default flags and checks what they change; the pure parts
(flag parsing, server arguments, the deadline -> Session timeout rule) are tested directly.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np
import pytest
import tensorflow as tf
from google.protobuf import text_format
from tensorflow_serving.apis import (
    get_model_status_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
)

from serving.model_servers import flags
from serving.model_servers.grpc_server import server_arguments, server_credentials
from serving.model_servers.prediction_service_impl import session_timeout_ms
from serving.protos.tensorflow_serving.config.ssl_config_pb2 import SSLConfig
from serving.util.errors import Code, ServingError
from tests.support import Process
from tools.processes import run_to_exit, serving_command, start_serving

READY_DEADLINE_S = 120.0
RPC_TIMEOUT_S = 10.0
RECEIVE_LIMIT = 65536


# ---- pure ------------------------------------------------------------------------------------


def test_channel_arguments_are_parsed_like_tf_serving() -> None:
    options = flags.parse_flags(
        [
            "--model_base_path=/m",
            "--grpc_channel_arguments=grpc.max_connection_age_ms=2000,grpc.lb_policy_name=grpclb,"
            "grpc.big=99999999999,,",
        ]
    )
    assert flags.grpc_channel_arguments(options) == [
        ("grpc.max_connection_age_ms", 2000),
        ("grpc.lb_policy_name", "grpclb"),
        ("grpc.big", "99999999999"),  # not an int32: passed as a string, as TF Serving does
    ]
    # TF Serving's defaults (INT_MAX both ways; no port sharing), then the flag's arguments...
    assert server_arguments(options) == [
        ("grpc.max_receive_message_length", 2**31 - 1),
        ("grpc.max_send_message_length", 2**31 - 1),
        ("grpc.so_reuseport", 0),
        *flags.grpc_channel_arguments(options),
    ]
    # ... which replace a default of the same key.
    lowered = flags.parse_flags(
        ["--model_base_path=/m", "--grpc_channel_arguments=grpc.max_receive_message_length=1024"]
    )
    assert server_arguments(lowered)[0] == ("grpc.max_receive_message_length", 1024)
    assert len(server_arguments(lowered)) == 3


@pytest.mark.parametrize("value", ["novalue", "=1", "a=1,b"])
def test_malformed_channel_arguments_are_a_flag_error(value: str) -> None:
    with pytest.raises(flags.FlagError, match="--grpc_channel_arguments: expected key=value"):
        flags.parse_flags(["--model_base_path=/m", f"--grpc_channel_arguments={value}"])


class _Deadline:
    """The one thing session_timeout_ms reads from a ServicerContext."""

    def __init__(self, remaining: float | None) -> None:
        self._remaining = remaining

    def time_remaining(self) -> float | None:
        return self._remaining


@pytest.mark.parametrize(
    ("remaining", "timeout_ms"),
    [(None, None), (0.0, None), (-1.0, None), (0.0004, 1), (0.003, 4), (1.5, 2048), (2.0, 2048)],
)
def test_session_timeout_is_the_deadline_rounded_up_to_a_power_of_two(
    remaining: float | None, timeout_ms: int | None
) -> None:
    assert session_timeout_ms(_Deadline(remaining)) == timeout_ms  # type: ignore[arg-type]


# ---- a gRPC-only server with non-default flags ------------------------------------------------


@dataclass
class GrpcOnlyServer:
    proc: Process
    port: int
    socket_path: Path
    channel: grpc.Channel


def _available(channel: grpc.Channel) -> bool:
    request = get_model_status_pb2.GetModelStatusRequest()
    request.model_spec.name = "half_plus_two"
    try:
        response = model_service_pb2_grpc.ModelServiceStub(channel).GetModelStatus(
            request, timeout=1.0
        )
    except grpc.RpcError:
        return False
    return any(
        s.state == get_model_status_pb2.ModelVersionStatus.AVAILABLE
        for s in response.model_version_status
    )


@pytest.fixture(scope="module")
def server(
    serving_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GrpcOnlyServer]:
    workdir = tmp_path_factory.mktemp("grpc")
    socket_path = workdir / "grpc.sock"
    serving = start_serving(
        workdir / "server.log",
        rest_api_port=0,
        grpc_socket_path=socket_path,
        grpc_response_tensor_content=True,
        grpc_channel_arguments=f"grpc.max_receive_message_length={RECEIVE_LIMIT}",
        model_name="half_plus_two",
        model_base_path=serving_model_dir / "half_plus_two",
    )
    proc = serving.process
    channel = grpc.insecure_channel(serving.grpc_target)
    try:
        proc.wait_ready(lambda: _available(channel), READY_DEADLINE_S, "model")
        yield GrpcOnlyServer(proc, serving.grpc_port, socket_path, channel)
    finally:
        channel.close()
        proc.stop()


def _predict(channel: grpc.Channel, x: np.ndarray) -> predict_pb2.PredictResponse:
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "half_plus_two"
    request.inputs["x"].CopyFrom(tf.make_tensor_proto(x))
    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    response: predict_pb2.PredictResponse = stub.Predict(request, timeout=RPC_TIMEOUT_S)
    return response


def test_outputs_in_tensor_content(server: GrpcOnlyServer) -> None:
    response = _predict(server.channel, np.array([1.0, 2.0, 5.0], np.float32))
    y = response.outputs["y"]
    assert y.tensor_content and not y.float_val
    np.testing.assert_array_equal(tf.make_ndarray(y), [2.5, 3.0, 4.5])


def test_unix_socket(server: GrpcOnlyServer) -> None:
    with grpc.insecure_channel(f"unix:{server.socket_path}") as channel:
        response = _predict(channel, np.array([2.0], np.float32))
    np.testing.assert_array_equal(tf.make_ndarray(response.outputs["y"]), [3.0])


def test_channel_arguments_lower_the_receive_limit(server: GrpcOnlyServer) -> None:
    small = np.zeros(RECEIVE_LIMIT // 8, np.float32)
    response = _predict(server.channel, small)
    np.testing.assert_array_equal(tf.make_ndarray(response.outputs["y"]), 2.0)
    with pytest.raises(grpc.RpcError) as info:
        _predict(server.channel, np.zeros(RECEIVE_LIMIT, np.float32))
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_busy_grpc_port_fails_start_up_with_one_line(
    server: GrpcOnlyServer, serving_model_dir: Path
) -> None:
    result = run_to_exit(
        serving_command(
            port=server.port,
            grpc_host="127.0.0.1",
            rest_api_port=0,
            model_name="half_plus_two",
            model_base_path=serving_model_dir / "half_plus_two",
        ),
        timeout_s=120,
    )
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last == (
        "python -m serving: error: Failed to BuildAndStart gRPC server at "
        f"127.0.0.1:{server.port}"
    )


def test_malformed_channel_arguments_fail_fast() -> None:
    result = run_to_exit(serving_command(model_base_path="/m", grpc_channel_arguments="x"))
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "python -m serving: error: --grpc_channel_arguments: expected key=value, got 'x'"
    )


def test_sigterm_with_grpc_only_exits_zero(server: GrpcOnlyServer) -> None:
    """Last: the gRPC-only server drains and exits 0."""
    assert server.proc.stop() == 0


# ---- TLS (--ssl_config_file) -----------------------------------------------------------------


def _self_signed(workdir: Path) -> tuple[str, str]:
    """A throwaway key and certificate for localhost / 127.0.0.1, made with the openssl CLI."""
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is needed to make a test certificate")
    key, cert = workdir / "key.pem", workdir / "cert.pem"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            "-keyout", str(key), "-out", str(cert), "-subj", "/CN=localhost",
            "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )  # fmt: skip
    return key.read_text(), cert.read_text()


def test_bad_ssl_config_is_a_clear_error(tmp_path: Path) -> None:
    garbage = tmp_path / "ssl.config"
    garbage.write_text("server_key: ")
    with pytest.raises(ServingError) as info:
        server_credentials(str(garbage))
    assert info.value.code is Code.INVALID_ARGUMENT
    assert info.value.message.startswith(f"Invalid protobuf file: '{garbage}'")
    no_ca = tmp_path / "no_ca.config"
    no_ca.write_text('server_key: "k" server_cert: "c" client_verify: true')
    with pytest.raises(ServingError, match="Invalid SSL config"):
        server_credentials(str(no_ca))
    assert server_credentials("") is None


def test_tls_with_ssl_config_file(serving_model_dir: Path, tmp_path: Path) -> None:
    key, cert = _self_signed(tmp_path)
    ssl_config = tmp_path / "ssl.config"
    ssl_config.write_text(text_format.MessageToString(SSLConfig(server_key=key, server_cert=cert)))
    serving = start_serving(
        tmp_path / "server.log",
        rest_api_port=0,
        ssl_config_file=ssl_config,
        model_name="half_plus_two",
        model_base_path=serving_model_dir / "half_plus_two",
    )
    proc, port = serving.process, serving.grpc_port
    credentials = grpc.ssl_channel_credentials(root_certificates=cert.encode())
    secure = grpc.secure_channel(f"127.0.0.1:{port}", credentials)
    try:
        proc.wait_ready(lambda: _available(secure), READY_DEADLINE_S, "TLS model")
        response = _predict(secure, np.array([2.0], np.float32))
        np.testing.assert_array_equal(tf.make_ndarray(response.outputs["y"]), [3.0])
        with grpc.insecure_channel(f"127.0.0.1:{port}") as plaintext:
            with pytest.raises(grpc.RpcError) as info:
                _predict(plaintext, np.array([2.0], np.float32))
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        secure.close()
        assert proc.stop() == 0
