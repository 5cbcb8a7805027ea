"""Helpers for tests that start real processes on loopback.

The processes themselves, their command lines, `free_port` and `wait_until` are
`tools.processes`' (shared with the benchmark), re-exported here for the tests; this module
adds what only tests need: the example models' config, the API's starters as the tests run
them, and child-process lookups. Fixtures that start them are in the `conftest.py` files.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tools.processes import (
    REPO,
    Process,
    Serving,
    api_command,
    free_port,
    gunicorn_command,
    http_ok,
    run_server_command,
    start_serving,
    wait_until,
)

__all__ = [
    "EXAMPLE_ROUTES",
    "REPO",
    "Process",
    "Serving",
    "children_running",
    "free_port",
    "http_ok",
    "local_models_config",
    "ops_url",
    "start_api",
    "start_example_serving",
    "start_gunicorn",
    "run_server_env",
    "start_run_server",
    "wait_run_server",
    "wait_until",
]

# The example routes (examples/), as `make run` enables them; the API processes below serve them
# unless a test sets MODEL_ROUTES itself.
EXAMPLE_ROUTES = "examples.fraud.route:route,examples.digits.route:route"

#: How long run-server.sh may take to say "API ready": serving's TensorFlow import and model
#: loads, then the API's workers.
RUN_SERVER_READY_S = 180.0


def children_running(pid: int, module: str) -> set[int]:
    """The live child processes of ``pid`` whose command line names ``module`` (``-m module``),
    from ``/proc/<pid>/task/*/children``."""
    pids = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(FileNotFoundError):  # threads and processes come and go
            for child in (task / "children").read_text().split():
                with contextlib.suppress(FileNotFoundError):
                    if module.encode() in Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0"):
                        pids.add(int(child))
    return pids


def process_running(pid: int) -> bool:
    """`pid` exists and has not exited: a zombie (exited, its parent has not reaped it yet)
    counts as gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def local_models_config(tmp_dir: Path) -> Path:
    """models.config with its /models/ prefix pointed at this checkout's models/."""
    text = (REPO / "models.config").read_text().replace('"/models/', f'"{REPO}/models/')
    path = tmp_dir / "models.config"
    path.write_text(text)
    return path


def start_example_serving(tmp_dir: Path, log_name: str = "serving.log", **flags: Any) -> Serving:
    """`python -m serving` on this checkout's models.config (fraud, digits) with `flags`
    (`tools.processes.start_serving`), without waiting (`Serving.wait_available`)."""
    config = local_models_config(tmp_dir)
    return start_serving(tmp_dir / log_name, model_config_file=config, **flags)


def start_api(port: int, serving_url: str, log_path: Path, **env: str) -> Process:
    """One uvicorn process serving `api.app:create_app` on 127.0.0.1 (`api_command`)."""
    return Process(api_command(port), log_path, env={"SERVING_URL": serving_url, "MODEL_ROUTES": EXAMPLE_ROUTES, **env})


def start_gunicorn(log_path: Path, *, prefix: Sequence[str] = (), **env: str) -> Process:
    """The API under gunicorn as deployed (`gunicorn_command`; bind it with API_BIND);
    `prefix` goes before the command (e.g. `prlimit --nofile=512:`). Its operational port
    (`/metrics`, `/docs`) is on a free loopback port unless API_OPS_BIND says otherwise:
    `ops_url(process)`."""
    env = {"API_OPS_BIND": f"127.0.0.1:{free_port()}", **env}
    proc = Process([*prefix, *gunicorn_command()], log_path, env={"MODEL_ROUTES": EXAMPLE_ROUTES, **env})
    proc.ops_bind = env["API_OPS_BIND"]  # type: ignore[attr-defined]  # read by ops_url
    return proc


def ops_url(proc: Process) -> str:
    """`http://host:port` of the operational port of a gunicorn started by `start_gunicorn`."""
    return f"http://{proc.ops_bind}"  # type: ignore[attr-defined]


def run_server_env(**overrides: str) -> dict[str, str]:
    """run-server.sh's settings for a test: this checkout's models and interpreter, free ports
    on loopback for the API, serving's REST and gRPC (serving's REST bound to 127.0.0.1 too),
    then `overrides`."""
    return {
        "MODELS_DIR": str(REPO / "models"),
        "PYTHON": sys.executable,
        "API_PORT": str(free_port()),
        "API_HOST": "127.0.0.1",
        "API_OPS_BIND": f"127.0.0.1:{free_port()}",
        "REST_API_PORT": str(free_port()),
        "GRPC_PORT": str(free_port()),
        "SERVING_ARGS": "--rest_api_host=127.0.0.1",
        **overrides,
    }


def start_run_server(log_path: Path, *, prefix: Sequence[str] = (), **env: str) -> Process:
    """`run-server.sh` (`run_server_command`) with `env`, without waiting (`wait_run_server`)."""
    return Process([*prefix, *run_server_command()], log_path, env=env)


def wait_run_server(proc: Process, timeout_s: float = RUN_SERVER_READY_S) -> None:
    """Wait until run-server.sh says the API is ready; fails at once if it exits."""
    proc.wait_for_log("API ready", timeout_s)
