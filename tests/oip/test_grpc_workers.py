"""The OIP gRPC port under gunicorn: every worker serves it on the same port (SO_REUSEPORT).

gunicorn with two workers in front of the example serving tier, real processes. Each call goes
on a connection of its own; which worker took a connection is read from /proc: the worker whose
file descriptors hold the server side of that TCP connection (the kernel spreads connections
over the listeners of a SO_REUSEPORT port).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import grpc

from api.protos.inference import open_inference_grpc_pb2 as pb
from api.protos.inference import open_inference_grpc_pb2_grpc as pb_grpc
from tests.support import Serving, children_running, free_port, http_ok, start_gunicorn

#: Connections opened at most: with two listeners the chance that all go to one is 2^-(n-1).
MAX_CONNECTIONS = 40
FEATURES = [2.7, -0.2, 0.0, 3.1, 1.0, 0.0, -0.25, -0.97, 0.0, 0.0, 8.1]
_ESTABLISHED, _LISTEN = "01", "0A"


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    with contextlib.suppress(FileNotFoundError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(FileNotFoundError):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
    return inodes


def _tcp(pid: int) -> list[tuple[int, int, str, str]]:
    """(local port, remote port, state, inode) of the TCP sockets of `pid`'s network namespace,
    IPv4 and IPv6 (gRPC listens on an IPv6 socket, `::ffff:127.0.0.1`, even for 127.0.0.1)."""
    rows = []
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            local, remote = fields[1].rsplit(":", 1)[1], fields[2].rsplit(":", 1)[1]
            rows.append((int(local, 16), int(remote, 16), fields[3], fields[9]))
    return rows


def _listens(pid: int, port: int) -> bool:
    inodes = _socket_inodes(pid)
    return any(p == port and state == _LISTEN and inode in inodes for p, _, state, inode in _tcp(pid))


def _connections_by_worker(workers: set[int], port: int) -> dict[int, set[int]]:
    """Worker pid -> the client ports of the established connections it holds on `port`."""
    owned: dict[int, set[int]] = {}
    for pid in workers:
        inodes = _socket_inodes(pid)
        owned[pid] = {
            remote
            for local, remote, state, inode in _tcp(pid)
            if local == port and state == _ESTABLISHED and inode in inodes
        }
    return owned


def test_two_workers_share_the_grpc_port_and_both_answer_model_infer(example_serving: Serving, tmp_path: Path) -> None:
    port, grpc_port = free_port(), free_port()
    api = start_gunicorn(
        tmp_path / "gunicorn.log",
        API_BIND=f"127.0.0.1:{port}",
        WEB_CONCURRENCY="2",
        SERVING_URL=example_serving.rest_url,
        OIP__MODELS="fraud",
        OIP__GRPC_PORT=str(grpc_port),
        OIP__GRPC_HOST="127.0.0.1",
        PROMETHEUS_MULTIPROC_DIR=str(tmp_path / "prometheus"),
    )
    channels: list[grpc.Channel] = []
    try:

        def both_listening() -> bool:
            workers = children_running(api.pid, "gunicorn")
            return (
                http_ok(f"http://127.0.0.1:{port}/readyz")
                and len(workers) == 2
                and all(_listens(pid, grpc_port) for pid in workers)
            )

        api.wait_ready(both_listening, 60, "2 workers, each listening on the OIP gRPC port")
        workers = children_running(api.pid, "gunicorn")
        assert not _listens(api.pid, grpc_port)  # the master serves no gRPC: each worker does
        request = pb.ModelInferRequest(
            model_name="fraud",
            id="w",
            inputs=[
                pb.ModelInferRequest.InferInputTensor(
                    name="features",
                    datatype="FP32",
                    shape=[1, len(FEATURES)],
                    contents=pb.InferTensorContents(fp32_contents=FEATURES),
                )
            ],
        )
        answered: list[float] = []
        owners: dict[int, set[int]] = {}
        while len(channels) < MAX_CONNECTIONS:
            # A local subchannel pool: a channel of its own connection, never one shared with
            # the channels before it (gRPC shares subchannels between equal channels otherwise).
            channel = grpc.insecure_channel(f"127.0.0.1:{grpc_port}", options=[("grpc.use_local_subchannel_pool", 1)])
            channels.append(channel)  # kept open: its connection stays visible in /proc
            reply = pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=10)
            assert reply.model_name == "fraud" and reply.id == "w"
            (output,) = reply.outputs
            assert output.name == "fraud_score" and list(output.shape) == [1, 1]
            answered.append(output.contents.fp32_contents[0])
            owners = _connections_by_worker(workers, grpc_port)
            if all(owners.values()):
                break
        # Every connection made a ModelInfer that was answered, and each worker holds some of them.
        assert all(owners.values()), (owners, len(channels))
        assert sum(len(ports) for ports in owners.values()) == len(channels), owners
        assert len(set(answered)) == 1 and 0.0 <= answered[0] <= 1.0  # the same tensor, the same score
    finally:
        for channel in channels:
            channel.close()
        api.stop()
