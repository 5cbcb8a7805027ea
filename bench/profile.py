"""Where a setup's CPU goes under saturation: py-spy samples of its Python processes.

py-spy (a sampling profiler that reads the interpreter's stacks from outside, no code
change, `pip install py-spy`) records every process of the setup during a closed-loop
run, in its "raw" collapsed-stack format (one line per distinct stack:
`frame;frame;...;leaf COUNT`, frames as `function (file:line)`). This module groups the
samples two ways:

- by the leaf frame's package (uvicorn, httptools, pydantic, httpx, tensorflow, the
  project's own modules, ...): what the CPU was executing;
- by function, self time (leaf) and total time (anywhere on the stack).

Idle threads (waiting in epoll or on a lock) are not sampled (py-spy's default), so the
shares are shares of busy time; py-spy's idle detection is a heuristic, so some waits
(`Condition.wait`) still show. Time in C code (uvloop, httptools, TensorFlow's kernels)
is charged to the Python frame that called it, e.g. uvloop's loop to `Runner.run`.
Run separately from the measured runs: sampling costs the target some CPU.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.load import run_closed_loop
from bench.processes import taskset
from bench.setups import all_setups

if TYPE_CHECKING:
    from bench.results import BenchResults
    from bench.runner import Runner
    from bench.setups import Setup
    from bench.workload import Workload

PYSPY_INSTALL_HINT = "py-spy is not installed: .venv/bin/pip install py-spy (the bench extra)"
SAMPLE_RATE_HZ = 100
_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")


@dataclass(frozen=True)
class Stack:
    """One collapsed stack and how many samples it got; frames root first."""

    frames: tuple[str, ...]
    count: int


def parse_collapsed(text: str) -> list[Stack]:
    """py-spy's `--format raw` output (Brendan Gregg's collapsed stacks).

    A line with a count and no frames (py-spy writes " 8" for samples of a thread caught
    with no Python frame on its stack) is a stack of no frames: counted in the total, under
    no package or function.

    Raises:
        ValueError: a line does not end in a sample count.
    """
    stacks = []
    for line in text.splitlines():
        if not line.strip():
            continue
        body, _, count = line.rpartition(" ")
        if not count.isdigit():
            raise ValueError(f"not a collapsed-stack line: {line[:120]!r}")
        frames = tuple(body.split(";")) if body.strip() else ()
        stacks.append(Stack(frames, int(count)))
    return stacks


def frame_location(frame: str) -> tuple[str, str]:
    """(function, file) of a py-spy frame "function (file:line)"; file "" if none."""
    match = _FRAME.match(frame.strip())
    if not match:
        return frame.strip(), ""
    return match.group("func"), match.group("file")


PROJECT_PACKAGES = frozenset({"api", "serving", "bench", "models"})


def package_of(path: str) -> str:
    """What a source file belongs to: the top-level package or stdlib module
    ("uvicorn", "asyncio", "threading"), or, for this project's own code, the file's path
    in the repository ("api/inference/served_model.py").

    py-spy prints paths relative to their sys.path entry ("asyncio/runners.py",
    "tensorflow/python/client/session.py"); absolute paths are cut the same way.
    """
    if "site-packages/" in path:
        path = path.split("site-packages/", 1)[1]
    else:
        match = re.search(r"/lib/python3\.\d+/(.+)$", path)
        if match:
            path = match.group(1)
    path = path.lstrip("/")
    if not path:
        return "?"
    first = path.split("/", 1)[0].removesuffix(".py")
    return path if first in PROJECT_PACKAGES else first


def _is_meta(frame: str) -> bool:
    # py-spy's --subprocesses / --threads pseudo-frames
    return frame.startswith(("process ", "thread "))


def leaf_packages(stacks: Iterable[Stack]) -> Counter[str]:
    """Samples per package of the leaf (innermost Python) frame."""
    counts: Counter[str] = Counter()
    for stack in stacks:
        frames = [f for f in stack.frames if not _is_meta(f)]
        if frames:
            counts[package_of(frame_location(frames[-1])[1])] += stack.count
    return counts


def self_functions(stacks: Iterable[Stack]) -> Counter[str]:
    """Samples per leaf function, "function (package)"."""
    counts: Counter[str] = Counter()
    for stack in stacks:
        frames = [f for f in stack.frames if not _is_meta(f)]
        if frames:
            func, path = frame_location(frames[-1])
            counts[f"{func} ({package_of(path)})"] += stack.count
    return counts


def total_functions(stacks: Iterable[Stack], *, project_only: bool = False) -> Counter[str]:
    """Samples per function anywhere on the stack (counted once per stack).

    With `project_only`, only this project's functions (api/, serving/, bench/, models/):
    which of its own code paths the time is spent under, without the framework frames
    every sample shares (gunicorn's arbiter, the event loop).
    """
    counts: Counter[str] = Counter()
    for stack in stacks:
        seen = set()
        for frame in stack.frames:
            if _is_meta(frame):
                continue
            func, path = frame_location(frame)
            package = package_of(path)
            if project_only and package.split("/", 1)[0] not in PROJECT_PACKAGES:
                continue
            key = f"{func} ({package})"
            if key not in seen:
                seen.add(key)
                counts[key] += stack.count
    return counts


def summarize(stacks: list[Stack], top: int = 12) -> dict[str, Any]:
    """Sample count, top leaf packages, top self and total functions, as shares."""
    total = sum(s.count for s in stacks)

    def shares(counter: Counter[str]) -> list[tuple[str, float]]:
        return [(k, round(v / total, 4)) for k, v in counter.most_common(top)] if total else []

    return {
        "samples": total,
        "leaf_packages": shares(leaf_packages(stacks)),
        "self": shares(self_functions(stacks)),
        "project_total": shares(total_functions(stacks, project_only=True)),
    }


def pyspy_path() -> str:
    """The py-spy binary: next to this Python (the venv), else on PATH.

    Raises:
        FileNotFoundError: not installed (the message says how to install it).
    """
    beside = Path(sys.executable).with_name("py-spy")
    if beside.exists():
        return str(beside)
    found = shutil.which("py-spy")
    if found is None:
        raise FileNotFoundError(PYSPY_INSTALL_HINT)
    return found


def profile_setup(runner: Runner, setup: Setup, workload: Workload) -> dict[str, Any]:
    """Start `setup`, drive it closed-loop while py-spy records its process tree, and
    summarise. Raw stacks are kept in the run folder."""
    plan, env = runner.plan, runner.env
    out: dict[str, Any] = {"setup": f"{workload.name}/{setup.name}"}
    with runner.start_setup(setup, workload) as running:
        out["workers"] = running.workers
        load = runner.load_settings(running)
        runner.warm_up(running, load)
        raw = env.run_dir / f"profile-{workload.name}-{setup.name}.txt"
        recorder = subprocess.Popen(
            [
                *taskset(env.load_cpus),
                pyspy_path(),
                "record",
                f"--pid={running.root.pid}",
                "--subprocesses",
                f"--duration={int(plan.profile_s)}",
                f"--rate={SAMPLE_RATE_HZ}",
                "--format=raw",
                f"--output={raw}",
                "--nonblocking",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        runner.say(f"{workload.name}/{setup.name}: profiling with py-spy during a "
                   f"{plan.profile_s:g} s closed loop")
        closed = run_closed_loop(load, connections=plan.closed_connections, duration_s=plan.profile_s)
        out["rps_while_profiled"] = round(closed.achieved_rps, 1)
        try:
            log, _ = recorder.communicate(timeout=plan.profile_s + 30)
        except subprocess.TimeoutExpired:
            recorder.kill()
            log, _ = recorder.communicate()
        if recorder.returncode != 0 or not raw.exists():
            out["processes"] = {"error": (log or b"").decode(errors="replace")[-500:]}
        else:
            out["processes"] = {"raw": raw.name, **summarize(parse_collapsed(raw.read_text()))}
    return out


def profile_headline_split(runner: Runner, results: BenchResults, workload: Workload) -> dict[str, Any]:
    """Profile the headline split of `workload` (see `profile_setup`)."""
    split = results.column(workload.name, "split")
    if split is None or split.status != "ok":
        return {"error": "the headline split was not measured"}
    setup = next(s for s in all_setups() if s.headline)
    try:
        summary = profile_setup(runner, setup, workload)
    except (OSError, RuntimeError) as exc:
        return {"error": str(exc)[:500]}
    write_profile_report(summary, runner.env.run_dir / "profile.md")
    return summary


def profile_markdown(summary: dict[str, Any]) -> str:
    """profile.md: per process, the top leaf packages and functions."""
    lines = [
        f"# Profile of {summary.get('setup')} under a closed loop",
        "",
        f"py-spy, {SAMPLE_RATE_HZ} Hz, busy threads only; {summary.get('workers')} API "
        f"worker(s); {summary.get('rps_while_profiled', '?')} RPS while profiled.",
        "",
    ]
    for name, data in summary.items():
        if not isinstance(data, dict):
            continue
        lines += [f"## {name}", ""]
        if "error" in data:
            lines += [f"py-spy failed: {data['error']}", ""]
            continue
        lines += [f"{data['samples']:,} samples (raw stacks: `{data['raw']}`).", ""]
        for key, title in (
            ("leaf_packages", "Leaf frame's package"),
            ("self", "Self time (leaf function)"),
            ("project_total", "Total time under the project's own functions"),
        ):
            lines += [f"| {title} | share |", "|---|---|"]
            lines += [f"| `{k}` | {v:.1%} |" for k, v in data[key]]
            lines.append("")
    return "\n".join(lines)


def write_profile_report(summary: dict[str, Any], path: Path) -> Path:
    """Write `profile_markdown(summary)` to `path`."""
    path.write_text(profile_markdown(summary))
    return path
