"""The outputs of a run: report.md (tables), the curves picture, memory.png and results.json.

The tables are pure functions of `BenchResults`; the plots use matplotlib's Agg backend
(no display needed). `write_outputs` puts everything in the run's folder and points
`bench/results/latest` at it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from bench.results import BenchResults, CurvePoint, SetupResult
from bench.slo import STOLEN_SHARE, stolen_too_much

BUSY_OTHER_CORES = 0.25  # other processes using more than this during a step: flagged
CURVES_PNG = "slo_curves.png"
MEMORY_PNG = "memory.png"


def _num(value: float | None, digits: int = 1) -> str:
    if value is None:
        return "–"
    return f"{value:,.{digits}f}"


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _kind(s: SetupResult) -> str:
    if s.column == "split":
        return "headline (product default)" if s.headline else "variant"
    return s.column


def _slo_rps(s: SetupResult) -> str:
    if s.status != "ok":
        return f"{s.status}: {s.reason}" if s.reason else s.status
    relaxed = f"never met at {s.relaxed_from_ms:g} ms; at {s.slo_ms:g} ms: " if s.relaxed_from_ms else ""
    if s.slo_rps is None:
        return relaxed + "never met"
    return relaxed + ("≥ " if s.slo_bound_reached else "") + _num(s.slo_rps, 0)


def _spread(s: SetupResult) -> str:
    sp = s.spread
    if s.status != "ok" or sp is None:
        return "–"
    if len(sp.values) == 1:
        return "1 search"
    text = f"{_num(sp.low, 0)}–{_num(sp.high, 0)} ({len(sp.values)} searches, {sp.relative:.0%}"
    if sp.unanswered:
        return f"**{text}; {sp.unanswered} passed no rate, left out)**"
    return f"**{text}) > 15 %**" if sp.wide else text + ")"


def _memory(s: SetupResult) -> str:
    if not s.memory:
        return "–"
    return " / ".join(f"{_num(m.pss_mb, 0)}" for m in s.memory) + " (" + "/".join(
        str(m.workers) for m in s.memory) + ")"


def slo_lines(results: BenchResults) -> list[str]:
    """One line per workload: the SLO it was searched at and how it was chosen."""
    lines = []
    for workload in results.workloads():
        entry = results.meta.get("slo", {}).get(workload)
        slo = results.slo_ms(workload)
        if entry:
            lines.append(f"- {workload}: p99 ≤ {float(entry['slo_ms']):g} ms ({entry.get('how', '')})")
        elif slo is not None:
            lines.append(f"- {workload}: p99 ≤ {slo:g} ms")
    return lines


def slo_table(results: BenchResults) -> str:
    """Workload | SLO | setup | kind | SLO-RPS (median) | min–max | p50 / p99 at it | unloaded
    p50 | memory | workers | steps."""
    rows = []
    for s in results.setups:
        at = s.at_slo()
        rows.append([
            s.workload,
            f"{s.slo_ms:g} ms",
            s.name,
            _kind(s),
            _slo_rps(s),
            _spread(s),
            f"{_num(at.p50_ms)} / {_num(at.p99_ms)}" if at else "–",
            _num(s.unloaded_p50_ms, 2),
            _memory(s),
            str(s.workers or "–"),
            str(len(s.latency_curve)),
        ])
    return _table(
        ["Workload", "SLO (p99)", "Setup", "Kind", "SLO-RPS (median)", "min–max of the searches",
         "p50 / p99 at SLO-RPS (ms)", "Unloaded p50 (ms)", "PSS MB (API workers)", "Workers", "Steps"],
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


def curve_table(results: BenchResults) -> str:
    """One row per open-loop step, every setup, ascending by offered rate."""
    rows = []
    for s in results.setups:
        for p in s.sorted_curve():
            cpu = p.cpu
            rows.append([
                s.workload, s.name, str(p.search or "–"), _num(p.offered_rps, 1), _num(p.achieved_rps, 1),
                _num(p.p50_ms, 2), _num(p.p99_ms, 2), _num(p.p999_ms, 2), _num(p.max_ms, 1),
                f"{p.late} / {p.requests}", str(p.errors), p.phase,
                "yes" if p.passed else f"no: {p.verdict}"
                + (f" (stopped early: {p.stopped_early}; lower bounds)" if p.stopped_early else ""),
                _num(cpu.setup_cores, 2) if cpu else "–",
                _num(p.generator_busy_cores, 2),
                _num(cpu.other_cores, 2) if cpu else "–",
                _num(cpu.stolen_cores, 3) if cpu else "–",
            ])
    return _table(
        ["Workload", "Setup", "Search", "Offered RPS", "Achieved RPS", "p50", "p99", "p99.9", "max",
         "Late / planned", "Errors", "Phase", "Meets SLO", "Setup CPU (cores)", "Generator CPU, busy (cores)",
         "Other CPU (cores)", "Stolen, servers' CPUs (cores)"],
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
            rows.append([s.workload, s.name, str(m.workers), _num(m.pss_mb, 0), _num(m.uss_mb, 0),
                         _num(m.rss_mb, 0), parts])
    return _table(
        ["Workload", "Setup", "API workers", "Total PSS (MB)", "Total USS (MB)", "Total RSS (MB)",
         "PSS per process (MB)"],
        rows,
    )


def cpu_table(results: BenchResults) -> str:
    """CPU by role at each setup's SLO-RPS step."""
    rows = []
    for s in results.setups:
        at = s.at_slo()
        if at and at.cpu:
            roles = ", ".join(f"{role} {cores:.2f}" for role, cores in at.cpu.by_role.items())
            rows.append([s.workload, s.name, _num(at.offered_rps, 0), roles,
                         _num(at.cpu.load_generator_cores, 2), _num(at.cpu.other_cores, 2)])
    return _table(["Workload", "Setup", "At RPS", "Setup CPU by role (cores)",
                   "Generator (cores)", "Other (cores)"], rows)


def notes(results: BenchResults) -> list[str]:
    """Caveats of this run: busy machine, failures, early stops."""
    out = []
    steps = busy = stolen = stolen_over = again = 0
    busiest = most_stolen = 0.0
    for s in results.setups:
        for p in s.latency_curve:
            again += p.disturbed
            if p.cpu:
                steps += 1
                busy += p.cpu.other_cores > BUSY_OTHER_CORES
                busiest = max(busiest, p.cpu.other_cores)
                stolen += p.cpu.stolen_cores > 0
                stolen_over += stolen_too_much(p.cpu.stolen_cores, len(s.server_cpus))
                most_stolen = max(most_stolen, p.cpu.stolen_cores)
    if stolen:
        out.append(
            f"The hypervisor took the servers' CPUs (steal) during {stolen} of "
            f"{steps} steps, more than {STOLEN_SHARE:.0%} of their time in {stolen_over} (up to "
            f"{most_stolen:.0%} of a core; per step in results.json, cpu.stolen_cores); {again} failed "
            "step(s) of those were measured again (bench.slo.STOLEN_SHARE): a shared virtual machine's "
            "figures vary with its neighbours."
        )
    if busy:
        out.append(
            f"Other processes on the machine used more than {BUSY_OTHER_CORES} cores during "
            f"{busy} of {steps} steps (up to {busiest:.2f} cores; per step in results.json, "
            "cpu.other_cores): those figures are worse than on a quiet machine."
        )
    for s in results.setups:
        if s.status != "ok":
            out.append(f"{s.workload}/{s.name}: {s.status}: {s.reason}")
            continue
        sp = s.spread
        if sp is not None and sp.wide and not sp.unanswered:
            out.append(f"{s.workload}/{s.name}: its searches disagree by {sp.relative:.0%} of their median "
                       f"(> 15 %: {', '.join(_num(v, 0) for v in sp.values)} RPS); the median is shown")
        for m in s.memory:
            out.extend(f"{s.workload}/{s.name}, memory at {m.workers} worker(s): {n}" for n in m.notes)
        out.extend(f"{s.workload}/{s.name}: {n.strip().splitlines()[0][:300]}"
                   for n in s.notes if n.strip())
    return out


def _cpus(cpus: object) -> str:
    if isinstance(cpus, (list, tuple)) and cpus:
        return ",".join(map(str, cpus))
    return "all (not pinned)"


def markdown_report(results: BenchResults) -> str:
    """The whole report.md."""
    meta = results.meta
    pinning = meta.get("pinning", {})
    flags = meta.get("cpu_flags") or []
    parts = [
        f"# Benchmark ({meta.get('mode', '?')} plan, {meta.get('started_at', '?')})",
        "",
        *(["**Smoke plan: these figures only show that every path ran; they are not results.**", ""]
          if meta.get("mode") == "smoke" else []),
        f"Machine: {meta.get('cpus', '?')} CPUs ({meta.get('cpu_model', '?')}; AVX-512 "
        f"{'yes' if meta.get('avx512') else 'no'}; flags {' '.join(flags) or '?'}); server processes "
        f"pinned to CPUs {_cpus(pinning.get('server_cpus'))}, the load generator to CPUs "
        f"{_cpus(pinning.get('load_cpus'))}. Load average at start: {meta.get('loadavg', '?')}. "
        f"Commit {meta.get('commit', '?')}. Command: `{meta.get('command', 'python -m bench')}`; "
        f"{meta.get('duration_s', '?')} s.",
        "",
        "Each setup's SLO-RPS is the median, over its searches, of the highest Poisson arrival rate "
        "at which p99 latency, from each request's intended send time, stays within the workload's "
        "SLO, with no error and the generator on schedule (a sweep up fractions of the closed-loop "
        "RPS, then bisection; the repeats around the first's answer). A step fails only on "
        "evidence: more than 1 % of its planned arrivals late, or a p99 over the SLO from at least "
        "1,000 answers. Memory: total PSS of the setup's process tree. See docs/bench.md.",
        "",
        "SLO per workload:",
        "",
        *slo_lines(results),
        "",
        f"![p50 and p99 against offered load]({CURVES_PNG})",
        "",
        "## Throughput at the SLO",
        "",
        slo_table(results),
        "",
        "## Targets",
        "",
        goals_table(results),
        "",
        "## Latency curves (ms, from the intended send time)",
        "",
        curve_table(results),
        "",
        "## Memory",
        "",
        memory_table(results),
        "",
        "## CPU at the SLO-RPS",
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
            parts.append(f"- {s.workload}/{s.name}: `{cmd}`")
    return "\n".join(parts) + "\n"


# --- plots ------------------------------------------------------------------------------


def _measured(p: CurvePoint) -> bool:
    return p.p50_ms is not None and p.p99_ms is not None


def plot_curves(results: BenchResults, path: Path) -> Path | None:
    """The one picture: p99 (solid) and p50 (dashed) against offered load, every setup on the
    same axes (one panel per workload), the SLO as a line, each SLO-RPS a star. Steps that
    stopped early are hollow (their percentiles are lower bounds)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = [w for w in results.workloads()
                 if any(_measured(p) for s in results.setups if s.workload == w
                        for p in s.latency_curve)]
    if not workloads:
        return None
    fig, axes = plt.subplots(1, len(workloads), figsize=(7.5 * len(workloads), 5.2), squeeze=False)
    names = list(dict.fromkeys(s.name for s in results.setups))
    colors = {name: plt.get_cmap("tab10")(i % 10) for i, name in enumerate(names)}
    for ax, workload in zip(axes[0], workloads, strict=True):
        slo = float(results.slo_ms(workload) or 25.0)
        for s in (s for s in results.setups if s.workload == workload):
            points = [p for p in s.sorted_curve() if _measured(p)]
            if not points:
                continue
            color = colors[s.name]
            label = s.name + (" (headline)" if s.headline else " (peer)" if s.column == "peer" else "")
            whole = [p for p in points if not p.stopped_early]  # the lines join whole steps
            x = [p.offered_rps for p in whole]
            ax.plot(x, [p.p99_ms for p in whole], "-", color=color, label=f"{label} p99")
            ax.plot(x, [p.p50_ms for p in whole], "--", color=color, alpha=0.7,
                    label=f"{label} p50")
            for p in points:
                hollow = bool(p.stopped_early)
                for value in (p.p99_ms, p.p50_ms):
                    ax.plot(p.offered_rps, value, "o", color=color, markersize=4,
                            markerfacecolor="none" if hollow else color)
            at = s.at_slo()
            if at is not None and at.p99_ms is not None:
                # A hollow star: the SLO-RPS at the relaxed SLO, above the red line.
                ax.plot(at.offered_rps, at.p99_ms, "*", color=color, markersize=14,
                        markeredgecolor="black", markerfacecolor="none" if s.relaxed_from_ms else color)
                shown = f"{at.offered_rps:,.0f}" + (f" (p99 ≤ {s.slo_ms:g} ms)" if s.relaxed_from_ms else "")
                ax.annotate(shown, (at.offered_rps, at.p99_ms),
                            textcoords="offset points", xytext=(4, 6), fontsize=7, color=color)
        ax.axhline(slo, color="red", linestyle=":", label=f"SLO: p99 ≤ {slo:g} ms")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("offered load, Poisson arrivals (requests/s)")
        ax.set_ylabel("latency from intended send time (ms)")
        ax.set_title(f"{workload}: p99 (solid) and p50 (dashed); ★ = SLO-RPS (hollow: at the relaxed SLO)",
                     fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, ncol=2)
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
        values = [(m.pss_mb if (m := s.memory_at(count)) else 0.0) for s in setups]
        bars = ax.bar(xs, values, width, label=f"{count} API worker(s)")
        ax.bar_label(bars, labels=[f"{v:,.0f}" if v else "" for v in values], fontsize=7)
    ax.set_xticks(range(len(setups)), [f"{s.workload}/{s.name}" for s in setups], rotation=20,
                  fontsize=8)
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
    json_path.write_text(json.dumps(results.document(), indent=2, ensure_ascii=False) + "\n")
    outputs["results.json"] = json_path
    report = run_dir / "report.md"
    report.write_text(markdown_report(results))
    outputs["report.md"] = report
    for name, plot in ((CURVES_PNG, plot_curves), (MEMORY_PNG, plot_memory)):
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
