"""SIGTERM to a test run stops the processes its fixtures started, and the processes tests
start handle SIGINT and SIGHUP by default even when the run ignores them (tests/conftest.py)."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from tests.support import process_running
from tools.processes import wait_until

REPO = Path(__file__).resolve().parents[2]

# A test whose fixture starts a long-lived child, records its pid, then blocks.
_TEST_FILE = '''
import subprocess, sys, time
from pathlib import Path
import pytest

@pytest.fixture
def child(tmp_path):
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    Path({pid_file!r}).write_text(str(process.pid))
    try:
        yield process
    finally:
        process.terminate()
        process.wait(10)

def test_waits(child):
    time.sleep(300)
'''


def test_sigterm_to_pytest_runs_the_fixtures_teardown(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    (tmp_path / "test_blocks.py").write_text(_TEST_FILE.format(pid_file=str(pid_file)))
    run = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    try:
        wait_until(pid_file.exists, timeout_s=60, what="the fixture's child")
        child = int(pid_file.read_text())
        assert process_running(child)
        run.send_signal(signal.SIGTERM)
        output, _ = run.communicate(timeout=30)
        wait_until(lambda: not process_running(child), timeout_s=10, what="the child's end")
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode != 0, output


# A test that reports how a process it starts handles SIGINT and SIGHUP.
_DISPOSITIONS_TEST = '''
import subprocess, sys
from pathlib import Path

def test_reports():
    out = subprocess.run([sys.executable, "-c",
        "import signal; print(signal.getsignal(signal.SIGINT) is signal.default_int_handler, "
        "signal.getsignal(signal.SIGHUP) is signal.SIG_DFL)"], capture_output=True, text=True)
    Path({out_file!r}).write_text(out.stdout)
'''


def _ignore_sigint_and_sighup() -> None:
    """What `make test &` without job control and `nohup` do to the run."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)


def test_a_run_started_ignoring_sigint_and_sighup_starts_processes_that_handle_them(tmp_path: Path) -> None:
    # run-server.sh and make run, started by tests, must hear the Ctrl-C and SIGHUP the tests send
    out_file = tmp_path / "dispositions.txt"
    (tmp_path / "test_reports.py").write_text(_DISPOSITIONS_TEST.format(out_file=str(out_file)))
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=120, preexec_fn=_ignore_sigint_and_sighup,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-2000:]
    assert out_file.read_text().split() == ["True", "True"]
