"""``python -m serving`` as a real subprocess on 127.0.0.1, for the lifecycle tests.

Readiness is polled against the REST status API with a deadline (no fixed sleeps); the output
goes to a log file the tests read; :meth:`ServingProcess.stop` sends SIGTERM and returns the
exit code (SIGKILL only if the process does not exit in time).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import httpx

from tests.support import REPO, free_port, wait_until

DEADLINE_S = 90.0


def write_atomically(path: Path, text: str) -> None:
    """Replace ``path`` in one rename, so a poll never reads half a file."""
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(text)
    os.replace(temporary, path)


class ServingProcess:
    """One model server with REST on a free port; ``flags`` are extra command-line flags."""

    def __init__(self, config_file: Path, log_file: Path, *flags: str) -> None:
        self.rest_port = free_port()
        self.log_file = log_file
        self.base_url = f"http://127.0.0.1:{self.rest_port}"
        with log_file.open("wb") as sink:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "serving",
                    f"--port={free_port()}",
                    f"--rest_api_port={self.rest_port}",
                    "--rest_api_host=127.0.0.1",
                    f"--model_config_file={config_file}",
                    "--tensorflow_intra_op_parallelism=1",
                    "--tensorflow_inter_op_parallelism=1",
                    *flags,
                ],
                cwd=REPO,
                stdout=sink,
                stderr=subprocess.STDOUT,
                env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
            )
        self.client = httpx.Client(base_url=self.base_url, timeout=10.0)

    def log(self) -> str:
        return self.log_file.read_text(errors="replace")

    def states(self, model: str) -> dict[int, str]:
        """Version -> state from ``GET /v1/models/{model}`` ({} while unknown or unreachable)."""
        assert self.process.poll() is None, f"server exited:\n{self.log()}"
        try:
            response = self.client.get(f"/v1/models/{model}")
        except httpx.TransportError:
            return {}
        if response.status_code != 200:
            return {}
        return {int(v["version"]): v["state"] for v in response.json()["model_version_status"]}

    def wait_for_states(
        self, model: str, expected: dict[int, str], timeout_s: float = DEADLINE_S
    ) -> None:
        """Wait until each listed version of ``model`` is in its state."""
        wait_until(
            lambda: all(self.states(model).get(v) == s for v, s in expected.items()),
            timeout_s,
            f"{model} {expected} (log:\n{self.log()[-3000:]})",
        )

    def stop(self, signum: int = signal.SIGTERM, timeout_s: float = 60.0) -> int:
        """Send ``signum`` and wait for the exit code."""
        self.client.close()
        if self.process.poll() is None:
            self.process.send_signal(signum)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


def models_config(entries: Sequence[tuple[str, Path, str]]) -> str:
    """A ``model_config_list`` of (name, base path, extra ModelConfig fields) entries."""
    configs = "".join(
        f'  config {{ name: "{name}" base_path: "{path}" model_platform: "tensorflow" {extra} }}\n'
        for name, path, extra in entries
    )
    return f"model_config_list {{\n{configs}}}\n"
