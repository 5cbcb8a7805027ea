"""The docs cannot rot: the site builds strictly, its generated pages cover the code, and the
examples of the README and the pages run as written.

- `mkdocs build --strict` (no dead link, no page missing from the nav, no unknown generated part);
- every field of the `Settings` models has a description (the settings page is made of them);
- the README stays a front page (at most 12 KB);
- every ```python block of the pages runs (Sybil);
- every console block marked `<!-- test: run -->` runs on a fresh copy of the repository, in
  the page's order: each `$ ` command with bash, its printed lines checked against the page's
  (a JSON answer key by key, numbers to 1e-4; other lines as substrings, `...` a gap). `make run` is started
  in the background and waited on until it prints its ready line, then stopped with SIGTERM to run-server.sh
  (before the next `make run`, else at the end), and must exit 0.
  Port 8000 becomes a free port (`API_PORT`, and in the commands).
"""

from __future__ import annotations

import inspect
import json
import math
import os
import shutil
import signal
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_args, get_origin

import pytest
from pydantic import BaseModel
from sybil import Sybil
from sybil.parsers.markdown import PythonCodeBlockParser, SkipParser

from api.config.settings import ModelSettings, Settings
from tests.support import REPO, free_port, wait_until

DOCS = REPO / "docs"
PAGES = sorted(DOCS.glob("*.md"))
RUN_MARK = "<!-- test: run -->"
MAKE_RUN_READY_S = 300.0


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    out = subprocess.run(
        [str(REPO / ".venv" / "bin" / "mkdocs"), "build", "--strict", "-d", str(tmp_path / "site")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert out.returncode == 0, out.stderr[-4000:]
    settings = (tmp_path / "site" / "settings" / "index.html").read_text()
    assert "SERVING_ATTEMPT_TIMEOUT_S" in settings and "generated:" not in settings
    assert "DT_UINT16" in (tmp_path / "site" / "model-routes" / "index.html").read_text()


def _fields(model: type[BaseModel], prefix: str = "") -> Iterator[tuple[str, str | None]]:
    for name, info in model.model_fields.items():
        annotation = info.annotation
        if inspect.isclass(annotation) and issubclass(annotation, BaseModel):
            yield from _fields(annotation, f"{prefix}{name}.")
        elif get_origin(annotation) is dict and inspect.isclass(get_args(annotation)[1]):
            yield f"{prefix}{name}", info.description
        else:
            yield f"{prefix}{name}", info.description


def test_every_setting_has_a_description() -> None:
    missing = [name for model in (Settings, ModelSettings) for name, text in _fields(model) if not text]
    assert missing == []


def test_the_readme_is_a_front_page() -> None:
    readme = (REPO / "README.md").read_text()
    assert len(readme.encode()) <= 12 * 1024
    assert "make run" in readme.split("\n## ", 1)[0] and "make test" in readme.split("\n## ", 1)[0]


_sybil = Sybil(parsers=[PythonCodeBlockParser(), SkipParser()])
_PYTHON_EXAMPLES = [
    pytest.param(page, index, id=f"{page.name}:{example.line}")
    for page in [*PAGES, REPO / "README.md"]
    for index, example in enumerate(_sybil.parse(page))
]


@pytest.mark.parametrize(("page", "index"), _PYTHON_EXAMPLES)
def test_python_example_runs(page: Path, index: int) -> None:
    examples = list(_sybil.parse(page))
    for example in examples[: index + 1]:  # the page's earlier blocks first: their names are in scope
        example.evaluate()


@dataclass
class Command:
    line: str
    expected: list[str] = field(default_factory=list)


def runnable_commands(page: Path) -> list[Command]:
    """The `$ ` commands (continuations joined) and their printed lines, of every marked block."""
    commands: list[Command] = []
    for part in page.read_text().split(RUN_MARK)[1:]:
        block = part.split("```", 2)[1]
        pending = ""
        for line in block.splitlines()[1:]:
            stripped = line.strip()
            if pending:
                pending += " " + stripped
            elif stripped.startswith("$ "):
                pending = stripped[2:]
            elif stripped and commands:
                commands[-1].expected.append(stripped)
                continue
            else:
                continue
            if pending.endswith("\\"):
                pending = pending[:-1].rstrip()
            else:
                commands.append(Command(pending))
                pending = ""
    return commands


def fresh_copy(target: Path) -> Path:
    """The repository's files as a clone would have them (tracked and new, not ignored), the venv linked."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = REPO / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)  # mtimes kept: make's install stamp stays newer
    (target / ".venv").symlink_to(REPO / ".venv")
    return target


def _close(a: Any, b: Any) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) or isinstance(b, float):
        return isinstance(a, int | float) and isinstance(b, int | float) and math.isclose(a, b, abs_tol=1e-4)
    return bool(a == b)


def check_output(command: Command, out: str) -> None:
    if not command.expected:
        return
    if command.expected[0].startswith("{"):
        expected = json.loads(" ".join(command.expected))
        assert _close(json.loads(out), expected), f"$ {command.line}\nprinted: {out}\nthe docs say: {expected}"
        return
    for line in command.expected:
        if line == "...":  # the page leaves lines out here
            continue
        assert line in out, f"$ {command.line}\nprinted:\n{out[-4000:]}\nthe docs say: {line}"


def _printed_or_exited(log: Path, lines: list[str], proc: subprocess.Popen[bytes]) -> Callable[[], bool]:
    return lambda: all(e in log.read_text(errors="replace") for e in lines) or proc.poll() is not None


def _run_server_pid(group: int) -> int | None:
    """The run-server.sh that `make run` started in process group `group` (not its subshells)."""

    def stat(pid: str) -> tuple[int, int, str]:  # parent, group, command line
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[1]), int(fields[2]), Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")

    found: dict[int, tuple[int, int, str]] = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            found[int(pid)] = stat(pid)
        except OSError:
            continue  # gone meanwhile

    def runs_the_script(cmdline: str) -> bool:  # bash ./run-server.sh, not make's `sh -c "... ./run-server.sh"`
        args = cmdline.split("\0")
        return len(args) > 1 and args[1].endswith("run-server.sh")

    for pid, (parent, pgid, cmdline) in found.items():
        if pgid == group and runs_the_script(cmdline) and not runs_the_script(found.get(parent, (0, 0, ""))[2]):
            return pid
    return None


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Stop a `make run` as a supervisor does (SIGTERM to run-server.sh; make then exits 0)."""
    supervisor = _run_server_pid(proc.pid)
    if proc.poll() is None:
        if supervisor is not None:
            os.kill(supervisor, signal.SIGTERM)
        else:  # without the script: the whole group
            os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    try:  # nothing of the group may outlive the test (a tier left behind)
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def run_page(page: Path, workdir: Path) -> None:
    port = free_port()
    env = {
        **os.environ,
        "API_PORT": str(port),
        "REST_API_PORT": str(free_port()),
        "GRPC_PORT": str(free_port()),
        "EVENTS_JSONL_PATH": str(workdir / "events.jsonl"),
    }
    env.pop("MAKEFLAGS", None)
    background: list[subprocess.Popen[bytes]] = []
    try:
        for command in runnable_commands(page):
            line = command.line.replace("127.0.0.1:8000", f"127.0.0.1:{port}")
            expected = [e.replace("127.0.0.1:8000", f"127.0.0.1:{port}") for e in command.expected]
            if line.endswith("make run"):
                expected = expected or ["run-server: API ready on"]
                for earlier in background:  # the user stopped the last one (Ctrl-C) before this
                    _stop(earlier)
                log = workdir / f"make-run-{len(background)}.log"
                with log.open("wb") as sink:
                    proc = subprocess.Popen(
                        ["bash", "-c", line], cwd=workdir, env=env, stdout=sink, stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )  # fmt: skip
                background.append(proc)
                wait_until(
                    _printed_or_exited(log, expected, proc),
                    MAKE_RUN_READY_S,
                    f"$ {line}",
                )
                assert proc.poll() is None, f"$ {line} exited {proc.returncode}:\n{log.read_text()[-4000:]}"
                continue
            out = subprocess.run(
                ["bash", "-c", line], cwd=workdir, env=env, capture_output=True, text=True, timeout=600
            )
            assert out.returncode == 0, f"$ {line}\nexit {out.returncode}:\n{out.stdout[-2000:]}{out.stderr[-4000:]}"
            check_output(Command(line, expected), out.stdout)
    finally:
        for proc in background:
            _stop(proc)
    for proc in background:
        assert proc.returncode == 0, f"make run exited {proc.returncode} on SIGTERM"


RUNNABLE = [p for p in [REPO / "README.md", *PAGES] if RUN_MARK in p.read_text()]


def test_runnable_blocks_are_found() -> None:
    names = {p.name for p in RUNNABLE}
    assert {"README.md", "own-model.md", "deploying.md"} <= names
    assert [c.line for c in runnable_commands(REPO / "README.md")][0] == "make run"


@pytest.mark.parametrize("page", RUNNABLE, ids=[p.name for p in RUNNABLE])
def test_runnable_blocks_run_on_a_fresh_copy(page: Path, tmp_path: Path) -> None:
    if "kubectl " in page.read_text() and shutil.which("kubectl") is None:
        pytest.skip("needs kubectl (kustomize) on PATH")
    workdir = fresh_copy(tmp_path / "repo")
    run_page(workdir / page.relative_to(REPO), workdir)
