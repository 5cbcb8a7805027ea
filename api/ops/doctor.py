"""`python -m api.ops.doctor`: checks a deployment's CPU budget and the API's async hygiene.

    python -m api.ops.doctor                                  # from the environment
    python -m api.ops.doctor --workers 2 --serving-threads 1 --serving-intra-op 1 --serving-inter-op 1
    python -m api.ops.doctor --cpus 4 --app api.app:create_app --gunicorn-config gunicorn.conf.py

Three checks, each line `OK`, `WARN` or `INFO`; exit status 1 when any check warns, so it
can gate a CI job or a container start:

1. CPU budget across both tiers against the quota (`api.ops.cpu_budget`: cgroup v2/v1 and
   affinity). Busy threads = API workers x threads per worker + serving's: Session runs at
   once (`--rest_api_num_threads`, or `num_batch_threads` with `--enable_batching`) x
   intra-op threads each (`--tensorflow_intra_op_parallelism`), plus the inter-op pool
   beyond one thread (`--tensorflow_inter_op_parallelism`; with one, a run executes on its
   calling thread), an upper bound. More busy threads than CPUs means they take turns:
   latency grows and throughput does not.
   Sources, first found wins: the flags below; `WEB_CONCURRENCY`, `OMP_NUM_THREADS` and
   the model-server flags in `SERVING_ARGS` (and its `--batching_parameters_file`); the
   one-container budget `run-server.sh` starts with (`api.ops.cpu_budget.one_container_budget`),
   so `make doctor` with nothing set checks the default deployment.
2. Blocking calls in `async def` endpoints: the app is built from the environment (the
   routes `MODEL_ROUTES` names; `make doctor` enables the examples unless it is set), with
   no lifespan and no I/O, and each `async def` endpoint's source is parsed with `ast`,
   flagging calls that hold the event loop (time.sleep, requests.*, urllib, sync httpx,
   open(), subprocess.*, os.system, Path.read_*/write_*, and a `.predict(` that is not
   awaited). Calls inside nested functions are skipped (they may be sent to a thread). A
   static check: it sees only the endpoint's own body, not what it calls.
3. The gunicorn config sets `preload_app = True` (parsed, not executed) or
   `GUNICORN_CMD_ARGS` has `--preload`, and uses the uvicorn worker class.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import inspect
import math
import os
import shlex
import sys
import textwrap
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TextIO

from api.ops.cpu_budget import (
    CGROUP_ROOT,
    affinity_cpus,
    available_cpus,
    cgroup_cpu_quota,
    flag_value,
    num_batch_threads,
    one_container_budget,
)

# Dotted call names that block the calling thread; prefixes end with ".".
BLOCKING_CALLS: Final = frozenset(
    {
        "time.sleep",
        "open",
        "input",
        "os.system",
        "os.popen",
        "os.wait",
        "os.waitpid",
        "urlopen",
        "socket.create_connection",
        "httpx.get",
        "httpx.post",
        "httpx.put",
        "httpx.patch",
        "httpx.delete",
        "httpx.head",
        "httpx.request",
        "httpx.stream",
        "httpx.Client",
    }
)
BLOCKING_PREFIXES: Final = ("requests.", "urllib.", "subprocess.")
# Method names that block whatever object they are called on (file I/O, Keras).
BLOCKING_METHODS: Final = frozenset(
    {"predict", "read_text", "read_bytes", "write_text", "write_bytes"}
)


@dataclass(frozen=True)
class Finding:
    """One line of the report: level is OK, WARN or INFO."""

    level: str
    check: str
    message: str


# --- 1. CPU budget ----------------------------------------------------------------------


@dataclass(frozen=True)
class CpuBudget:
    """Threads that may be busy at once across both tiers, against the CPUs available."""

    cpus: float
    cpus_source: str
    workers: int
    workers_source: str
    threads_per_worker: int
    serving_session_threads: int  # Session runs at once
    serving_intra_op: int
    serving_inter_op: int
    serving_source: str

    @property
    def api_threads(self) -> int:
        return self.workers * self.threads_per_worker

    @property
    def serving_threads(self) -> int:
        """Session runs x intra-op threads, plus inter-op threads beyond the calling one."""
        return self.serving_session_threads * self.serving_intra_op + max(
            0, self.serving_inter_op - 1
        )

    @property
    def total(self) -> int:
        return self.api_threads + self.serving_threads


def serving_flag(args: Sequence[str], name: str) -> int | None:
    """Value of `--name=N` / `--name N` in model-server arguments, or None when absent.

    Raises:
        ValueError: the flag is there with a value that is not an integer.
    """
    value = flag_value(args, name)
    return None if value is None else int(value)


def _batch_threads(serving_args: Sequence[str]) -> int | None:
    """num_batch_threads from SERVING_ARGS' parameters file, when batching is on and it sets
    one; None otherwise (batching off, no file, or the file does not say)."""
    enabled = flag_value(serving_args, "enable_batching")
    if enabled is None or enabled.lower() in ("false", "0"):
        return None
    path = flag_value(serving_args, "batching_parameters_file")
    if not path:
        return None
    try:
        return num_batch_threads(Path(path).read_text())
    except OSError:
        return None


def cpu_budget(
    *,
    env: Mapping[str, str],
    cpus: float | None = None,
    workers: int | None = None,
    api_threads: int | None = None,
    serving_intra_op: int | None = None,
    serving_inter_op: int | None = None,
    serving_threads: int | None = None,
    cgroup_root: Path = CGROUP_ROOT,
) -> CpuBudget:
    """Work out the budget from explicit values, then `env`, then run-server.sh's default.

    A serving pool size of 0 (TensorFlow's default) counts as one thread per CPU.

    Raises:
        ValueError: an environment value is malformed.
    """
    if cpus is not None:
        usable, whole_cpus, cpus_source = cpus, max(1, math.ceil(cpus)), "--cpus"
    else:
        quota, affinity = cgroup_cpu_quota(cgroup_root), affinity_cpus()
        usable = min(float(affinity), quota) if quota is not None else float(affinity)
        whole_cpus = available_cpus(cgroup_root)
        cpus_source = (
            f"cgroup quota {quota:g}, affinity {affinity}"
            if quota is not None
            else f"no cgroup quota, affinity {affinity}"
        )
    default = one_container_budget(whole_cpus, env)

    if workers is not None:
        workers_source = "--workers"
    elif env.get("WEB_CONCURRENCY", "").strip():
        workers, workers_source = default.api_workers, "WEB_CONCURRENCY"
    else:
        workers, workers_source = default.api_workers, "run-server.sh's CPU budget"
    if api_threads is None:
        omp = env.get("OMP_NUM_THREADS", "").strip()
        api_threads = int(omp) if omp else default.api_threads_per_worker

    serving_args = shlex.split(env.get("SERVING_ARGS", ""))
    session = serving_flag(serving_args, "tensorflow_session_parallelism")
    sources = []

    def pick(explicit: int | None, flag: str, budget_value: int, label: str) -> int:
        if explicit is not None:
            sources.append(f"{label} from the command line")
            return explicit or whole_cpus
        value = serving_flag(serving_args, flag)
        if value is None and flag.endswith("_op_parallelism") and session is not None:
            value = session
        if value is not None:
            sources.append(f"{label} from SERVING_ARGS")
            return value or (4 * whole_cpus if flag == "rest_api_num_threads" else whole_cpus)
        return budget_value

    intra = pick(serving_intra_op, "tensorflow_intra_op_parallelism", default.serving_intra_op,
                 "intra-op")
    inter = pick(serving_inter_op, "tensorflow_inter_op_parallelism", default.serving_inter_op,
                 "inter-op")
    batch = _batch_threads(serving_args) if serving_threads is None else None
    if batch is not None:
        runs = batch
        sources.append("session runs: num_batch_threads of the batching parameters file")
    else:
        runs = pick(serving_threads, "rest_api_num_threads", default.serving_session_threads,
                    "session runs")
    serving_source = ", ".join(sources) or "run-server.sh's CPU budget"
    return CpuBudget(
        cpus=usable,
        cpus_source=cpus_source,
        workers=workers,
        workers_source=workers_source,
        threads_per_worker=api_threads,
        serving_session_threads=runs,
        serving_intra_op=intra,
        serving_inter_op=inter,
        serving_source=serving_source,
    )


def check_cpu_budget(budget: CpuBudget) -> list[Finding]:
    """Report the budget; WARN when busy threads exceed the CPUs."""
    b = budget
    lines = [
        Finding("INFO", "cpu", f"CPUs available: {b.cpus:g} ({b.cpus_source})"),
        Finding(
            "INFO",
            "cpu",
            f"API: {b.workers} workers ({b.workers_source}) x {b.threads_per_worker} "
            f"thread(s) = {b.api_threads}",
        ),
        Finding(
            "INFO",
            "cpu",
            f"serving: {b.serving_session_threads} session run(s) x intra-op {b.serving_intra_op}"
            f", inter-op {b.serving_inter_op} ({b.serving_source}) = {b.serving_threads}",
        ),
    ]
    if b.total > b.cpus:
        advice = (
            "one CPU cannot hold both tiers without their taking turns: give the container "
            "at least 2 CPUs"
            if b.cpus < 2
            else "lower WEB_CONCURRENCY or serving's --rest_api_num_threads / "
            "--tensorflow_intra_op_parallelism / --tensorflow_inter_op_parallelism "
            "(run-server.sh sizes them when they are not set)"
        )
        lines.append(
            Finding(
                "WARN",
                "cpu",
                f"oversubscribed: {b.total} busy threads on {b.cpus:g} CPUs "
                f"({b.total / b.cpus:.1f}x); {advice}",
            )
        )
    else:
        lines.append(Finding("OK", "cpu", f"{b.total} busy threads fit in {b.cpus:g} CPUs"))
    return lines


# --- 2. Blocking calls in async endpoints -------------------------------------------------


def _dotted(node: ast.expr) -> str | None:
    """`a.b.c` for a Name/Attribute chain, else None."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def _calls_outside_nested_functions(body: Sequence[ast.stmt]) -> Iterator[tuple[ast.Call, bool]]:
    """Every call in `body` with whether it is awaited, skipping nested defs and lambdas."""
    awaited: set[int] = set()
    stack: list[ast.AST] = list(body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue
        if isinstance(node, ast.Await) and isinstance(node.value, ast.Call):
            awaited.add(id(node.value))
        if isinstance(node, ast.Call):
            yield node, id(node) in awaited
        stack.extend(ast.iter_child_nodes(node))


def blocking_calls(func: Callable[..., Any]) -> list[tuple[int, str]]:
    """(line number, call) of known blocking calls in an `async def`'s own body.

    Returns [] when the source is not available (built-ins, generated code).
    """
    try:
        lines, first = inspect.getsourcelines(func)
    except (OSError, TypeError):
        return []
    tree = ast.parse(textwrap.dedent("".join(lines)))
    fn = tree.body[0] if tree.body else None
    if not isinstance(fn, ast.AsyncFunctionDef):
        return []
    found = []
    for call, is_awaited in _calls_outside_nested_functions(fn.body):
        name = _dotted(call.func)
        method = call.func.attr if isinstance(call.func, ast.Attribute) else None
        if name is not None and (name in BLOCKING_CALLS or name.startswith(BLOCKING_PREFIXES)):
            found.append((first + call.lineno - 1, f"{name}()"))
        elif method in BLOCKING_METHODS and not is_awaited:
            found.append((first + call.lineno - 1, f".{method}()"))
    return sorted(found)


def check_async_endpoints(app: Any) -> list[Finding]:
    """WARN for each known blocking call in the app's `async def` endpoints."""
    findings = []
    checked = 0
    for route in getattr(app, "routes", []):
        endpoint = getattr(route, "endpoint", None)
        if endpoint is None or not inspect.iscoroutinefunction(endpoint):
            continue
        checked += 1
        where = inspect.getsourcefile(endpoint) or "?"
        for line, call in blocking_calls(endpoint):
            findings.append(
                Finding(
                    "WARN",
                    "async",
                    f"{getattr(route, 'path', '?')}: {call} blocks the event loop in "
                    f"async def {endpoint.__name__} ({where}:{line}); await an async "
                    "equivalent or make the endpoint a plain def (runs in the threadpool)",
                )
            )
    if not findings:
        findings.append(
            Finding("OK", "async", f"no known blocking calls in {checked} async endpoints")
        )
    return findings


def load_app(spec: str) -> Any:
    """Build the app from `module:factory` (called with no arguments) or `module:attr`."""
    module_name, _, attr = spec.partition(":")
    target = getattr(importlib.import_module(module_name), attr or "create_app")
    return target() if callable(target) and not hasattr(target, "routes") else target


# --- 3. gunicorn config --------------------------------------------------------------------


def _top_level_value(tree: ast.Module, name: str) -> tuple[bool, Any]:
    """(found, literal value or Ellipsis when not a literal) of `name = ...` at top level."""
    found, value = False, None
    for node in tree.body:
        if isinstance(node, ast.Assign):
            targets, expr = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, expr = [node.target], node.value
        else:
            continue
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            found = True
            try:
                value = ast.literal_eval(expr)
            except ValueError:
                value = ...
    return found, value


def check_gunicorn_config(path: Path, env: Mapping[str, str]) -> list[Finding]:
    """WARN when the config does not preload the app or does not use uvicorn workers."""
    cmd_args = shlex.split(env.get("GUNICORN_CMD_ARGS", ""))
    try:
        tree = ast.parse(path.read_text(), filename=str(path))
    except OSError as exc:
        return [Finding("WARN", "gunicorn", f"cannot read {path}: {exc.strerror}")]
    findings = []
    found, preload = _top_level_value(tree, "preload_app")
    if "--preload" in cmd_args or (found and preload is True):
        findings.append(Finding("OK", "gunicorn", f"{path}: preload_app is on"))
    elif found and preload is ...:
        findings.append(
            Finding("INFO", "gunicorn", f"{path}: preload_app is computed; not checked")
        )
    else:
        findings.append(
            Finding(
                "WARN",
                "gunicorn",
                f"{path}: preload_app is {'off' if found else 'not set (gunicorn default: off)'}; "
                "each worker imports the app itself (more memory, slower start)",
            )
        )
    found, worker_class = _top_level_value(tree, "worker_class")
    if not (found and isinstance(worker_class, str) and "UvicornWorker" in worker_class):
        findings.append(
            Finding("WARN", "gunicorn", f"{path}: worker_class is not uvicorn_worker.UvicornWorker")
        )
    return findings


# --- CLI ---------------------------------------------------------------------------------------


def run(args: argparse.Namespace, env: Mapping[str, str], out: TextIO) -> int:
    """Run the checks, print the report to `out`; 1 when anything warns, else 0."""
    findings: list[Finding] = []
    try:
        budget = cpu_budget(
            env=env,
            cpus=args.cpus,
            workers=args.workers,
            api_threads=args.api_threads,
            serving_intra_op=args.serving_intra_op,
            serving_inter_op=args.serving_inter_op,
            serving_threads=args.serving_threads,
        )
        findings += check_cpu_budget(budget)
    except ValueError as exc:
        findings.append(Finding("WARN", "cpu", f"bad setting: {exc}"))
    if args.app:
        findings += check_async_endpoints(load_app(args.app))
    findings += check_gunicorn_config(args.gunicorn_config, env)
    for f in findings:
        print(f"{f.level:<4} [{f.check}] {f.message}", file=out)
    warnings = sum(f.level == "WARN" for f in findings)
    print(f"{warnings} warning(s)", file=out)
    return 1 if warnings else 0


def _at_least(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = int(text)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}")
        return value

    return parse


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError("must be a positive number")
    return value


def parser() -> argparse.ArgumentParser:
    """The command line of `python -m api.ops.doctor`."""
    p = argparse.ArgumentParser(prog="python -m api.ops.doctor", description=__doc__.splitlines()[0])
    p.add_argument(
        "--cpus", type=_positive_float, help="CPUs to budget for (default: cgroup quota/affinity)"
    )
    p.add_argument(
        "--workers",
        type=_at_least(1),
        help="API workers (default: WEB_CONCURRENCY, else one per CPU)",
    )
    p.add_argument(
        "--api-threads", type=_at_least(1), help="threads per API worker (default: OMP_NUM_THREADS)"
    )
    p.add_argument(
        "--serving-intra-op", type=_at_least(0), help="serving intra-op threads (0 = per CPU)"
    )
    p.add_argument(
        "--serving-inter-op", type=_at_least(0), help="serving inter-op threads (0 = per CPU)"
    )
    p.add_argument(
        "--serving-threads",
        type=_at_least(1),
        help="serving Session runs at once (--rest_api_num_threads / num_batch_threads)",
    )
    p.add_argument(
        "--app",
        default="api.app:create_app",
        help="module:factory of the app to check ('' to skip)",
    )
    p.add_argument(
        "--gunicorn-config",
        type=Path,
        default=Path("gunicorn.conf.py"),
        help="gunicorn config file to check for preload_app and the worker class",
    )
    return p


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    """Entry point; returns the exit status."""
    return run(parser().parse_args(argv), os.environ if env is None else env, sys.stdout)


if __name__ == "__main__":
    sys.exit(main())
