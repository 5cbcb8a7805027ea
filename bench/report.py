"""The outputs of a run: report.md (tables), PNG plots and results.json.

`markdown_report` is a pure function of `BenchResults`; the plots use matplotlib's Agg
backend (no display needed). `write_outputs` puts everything in the run's folder and
points `bench/results/latest` at it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

from bench.results import BenchResults, SetupResult, to_jsonable

# The migration the issue publishes: before → after.
PUBLISHED = {
    "avg_ms": (40.0, 6.0),
    "p99_ms": (150.0, 11.0),
    "max_ms": (1000.0, 90.0),
    "memory_mb": (1200.0, 600.0),
    "rps": (198.0, 900.0),
}
COLUMNS = ("naive", "tuned", "split")
HEADLINE_FRACTION = 0.8  # latency rows of the headline table: at 80 % of own saturation
HEADLINE_MEMORY_WORKERS = 4
BUSY_OTHER_CORES = 0.25  # other processes using more than this during a run: flagged


def _num(value: float | None, digits: int = 1) -> str:
    if value is None:
        return "–"
    return f"{value:,.{digits}f}"


def change(before: float | None, after: float | None) -> str:
    """How `after` compares with `before`: "×4.5 (+355 %)" or "÷6.7 (−85 %)".

    "–" when either is unknown or not positive.
    """
    if before is None or after is None or before <= 0 or after <= 0:
        return "–"
    ratio = after / before
    percent = (ratio - 1) * 100
    sign = "+" if percent >= 0 else "−"
    factor = f"×{ratio:.1f}" if ratio >= 1 else f"÷{1 / ratio:.1f}"
    return f"{factor} ({sign}{abs(percent):.0f} %)"


def _latency(setup: SetupResult | None, attr: str, *, reference: bool = False) -> float | None:
    if setup is None:
        return None
    run = setup.load_at(reference=True) if reference else setup.load_at(HEADLINE_FRACTION)
    if run is None or run.result.latency is None:
        return None
    return float(getattr(run.result.latency, attr))


def _pss(setup: SetupResult | None, workers: int) -> float | None:
    memory = setup.memory_at(workers) if setup else None
    return memory.pss_mb if memory else None


def _per_worker(setup: SetupResult | None) -> float | None:
    one, four = _pss(setup, 1), _pss(setup, 4)
    return (four - one) / 3 if one is not None and four is not None else None


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def headline_table(results: BenchResults) -> str:
    """Metric | naive | tuned | split | change (naive → split), the published shape."""
    cols = {c: results.column(c) for c in COLUMNS}
    split = cols["split"]
    ref = results.reference_rps

    Getter = Callable[[SetupResult | None], float | None]
    metrics: list[tuple[str, Getter, int]] = [
        ("Throughput at saturation (RPS)", lambda s: s.rps if s else None, 0),
        (
            "Throughput per CPU core used (RPS / cores)",
            lambda s: s.saturation.rps_per_core if s and s.saturation else None,
            0,
        ),
        ("Latency avg at 80 % of own saturation (ms)", lambda s: _latency(s, "avg_ms"), 1),
        ("Latency p50 at 80 % of own saturation (ms)", lambda s: _latency(s, "p50_ms"), 1),
        ("Latency p99 at 80 % of own saturation (ms)", lambda s: _latency(s, "p99_ms"), 1),
        ("Latency p99.9 at 80 % of own saturation (ms)", lambda s: _latency(s, "p999_ms"), 1),
        ("Latency max at 80 % of own saturation (ms)", lambda s: _latency(s, "max_ms"), 1),
        (
            f"Latency p99 at the reference load, {_num(ref, 0)} RPS (ms)",
            lambda s: _latency(s, "p99_ms", reference=True),
            1,
        ),
        ("Memory, total PSS, 1 API worker (MB)", lambda s: _pss(s, 1), 0),
        ("Memory, total PSS, 4 API workers (MB)", lambda s: _pss(s, 4), 0),
        ("Memory per added API worker (MB)", _per_worker, 1),
        (
            "CPU used at saturation (cores)",
            lambda s: s.saturation.cpu.setup_cores if s and s.saturation else None,
            2,
        ),
        (
            "Errors at saturation (count)",
            lambda s: float(s.saturation.closed.summary.errors.total)
            if s and s.saturation
            else None,
            0,
        ),
    ]
    split_name = f"split ({split.name})" if split else "split"
    header = ["Metric", "naive", "tuned", split_name, "change (naive → split)"]
    rows = []
    for label, get, digits in metrics:
        values = [get(cols[c]) for c in COLUMNS]
        is_errors = label.startswith("Errors")
        rows.append(
            [
                label,
                *(_num(v, digits) for v in values),
                "–" if is_errors else change(values[0], values[2]),
            ]
        )
    return _table(header, rows)


def published_table(results: BenchResults) -> str:
    """The published migration beside the measured naive → split change."""
    naive, split = results.column("naive"), results.column("split")
    measured = {
        "avg_ms": (_latency(naive, "avg_ms"), _latency(split, "avg_ms")),
        "p99_ms": (_latency(naive, "p99_ms"), _latency(split, "p99_ms")),
        "max_ms": (_latency(naive, "max_ms"), _latency(split, "max_ms")),
        "memory_mb": (_pss(naive, HEADLINE_MEMORY_WORKERS), _pss(split, HEADLINE_MEMORY_WORKERS)),
        "rps": (naive.rps if naive else None, split.rps if split else None),
    }
    labels = {
        "avg_ms": "Latency avg (ms)",
        "p99_ms": "Latency p99 (ms)",
        "max_ms": "Latency max (ms)",
        "memory_mb": f"Memory (MB; measured: total PSS at {HEADLINE_MEMORY_WORKERS} API workers)",
        "rps": "Throughput (RPS)",
    }
    rows = []
    for key, (before, after) in PUBLISHED.items():
        m_before, m_after = measured[key]
        rows.append(
            [
                labels[key],
                f"{before:,.0f} → {after:,.0f}",
                change(before, after),
                f"{_num(m_before, 0 if key in ('rps', 'memory_mb') else 1)} → "
                f"{_num(m_after, 0 if key in ('rps', 'memory_mb') else 1)}",
                change(m_before, m_after),
            ]
        )
    return _table(
        ["Metric", "published before → after", "published change", "measured naive → split",
         "measured change"],
        rows,
    )


def goals_table(results: BenchResults) -> str:
    """Goal | target | measured | held."""
    mark = {True: "held", False: "**not held**", None: "not measured"}
    rows = [
        [g.name, g.target, g.measured, mark[g.held] + (f" ({g.note})" if g.note else "")]
        for g in results.goals
    ]
    return _table(["Goal", "Target", "Measured", "Held?"], rows)


def setups_table(results: BenchResults) -> str:
    """Every setup, variants and ceiling included."""
    rows = []
    for s in results.setups:
        sat = s.saturation
        rows.append(
            [
                s.name,
                s.status + (f": {s.reason}" if s.reason else ""),
                str(s.workers or "–"),
                _num(s.rps, 0),
                _num(sat.rps_per_core, 0) if sat else "–",
                str(sat.closed.summary.errors.total) if sat else "–",
                _num(sat.cpu.setup_cores, 2) if sat else "–",
                _num(sat.cpu.load_generator_cores, 2) if sat else "–",
                _num(_pss(s, 1), 0),
                _num(_pss(s, 4), 0),
            ]
        )
    return _table(
        ["Setup", "Status", "Workers", "RPS", "RPS per core", "Errors", "CPU (cores)", "wrk CPU",
         "PSS 1w (MB)", "PSS 4w (MB)"],
        rows,
    )


def fixed_rate_table(results: BenchResults) -> str:
    """One row per paced run."""
    rows = []
    for s in results.setups:
        for run in s.fixed_rate:
            r, lat = run.result, run.result.latency
            rows.append(
                [
                    s.name,
                    run.label,
                    _num(r.offered_rps, 0),
                    _num(r.achieved_rps, 0),
                    *(
                        (_num(lat.avg_ms), _num(lat.p50_ms), _num(lat.p99_ms), _num(lat.p999_ms),
                         _num(lat.max_ms))
                        if lat
                        else ("–",) * 5
                    ),
                    f"{r.errors.status}/{r.errors.socket}/{r.errors.timeout}/{r.in_flight_at_end}",
                    str(lat.count if lat else 0),
                    "yes" if r.schedule_kept else "**no**",
                    _num(run.cpu.setup_cores, 2),
                ]
            )
    return _table(
        ["Setup", "Load", "Offered RPS", "Achieved RPS", "avg", "p50", "p99", "p99.9", "max",
         "Errors (status/socket/timeout/in flight at end)", "Samples", "Kept up", "CPU (cores)"],
        rows,
    )


def memory_table(results: BenchResults) -> str:
    """PSS per process for every memory measurement."""
    rows = []
    for s in results.setups:
        for m in s.memory:
            by_role: dict[str, list[float]] = {}
            for p in m.processes:
                by_role.setdefault(p.role, []).append(p.pss_mb)
            parts = ", ".join(
                f"{role} {len(v)}× {sum(v) / len(v):,.0f}" for role, v in sorted(by_role.items())
            )
            rows.append(
                [s.name, str(m.workers), _num(m.pss_mb, 0), _num(m.uss_mb, 0), _num(m.rss_mb, 0),
                 parts]
            )
    return _table(
        ["Setup", "API workers", "Total PSS (MB)", "Total USS (MB)", "Total RSS (MB)",
         "PSS per process (MB)"],
        rows,
    )


def cpu_table(results: BenchResults) -> str:
    """CPU by role during each saturation run."""
    rows = []
    for s in results.setups:
        if s.saturation:
            cpu = s.saturation.cpu
            roles = ", ".join(f"{role} {cores:.2f}" for role, cores in cpu.by_role.items())
            rows.append(
                [s.name, roles, _num(cpu.load_generator_cores, 2), _num(cpu.other_cores, 2)]
            )
    return _table(["Setup", "Setup CPU by role (cores)", "wrk (cores)", "Other (cores)"], rows)


def notes(results: BenchResults) -> list[str]:
    """Caveats of this run: busy machine, runs that could not keep up, failures."""
    out = []
    runs = busy = 0
    busiest = 0.0
    for s in results.setups:
        for cpu in ([s.saturation.cpu] if s.saturation else []) + [r.cpu for r in s.fixed_rate]:
            runs += 1
            busy += cpu.other_cores > BUSY_OTHER_CORES
            busiest = max(busiest, cpu.other_cores)
    if busy:
        out.append(
            f"Other processes on the machine used more than {BUSY_OTHER_CORES} cores during "
            f"{busy} of {runs} runs (up to {busiest:.2f} cores; per run in results.json, "
            "cpu.other_cores): those figures are lower than on a quiet machine."
        )
    for s in results.setups:
        if s.status != "ok":
            out.append(f"{s.name}: {s.status}: {s.reason}")
        for r in s.fixed_rate:
            if not r.result.schedule_kept:
                out.append(
                    f"{s.name}, {r.label}: sent {r.result.sent:,} of {r.result.planned:,} planned "
                    "requests: the setup could not keep up; latency is queueing time"
                )
            out.extend(f"{s.name}, {r.label}: {n}" for n in r.result.notes)
        for m in s.memory:
            out.extend(f"{s.name}, memory at {m.workers} worker(s): {n}" for n in m.notes)
        if s.status == "ok":
            out.extend(f"{s.name}: {n.strip().splitlines()[0][:300]}" for n in s.notes if n.strip())
    return out


def _cpus(cpus: object) -> str:
    if isinstance(cpus, (list, tuple)) and cpus:
        return ",".join(map(str, cpus))
    return "all (not pinned)"


def markdown_report(results: BenchResults) -> str:
    """The whole report.md."""
    meta = results.meta
    pinning = meta.get("pinning", {})
    parts = [
        f"# Benchmark ({meta.get('mode', '?')} mode, {meta.get('started_at', '?')})",
        "",
        f"Machine: {meta.get('cpus', '?')} CPUs ({meta.get('cpu_model', '?')}); server processes "
        f"pinned to CPUs {_cpus(pinning.get('server_cpus'))}, wrk to CPUs "
        f"{_cpus(pinning.get('load_cpus'))}. {meta.get('wrk', 'wrk')}. Load average at start: "
        f"{meta.get('loadavg', '?')}. Commit {meta.get('commit', '?')}.",
        "",
        "Throughput: closed loop (wrk, "
        f"{meta.get('plan', {}).get('saturation_connections', '?')} connections), successful "
        "answers per second. Latency: open loop at a fixed offered rate (wrk + paced.lua), "
        "measured from each request's intended send time (no coordinated omission). Memory: "
        "sum of PSS over the setup's process tree. See the README's Benchmark section.",
        "",
        "## Headline",
        "",
        headline_table(results),
        "",
        "## Against the published migration",
        "",
        published_table(results),
        "",
        "## Goals",
        "",
        goals_table(results),
        "",
        "## All setups",
        "",
        setups_table(results),
        "",
        "## Fixed-rate runs (latency in ms, from the intended send time)",
        "",
        fixed_rate_table(results),
        "",
        "## Memory",
        "",
        memory_table(results),
        "",
        "## CPU at saturation",
        "",
        cpu_table(results),
        "",
    ]
    caveats = notes(results)
    if caveats:
        parts += ["## Notes", "", *(f"- {n}" for n in caveats), ""]
    parts += ["## Commands", ""]
    for s in results.setups:
        for cmd in s.commands:
            parts.append(f"- {s.name}: `{cmd}`")
    return "\n".join(parts) + "\n"


# --- plots ------------------------------------------------------------------------------


def plot_latency(results: BenchResults, path: Path) -> Path | None:
    """Latency percentiles against offered load, one panel per setup (log scale)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    setups = [s for s in results.setups if any(r.result.latency for r in s.fixed_rate)]
    if not setups:
        return None
    cols = min(3, len(setups))
    rows = (len(setups) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.6 * rows), squeeze=False)
    series = (("p50_ms", "p50"), ("p99_ms", "p99"), ("p999_ms", "p99.9"), ("max_ms", "max"))
    for ax, s in zip(axes.flat, setups, strict=False):
        runs = sorted(
            (r for r in s.fixed_rate if r.result.latency), key=lambda r: r.result.offered_rps
        )
        x = [r.result.offered_rps for r in runs]
        for attr, label in series:
            ax.plot(x, [getattr(r.result.latency, attr) for r in runs], marker="o", label=label)
        for r in runs:
            if not r.result.schedule_kept:
                ax.axvline(r.result.offered_rps, color="red", alpha=0.25, linestyle="--")
        ax.set_yscale("log")
        ax.set_title(f"{s.name} (saturation {_num(s.rps, 0)} RPS)", fontsize=10)
        ax.set_xlabel("offered load (RPS)")
        ax.set_ylabel("latency (ms)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    for ax in list(axes.flat)[len(setups):]:
        ax.set_visible(False)
    fig.suptitle("Latency from intended send time vs offered load (dashed red: could not keep up)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_p99(results: BenchResults, path: Path) -> Path | None:
    """p99 against offered load, every setup on one axis (log-log)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    setups = [s for s in results.setups if any(r.result.latency for r in s.fixed_rate)]
    if not setups:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for s in setups:
        runs = sorted(
            (r for r in s.fixed_rate if r.result.latency), key=lambda r: r.result.offered_rps
        )
        ax.plot(
            [r.result.offered_rps for r in runs],
            [r.result.latency.p99_ms for r in runs if r.result.latency],
            marker="o",
            label=s.name,
        )
    if results.reference_rps:
        ax.axvline(results.reference_rps, color="grey", linestyle=":", label="reference load")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("offered load (RPS)")
    ax.set_ylabel("p99 latency (ms)")
    ax.set_title("p99 from intended send time vs offered load")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_memory(results: BenchResults, path: Path) -> Path | None:
    """Total PSS per setup at each measured API worker count (grouped bars)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    setups = [s for s in results.setups if s.memory]
    if not setups:
        return None
    counts = sorted({m.workers for s in setups for m in s.memory})
    width = 0.8 / len(counts)
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(setups)), 4.5))
    for i, count in enumerate(counts):
        xs = [j + (i - (len(counts) - 1) / 2) * width for j in range(len(setups))]
        values = [(_pss(s, count) or 0.0) for s in setups]
        bars = ax.bar(xs, values, width, label=f"{count} API worker(s)")
        ax.bar_label(bars, labels=[f"{v:,.0f}" if v else "" for v in values], fontsize=7)
    ax.set_xticks(range(len(setups)), [s.name for s in setups], rotation=20, fontsize=8)
    ax.set_ylabel("total PSS (MB)")
    ax.set_title("Memory of each setup's processes (sum of PSS)")
    ax.legend(fontsize=8)
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_outputs(results: BenchResults, run_dir: Path) -> dict[str, Path]:
    """results.json, report.md and the plots into `run_dir`; `latest` points at it."""
    outputs: dict[str, Path] = {}
    json_path = run_dir / "results.json"
    json_path.write_text(json.dumps(to_jsonable(results), indent=2, ensure_ascii=False) + "\n")
    outputs["results.json"] = json_path
    report = run_dir / "report.md"
    report.write_text(markdown_report(results))
    outputs["report.md"] = report
    for name, plot in (
        ("latency.png", plot_latency),
        ("latency_p99.png", plot_p99),
        ("memory.png", plot_memory),
    ):
        written = plot(results, run_dir / name)
        if written:
            outputs[name] = written
    latest = run_dir.parent / "latest"
    tmp = run_dir.parent / ".latest.tmp"
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    os.symlink(run_dir.name, tmp)
    os.replace(tmp, latest)  # atomic: a reader never sees no `latest`
    return outputs
