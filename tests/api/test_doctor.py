"""`python -m api.ops.doctor` on good and bad configurations."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from api.ops.doctor import blocking_calls, main, serving_flag
from tests.support import EXAMPLE_ROUTES, REPO

GOOD_CONFIG = REPO / "gunicorn.conf.py"

BAD_APP = textwrap.dedent(
    """
    import subprocess
    import time

    from fastapi import FastAPI


    def create() -> FastAPI:
        app = FastAPI()

        @app.get("/sleepy")
        async def sleepy() -> dict:
            time.sleep(0.3)
            return {}

        @app.post("/io")
        async def io(model: object = None) -> dict:
            with open("/etc/hostname") as f:
                f.read()
            subprocess.run(["true"])
            model.predict([[1.0]])
            return {}

        @app.get("/fine")
        async def fine(model: object = None) -> dict:
            import asyncio

            await asyncio.sleep(0.1)
            await model.predict([[1.0]])

            def in_a_thread() -> None:
                time.sleep(1)

            await asyncio.to_thread(in_a_thread)
            return {}

        @app.get("/sync")
        def sync_endpoint() -> dict:
            time.sleep(0.1)
            return {}

        return app
    """
)


def run_doctor(
    capsys: pytest.CaptureFixture[str], *argv: str, env: dict[str, str] | None = None
) -> tuple[int, str]:
    code = main(list(argv), env=env or {})
    return code, capsys.readouterr().out


@pytest.fixture
def bad_app_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "doctor_bad_app.py").write_text(BAD_APP)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "doctor_bad_app:create"


def test_good_configuration_passes(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODEL_ROUTES", EXAMPLE_ROUTES)  # the app is built from the environment
    code, out = run_doctor(
        capsys,
        "--cpus=4",
        "--workers=2",
        "--api-threads=1",
        "--serving-threads=2",
        "--serving-intra-op=1",
        "--serving-inter-op=1",
        "--app=api.app:create_app",
        f"--gunicorn-config={GOOD_CONFIG}",
    )
    assert code == 0, out
    assert "WARN" not in out
    assert "API: 2 workers (--workers) x 1 thread(s) = 2" in out
    assert "serving: 2 session run(s) x intra-op 1, inter-op 1" in out
    assert "OK   [cpu] 4 busy threads fit in 4 CPUs" in out
    assert "OK   [async] no known blocking calls in" in out
    assert "preload_app is on" in out
    assert out.rstrip().endswith("0 warning(s)")


@pytest.mark.parametrize(("cpus", "workers", "serving"), [(2, 1, 1), (4, 2, 2), (6, 3, 3)])
def test_the_one_container_default_fits(
    capsys: pytest.CaptureFixture[str], cpus: int, workers: int, serving: int
) -> None:
    """Nothing set: the budget run-server.sh starts with, which fits from 2 CPUs up."""
    code, out = run_doctor(capsys, f"--cpus={cpus}", "--app=", f"--gunicorn-config={GOOD_CONFIG}")
    assert code == 0, out
    assert f"API: {workers} workers (run-server.sh's CPU budget) x 1 thread(s)" in out
    assert f"serving: {serving} session run(s) x intra-op 1, inter-op 1 (run-server.sh's CPU budget)" in out


def test_one_cpu_cannot_hold_both_tiers(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run_doctor(capsys, "--cpus=1", "--app=", f"--gunicorn-config={GOOD_CONFIG}")
    assert code == 1
    assert "oversubscribed: 2 busy threads on 1 CPUs" in out
    assert "give the container at least 2 CPUs" in out


def test_oversubscription_is_reported(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run_doctor(
        capsys,
        "--cpus=2",
        "--workers=4",
        "--serving-intra-op=2",
        "--serving-inter-op=2",
        "--app=",
        f"--gunicorn-config={GOOD_CONFIG}",
        env={"OMP_NUM_THREADS": "1"},
    )
    assert code == 1
    # 4 API threads + 1 session run x 2 intra-op + 1 inter-op thread beyond the caller's
    assert "WARN [cpu] oversubscribed: 7 busy threads on 2 CPUs (3.5x)" in out


def test_budget_read_from_environment(capsys: pytest.CaptureFixture[str]) -> None:
    env = {
        "WEB_CONCURRENCY": "3",
        "OMP_NUM_THREADS": "1",
        "SERVING_ARGS": "--port=8500 --tensorflow_intra_op_parallelism=2 "
        "--tensorflow_inter_op_parallelism 1 --rest_api_num_threads=2",
    }
    code, out = run_doctor(
        capsys, "--cpus=8", "--app=", f"--gunicorn-config={GOOD_CONFIG}", env=env
    )
    assert code == 0, out
    assert "API: 3 workers (WEB_CONCURRENCY) x 1 thread(s) = 3" in out
    assert "serving: 2 session run(s) x intra-op 2, inter-op 1" in out
    assert "7 busy threads fit in 8 CPUs" in out


def test_serving_default_pools_count_one_thread_per_cpu(capsys: pytest.CaptureFixture[str]) -> None:
    """TensorFlow's defaults (0) and TF Serving's 4 request threads per CPU: far over."""
    env = {
        "WEB_CONCURRENCY": "1",
        "OMP_NUM_THREADS": "1",
        "SERVING_ARGS": "--tensorflow_session_parallelism=0 --rest_api_num_threads=0",
    }
    code, out = run_doctor(
        capsys, "--cpus=4", "--app=", f"--gunicorn-config={GOOD_CONFIG}", env=env
    )
    assert "serving: 16 session run(s) x intra-op 4, inter-op 4" in out
    assert "oversubscribed: 68 busy threads on 4 CPUs" in out
    assert code == 1


def test_batch_threads_come_from_the_parameters_file(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    parameters = tmp_path / "batching.config"
    parameters.write_text("batch_timeout_micros { value: 2000 }\nnum_batch_threads { value: 3 }\n")
    env = {"SERVING_ARGS": f"--enable_batching --batching_parameters_file={parameters}"}
    code, out = run_doctor(capsys, "--cpus=4", "--app=", f"--gunicorn-config={GOOD_CONFIG}", env=env)
    assert "serving: 3 session run(s) x intra-op 1, inter-op 1" in out
    assert "num_batch_threads of the batching parameters file" in out
    assert code == 1  # 2 API workers + 3 batch threads on 4 CPUs


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs")
@pytest.mark.parametrize(("cpus", "code"), [("0", 1), ("0,1", 0)])
def test_make_doctor_under_taskset(cpus: str, code: int) -> None:
    """`python -m api.ops.doctor` as `make doctor` runs it, the CPUs limited by the affinity mask."""
    done = subprocess.run(
        ["taskset", "-c", cpus, sys.executable, "-m", "api.ops.doctor", "--app="],
        cwd=REPO, capture_output=True, text=True, timeout=120,
        env={"PATH": os.environ["PATH"]},
    )
    assert done.returncode == code, done.stdout
    assert f"CPUs available: {len(cpus.split(','))} (no cgroup quota" in done.stdout or \
        "cgroup quota" in done.stdout


def test_blocking_async_endpoints_are_named(
    capsys: pytest.CaptureFixture[str], bad_app_module: str
) -> None:
    code, out = run_doctor(
        capsys,
        "--cpus=8",
        "--workers=1",
        f"--app={bad_app_module}",
        f"--gunicorn-config={GOOD_CONFIG}",
    )
    assert code == 1
    warned = sorted(line for line in out.splitlines() if line.startswith("WARN [async]"))
    assert len(warned) == 4, out
    assert "/sleepy: time.sleep() blocks the event loop in async def sleepy" in warned[3]
    assert [w.split(": ", 1)[1].split(" blocks")[0] for w in warned[:3]] == [
        ".predict()",
        "open()",
        "subprocess.run()",
    ]
    assert "/fine" not in out and "/sync" not in out


def test_blocking_calls_gives_source_lines() -> None:
    async def handler() -> None:
        import time

        time.sleep(1)

    found = blocking_calls(handler)
    line = handler.__code__.co_firstlineno + 3  # the `time.sleep(1)` line
    assert found == [(line, "time.sleep()")]


@pytest.mark.parametrize(
    ("config", "cmd_args", "warns"),
    [
        ('worker_class = "uvicorn_worker.UvicornWorker"\npreload_app = True\n', "", False),
        ('worker_class = "uvicorn_worker.UvicornWorker"\npreload_app = False\n', "", True),
        ('worker_class = "uvicorn_worker.UvicornWorker"\n', "", True),
        ('worker_class = "uvicorn_worker.UvicornWorker"\n', "--preload --workers 2", False),
        ('worker_class = "sync"\npreload_app = True\n', "", True),
    ],
)
def test_gunicorn_config_checks(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, config: str, cmd_args: str, warns: bool
) -> None:
    path = tmp_path / "gunicorn.conf.py"
    path.write_text(config)
    env = {"GUNICORN_CMD_ARGS": cmd_args, "WEB_CONCURRENCY": "1", "OMP_NUM_THREADS": "1"}
    code, out = run_doctor(
        capsys, "--cpus=8", "--serving-intra-op=1", "--serving-inter-op=1", "--app=",
        f"--gunicorn-config={path}", env=env,
    )  # fmt: skip
    assert ("WARN [gunicorn]" in out) is warns, out
    assert code == (1 if warns else 0)


def test_serving_flag_parsing() -> None:
    args = [
        "--port=8500",
        "--tensorflow_intra_op_parallelism",
        "3",
        "--tensorflow_inter_op_parallelism=2",
    ]
    assert serving_flag(args, "tensorflow_intra_op_parallelism") == 3
    assert serving_flag(args, "tensorflow_inter_op_parallelism") == 2
    assert serving_flag(args, "tensorflow_session_parallelism") is None
    with pytest.raises(ValueError):
        serving_flag(["--tensorflow_intra_op_parallelism=lots"], "tensorflow_intra_op_parallelism")


def test_command_line_entry_point() -> None:
    """`python -m api.ops.doctor` as a process: its exit status follows the warnings."""
    common = ["--cpus=4", "--serving-intra-op=1", "--serving-inter-op=1", "--app="]
    good = subprocess.run(
        [sys.executable, "-m", "api.ops.doctor", *common, "--workers=2", "--api-threads=1"],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert good.returncode == 0, good.stdout + good.stderr
    bad = subprocess.run(
        [sys.executable, "-m", "api.ops.doctor", *common, "--workers=8", "--api-threads=1"],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert bad.returncode == 1
    assert "oversubscribed: 10 busy threads on 4 CPUs" in bad.stdout


@pytest.mark.parametrize("cpus", ["0", "-2", "nan", "inf", "abc"])
def test_cpus_must_be_a_positive_number(cpus: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--cpus", cpus, "--app", ""], env={})
    assert exit_info.value.code == 2
    assert "--cpus" in capsys.readouterr().err
