"""bench.serving_tier's workload and bookkeeping, h2load's report and the gRPC body framing
(captured output, no network), and both gRPC load generators end to end.

The end-to-end tests run a generator against the benchmark's own no-op gRPC server (real
processes on 127.0.0.1, bounded to a second or two), so the numbers they check come from real
calls; the h2load one skips where h2load is not installed (apt-get install nghttp2-client).
"""

from __future__ import annotations

import json
import shutil
import struct
import sys
from pathlib import Path

import numpy as np
import orjson
import pytest
from tensorflow_serving.apis import predict_pb2

from bench.load import LoadToolError
from bench.processes import SetupError
from bench.serving_tier.counters import ServerCounters, check_server_counts, parse_counters
from bench.serving_tier.grpc_load import check_predict, choose_generator, h2load_load
from bench.serving_tier.h2load import h2load_command, parse_h2load, run_tool
from bench.serving_tier.report import GOAL_GRPC_RPS_ONE_CORE, GOAL_PREDICTIONS_PER_S, goals, table
from bench.serving_tier.result import Run
from bench.serving_tier.runs import ceiling_note
from bench.serving_tier.workload import (
    N_FEATURES,
    PREDICT_METHOD,
    grpc_frame,
    grpc_requests,
    request_batches,
    write_grpc_body,
    write_rest_pool,
)
from tests.support import Process, free_port
from tools.processes import run_to_exit

DATA = Path(__file__).parent / "data"


def test_request_batches_are_distinct_feature_rows() -> None:
    batches = request_batches(4, count=8)
    assert len(batches) == 8
    assert all(batch.shape == (4, N_FEATURES) and batch.dtype == np.float32 for batch in batches)
    assert len({batch.tobytes() for batch in batches}) == 8


def test_grpc_requests_are_official_predict_requests_in_tensor_content() -> None:
    """Serialized with the API's wire-compatible protos, parsed here with TF Serving's own."""
    body = grpc_requests(3)[0]
    request = predict_pb2.PredictRequest.FromString(body)
    assert request.model_spec.name == "fraud"
    assert request.model_spec.signature_name == "serving_default"
    tensor = request.inputs["features"]
    assert [dim.size for dim in tensor.tensor_shape.dim] == [3, N_FEATURES]
    values = np.frombuffer(tensor.tensor_content, "<f4").reshape(3, N_FEATURES)
    np.testing.assert_array_equal(values, request_batches(3)[0])


def test_rest_pool_lines_are_predict_bodies(tmp_path: Path) -> None:
    lines = write_rest_pool(tmp_path / "pool.jsonl", 2).read_bytes().splitlines()
    assert len(lines) == 64
    doc = orjson.loads(lines[0])
    assert np.asarray(doc["instances"]).shape == (2, N_FEATURES)


def test_grpc_frame_is_the_length_prefixed_message() -> None:
    message = grpc_requests(1)[0]
    framed = grpc_frame(message)
    assert framed[0] == 0  # not compressed
    assert struct.unpack(">I", framed[1:5])[0] == len(message)
    assert framed[5:] == message
    assert grpc_frame(b"") == b"\x00\x00\x00\x00\x00"
    assert grpc_frame(b"x" * 258)[:5] == b"\x00\x00\x00\x01\x02"  # big-endian


def test_h2load_body_file_holds_one_framed_predict_request(tmp_path: Path) -> None:
    """The file h2load sends with every call: one frame, an official PredictRequest in it."""
    message = grpc_requests(256)[0]
    body = write_grpc_body(tmp_path / "body.bin", message).read_bytes()
    flag, length = struct.unpack(">BI", body[:5])
    assert (flag, length, len(body)) == (0, len(message), 5 + len(message))
    request = predict_pb2.PredictRequest.FromString(body[5:])
    assert [d.size for d in request.inputs["features"].tensor_shape.dim] == [256, N_FEATURES]


def test_h2load_report_of_a_clean_run() -> None:
    s = parse_h2load((DATA / "h2load_grpc_null_server.txt").read_text())
    assert s.protocol == "h2c"
    assert s.rps == pytest.approx(4221.67)
    assert (s.total, s.started, s.done, s.succeeded) == (12665, 12665, 12665, 12665)
    assert (s.failed, s.errored, s.timeout) == (0, 0, 0)
    assert s.status == {"2xx": 12665, "3xx": 0, "4xx": 0, "5xx": 0}
    assert s.data_bytes == 595071
    assert s.latency_min_ms == pytest.approx(0.357)
    assert s.latency_max_ms == pytest.approx(11.47)
    assert s.latency_mean_ms == pytest.approx(7.58)
    assert s.latency_sd_ms == pytest.approx(1.52)
    assert s.errors == {}
    load = h2load_load(s, duration_s=3.0, load_cpu_cores=0.2)
    assert load.answers == 12665 and load.rps == pytest.approx(12665 / 3.0)
    assert load.p50_ms is None and load.p99_ms is None  # h2load has no percentiles
    assert load.mean_ms == pytest.approx(7.58) and load.max_ms == pytest.approx(11.47)
    assert load.problems == ()


def test_h2load_counts_grpc_errors_as_successes_but_they_carry_no_data() -> None:
    """Every call to an unknown method failed (UNIMPLEMENTED, in trailers): h2load saw 200s."""
    s = parse_h2load((DATA / "h2load_grpc_unimplemented.txt").read_text())
    assert s.succeeded == s.status["2xx"] == 10515 and s.errors == {}
    assert s.data_bytes == 0
    (problem,) = h2load_load(s, duration_s=2.0, load_cpu_cores=0.1).problems
    assert "gRPC errors" in problem


def test_h2load_report_when_nothing_listens() -> None:
    s = parse_h2load((DATA / "h2load_refused.txt").read_text())
    assert s.protocol is None and s.done == 0 and s.rps == 0.0
    load = h2load_load(s, duration_s=2.0, load_cpu_cores=0.0)
    assert load.answers == 0 and load.mean_ms is None and load.max_ms is None
    assert any("no HTTP/2 connection" in p for p in load.problems)
    assert any("no answers" in p for p in load.problems)


def test_h2load_failure_counters_become_errors() -> None:
    text = (DATA / "h2load_grpc_null_server.txt").read_text()
    text = text.replace("0 failed, 0 errored, 0 timeout", "7 failed, 7 errored, 2 timeout")
    text = text.replace("0 4xx, 0 5xx", "0 4xx, 3 5xx")
    s = parse_h2load(text)
    assert s.errors == {"failed": 7, "errored": 7, "timeout": 2, "http 5xx": 3}


def test_h2load_parser_refuses_other_output() -> None:
    with pytest.raises(LoadToolError, match="no report"):
        parse_h2load("h2load: connection refused\n")


def test_h2load_command_is_a_pinned_timed_grpc_closed_loop() -> None:
    command = h2load_command(
        "/usr/bin/h2load",
        "http://127.0.0.1:8500" + PREDICT_METHOD,
        Path("/tmp/body.bin"),
        connections=4,
        streams=8,
        duration_s=5.0,
        warmup_s=1.5,
        cpus=[1],
    )
    assert command[:4] == ["taskset", "-c", "1", "/usr/bin/h2load"]
    for option in (
        "--clients=4",
        "--max-concurrent-streams=8",
        "--threads=1",
        "--duration=5000ms",
        "--warm-up-time=1500ms",
        "--data=/tmp/body.bin",
        "--header=content-type: application/grpc",
        "--header=te: trailers",
    ):
        assert option in command
    assert command[-1] == "http://127.0.0.1:8500/tensorflow.serving.PredictionService/Predict"
    no_warmup = h2load_command(
        "h2load", "http://x/", Path("b"), connections=2, streams=1, duration_s=1, warmup_s=0,
        cpus=[0, 1, 2],
    )
    assert "--threads=2" in no_warmup  # one per CPU, at most one per connection
    assert not any(a.startswith("--warm-up-time") for a in no_warmup)


def test_choose_generator_falls_back_to_python_without_h2load(monkeypatch) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None)
    fallback = choose_generator("auto")
    assert fallback.kind == "python" and fallback.fallback
    assert fallback.label == "grpc.aio (fallback)"
    assert "apt-get install nghttp2-client" in fallback.describe()
    with pytest.raises(SetupError, match="nghttp2-client"):
        choose_generator("h2load")
    monkeypatch.setattr(shutil, "which", lambda name: f"/usr/bin/{name}")
    assert choose_generator("auto").path == "/usr/bin/h2load"
    chosen = choose_generator("python")
    assert chosen.kind == "python" and not chosen.fallback and chosen.label == "grpc.aio"


def test_server_counters_from_a_real_prometheus_page() -> None:
    """Captured from ``python -m serving`` (tuned batching) after 3 good and 5 bad calls; one
    of the bad ones (tensor_content of the wrong size) is refused before the core Predict and
    is not counted at all."""
    counters = parse_counters((DATA / "serving_prometheus_page.txt").read_text())
    assert counters.requests == {
        "OK": 3.0,
        "NOT_FOUND": 1.0,
        "FAILED_PRECONDITION": 1.0,
        "INVALID_ARGUMENT": 2.0,
    }
    assert (counters.batch_sum, counters.batch_count) == (3.0, 3.0)
    assert parse_counters("", model="fraud") == ServerCounters()
    assert parse_counters((DATA / "serving_prometheus_page.txt").read_text(), "x").requests == {}


def _run(protocol: str, cores: int, batching: str, rows: int, rps: float) -> Run:
    return Run(protocol, cores, batching, rows, 32, rps=rps, predictions_per_s=rps * rows)


def test_server_counts_flag_non_ok_answers_and_answers_it_did_not_count() -> None:
    before = ServerCounters(requests={"OK": 100.0})
    clean = _run("gRPC", 1, "tuned", 1, 1000)
    check_server_counts(clean, before, ServerCounters(requests={"OK": 1200.0}), 1000)
    assert clean.server_answers == 1100 and clean.server_errors == {} and clean.flags == []

    errors = _run("gRPC", 1, "tuned", 1, 1000)
    after = ServerCounters(requests={"OK": 1100.0, "RESOURCE_EXHAUSTED": 40.0})
    check_server_counts(errors, before, after, 1000)
    assert errors.server_errors == {"RESOURCE_EXHAUSTED": 40}
    assert errors.flags == ["the server answered 40 Predict calls with a non-OK status"]

    stopped = _run("gRPC", 1, "tuned", 1, 1000)
    after = ServerCounters(requests={"OK": 1200.0, "CANCELLED": 32.0})
    check_server_counts(stopped, before, after, 1000, in_flight=32)
    assert stopped.server_cancelled_at_end == 32 and stopped.server_answers == 1100
    assert stopped.server_errors == {} and stopped.flags == []  # cut off by the generator's stop
    too_many = _run("gRPC", 1, "tuned", 1, 1000)
    after = ServerCounters(requests={"OK": 1200.0, "CANCELLED": 33.0})
    check_server_counts(too_many, before, after, 1000, in_flight=32)
    assert too_many.server_errors == {"CANCELLED": 33} and too_many.flags

    uncounted = _run("gRPC", 1, "tuned", 1, 1000)
    check_server_counts(uncounted, before, ServerCounters(requests={"OK": 600.0}), 1000)
    assert uncounted.server_answers == 500
    assert uncounted.flags == ["the server counted 500 Predict calls, the generator 1000 answers"]


def test_goals_take_the_best_qualifying_runs() -> None:
    runs = [
        _run("gRPC ceiling", 1, "off", 1, 9_000),  # the generator's limit: never a result
        _run("gRPC", 1, "off", 1, 5_000),  # batching off: not the goal's setup
        _run("gRPC", 1, "tuned", 1, GOAL_GRPC_RPS_ONE_CORE + 1),
        _run("gRPC", 2, "tuned", 1, 9_000),  # two cores: not the goal's setup
        _run("REST", 1, "tuned", 256, GOAL_PREDICTIONS_PER_S / 256 - 1),
        _run("gRPC", 2, "tuned", 256, 800),
    ]
    first, second = goals(runs)
    assert first["held"] and first["measured"] == GOAL_GRPC_RPS_ONE_CORE + 1
    assert second["held"] and second["measured"] == 800 * 256
    assert second["where"] == "gRPC, 2 core(s), batching tuned"
    assert not any(goal["held"] for goal in goals(runs[:2]))


def test_goals_leave_flagged_runs_out() -> None:
    flagged = _run("gRPC", 1, "tuned", 1, GOAL_GRPC_RPS_ONE_CORE * 2)
    flagged.flags.append("the server answered 5 Predict calls with a non-OK status")
    trusted = _run("gRPC", 1, "default", 1, 1_000)
    first, _ = goals([flagged, trusted])
    assert first["measured"] == 1_000 and not first["held"]


def test_table_flags_runs_on_a_busy_machine() -> None:
    quiet, busy = _run("REST", 1, "off", 1, 100), _run("REST", 1, "off", 1, 100)
    busy.other_cpu_cores = 0.9
    lines = table([quiet, busy]).splitlines()
    assert "*" not in lines[2] and "0.90*" in lines[3]


def test_table_shows_missing_latencies_as_dashes_and_flagged_runs() -> None:
    run = Run("gRPC", 1, "tuned", 1, 4, 8, generator="h2load", rps=3000, predictions_per_s=3000)
    run.latency_mean_ms, run.latency_max_ms = 10.5, 40.25
    run.server_errors = {"INVALID_ARGUMENT": 3}
    run.flags.append("the server answered 3 Predict calls with a non-OK status")
    text = table([run])
    row = text.splitlines()[2]
    assert "4x8" in row and "h2load" in row
    assert row.split()[8:12] == ["-", "-", "10.50", "40.25"]  # p50, p99, mean, max
    assert "server INVALID_ARGUMENT=3" in row and "FLAGGED" in row
    assert "no latency percentiles" in text
    assert "FLAGGED gRPC, 1 core(s), batching tuned, 1 rows: the server answered" in text


def test_ceiling_note_names_the_limit() -> None:
    busy_generator = _run("gRPC ceiling", 1, "off", 1, 4_000)
    busy_generator.load_cpu_cores = 0.97
    assert ceiling_note(busy_generator) == "no-op server: the load generator's own limit"
    idle_generator = _run("gRPC ceiling", 1, "off", 1, 4_000)
    idle_generator.load_cpu_cores = 0.1
    assert "~40,000 answers/s per core" in ceiling_note(idle_generator)


class _NullServer:
    """The benchmark's no-op gRPC server on a free port, for a generator to call."""

    def __init__(self, tmp_path: Path) -> None:
        self.port = free_port()
        command = [sys.executable, "-m", "bench.serving_tier", "null-server", f"--port={self.port}"]
        self.process = Process(command, tmp_path / "null-server.log")
        self.process.wait_for_log("ready", 60)

    def stop(self) -> None:
        self.process.stop(timeout_s=30)


def test_the_python_load_generator_measures_real_calls(tmp_path: Path) -> None:
    server = _NullServer(tmp_path)
    try:
        done = run_to_exit(
            [
                sys.executable,
                "-m",
                "bench.serving_tier",
                "loadgen",
                f"--target=127.0.0.1:{server.port}",
                "--concurrency=4",
                "--duration=1",
                "--warmup=0.2",
            ],
            timeout_s=90,
        )
        assert done.returncode == 0, done.stderr
    finally:
        server.stop()
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["ok"] > 0 and result["errors"] == {}
    assert result["rps"] == pytest.approx(result["ok"] / result["duration_s"])
    assert 0 < result["min_ms"] <= result["p50_ms"] <= result["p99_ms"] <= result["max_ms"]
    assert result["min_ms"] <= result["mean_ms"] <= result["max_ms"] and result["sd_ms"] >= 0


@pytest.mark.skipif(shutil.which("h2load") is None, reason="h2load not installed")
def test_h2load_drives_real_grpc_calls(tmp_path: Path) -> None:
    """h2load with the benchmark's command and body against the no-op server: answers, each
    with a gRPC message (so not a gRPC error), and a report the parser reads."""
    body = write_grpc_body(tmp_path / "body.bin", grpc_requests(1)[0])
    server = _NullServer(tmp_path)
    try:
        check_predict(f"127.0.0.1:{server.port}", grpc_requests(1)[0], None)
        command = h2load_command(
            shutil.which("h2load") or "h2load",
            f"http://127.0.0.1:{server.port}{PREDICT_METHOD}",
            body,
            connections=2,
            streams=4,
            duration_s=1.0,
            warmup_s=0.2,
            cpus=[],
        )
        text, cpu = run_tool(command, timeout_s=60)
    finally:
        server.stop()
    load = h2load_load(parse_h2load(text), duration_s=1.0, load_cpu_cores=cpu)
    assert load.answers > 0 and load.errors == {} and load.problems == ()
    assert 0 < load.min_ms <= load.mean_ms <= load.max_ms
