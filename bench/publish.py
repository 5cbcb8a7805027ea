"""`python -m bench.publish RUN1 RUN2`: put two runs of `make bench` into the docs.

    python -m bench.publish bench/results/20270101T100000Z bench/results/20270101T101500Z

Reads each run's results.json, and writes between the markers of `docs/bench.md` the two
runs side by side -- machine (CPU model and flags), per workload the SLO, each setup's
median SLO-RPS with its min-max, the medians' agreement between the runs (the issue's ±10 %),
p50/p99 at the SLO-RPS, memory, and every target per run -- and between the README's markers
the headline (the second run's SLO table in short, and the targets held in both). The second
run's curves are copied to `docs/bench/slo_curves-<date>.png`. Only a quiet machine's runs
belong there: the command refuses smoke runs and says when a run's steps were disturbed.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs" / "bench.md"
README = REPO / "README.md"
BEGIN, END = "<!-- bench-results:begin -->", "<!-- bench-results:end -->"
HEAD_BEGIN, HEAD_END = "<!-- bench-headline:begin -->", "<!-- bench-headline:end -->"
#: Two runs' medians agree when their ratio is within this (the issue's ±10 %).
AGREEMENT = 0.10


def load(run_dir: Path) -> dict[str, Any]:
    """A run's results.json, with its folder under "dir".

    Raises:
        ValueError: no results.json there, or a smoke run.
    """
    path = run_dir / "results.json"
    if not path.is_file():
        raise ValueError(f"no results.json in {run_dir}")
    data = dict(json.loads(path.read_text()))
    if data.get("meta", {}).get("mode") == "smoke":
        raise ValueError(f"{run_dir} is a smoke run: its figures are not results")
    data["dir"] = run_dir
    return data


def _rps(record: dict[str, Any] | None) -> str:
    if record is None:
        return "not run"
    if record.get("status") != "ok":
        return f"{record.get('status')}: {record.get('reason', '')}"[:80]
    relaxed = record.get("relaxed_from_ms")
    prefix = f"never met at {relaxed:g} ms; at {record['slo_ms']:g} ms: " if relaxed else ""
    if not record.get("slo_rps"):
        return prefix + "never met"
    low, high = record.get("slo_rps_min"), record.get("slo_rps_max")
    spread = f" ({low:,.0f}–{high:,.0f})" if low is not None and high is not None else ""
    floor = "≥ " if record.get("slo_bound_reached") else ""
    return f"{prefix}{floor}{record['slo_rps']:,.0f}{spread}"


def same_slo(first: dict[str, Any] | None, second: dict[str, Any] | None) -> bool:
    """Both runs measured the setup against the same kind of SLO (the workload's, or both the
    relaxed one): only then are their figures compared."""
    return bool(first and second) and bool(first.get("relaxed_from_ms")) == bool(second.get("relaxed_from_ms"))


def agreement(first: float | None, second: float | None) -> str:
    """"+4 %" (second vs first) and whether it is within ±10 %; "–" when either is missing."""
    if not first or not second:
        return "–"
    change = second / first - 1
    return f"{change:+.0%}" + ("" if abs(change) <= AGREEMENT else " **outside ±10 %**")


def _machine(run: dict[str, Any]) -> str:
    meta = run["meta"]
    return (f"{meta.get('started_at')}, commit {meta.get('commit')}, {meta.get('cpus')} CPUs "
            f"({meta.get('cpu_model')}; AVX-512 {'yes' if meta.get('avx512') else 'no'}; "
            f"{' '.join(meta.get('cpu_flags', []))}), servers on CPUs "
            f"{meta.get('pinning', {}).get('server_cpus')}, load average at start {meta.get('loadavg')}, "
            f"{meta.get('duration_s', 0):.0f} s")


def _records(run: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(r["workload"], r["name"]): r for r in run["setups"]}


def _at_slo(record: dict[str, Any]) -> str:
    rate = record.get("slo_rps")
    if not rate:
        return "–"
    passed = [p for p in record.get("latency_curve", []) if p.get("passed") and p["offered_rps"] <= rate * 1.01]
    if not passed:
        return "–"
    at = max(passed, key=lambda p: p["offered_rps"])
    return f"{at['p50_ms']:.1f} / {at['p99_ms']:.1f}"


def _memory(record: dict[str, Any]) -> str:
    memory = record.get("memory") or []
    return " / ".join(f"{sum(p['pss_mb'] for p in m['processes']):,.0f}" for m in memory) or "–"


def _slo_ms(run: dict[str, Any], workload: str) -> str:
    entry = run["meta"].get("slo", {}).get(workload)
    return f"{entry['slo_ms']:g}" if entry else "–"


def results_markdown(first: dict[str, Any], second: dict[str, Any], picture: str | None = None) -> str:
    """The docs page's results section for two runs (see the module docstring); `picture`,
    when given, is run 2's curves, a path relative to the docs folder."""
    one, two = _records(first), _records(second)
    slo = second["meta"].get("slo", {})
    lines = [
        f"Run 1: {_machine(first)}.",
        f"Run 2: {_machine(second)}.",
        "",
        "SLO per workload, each run's own (a ratio compares setups at one SLO, within a run): "
        + "; ".join(f"{w} p99 ≤ {_slo_ms(first, w)} ms (run 1), {e['slo_ms']:g} ms (run 2: {e.get('how', '')})"
                    for w, e in slo.items()) + ".",
        "",
        "| workload | setup | SLO-RPS run 1, median (min–max) | run 2 | run 2 vs run 1 "
        "| p50 / p99 at SLO-RPS, run 2 (ms) | PSS MB, 1 / 4 API workers (run 2) |",
        "|---|---|---|---|---|---|---|",
    ]
    for key in dict.fromkeys([*one, *two]):
        a, b = one.get(key), two.get(key)
        record = b or a
        assert record is not None
        lines.append(
            f"| {key[0]} | {key[1]}{' (peer)' if record.get('column') == 'peer' else ''} | {_rps(a)} | {_rps(b)} "
            f"| {agreement(a and a.get('slo_rps'), b and b.get('slo_rps')) if same_slo(a, b) else '–'} "
            f"| {_at_slo(b) if b else '–'} | {_memory(b) if b else '–'} |"
        )
    goals_one = {g["name"]: g for g in first.get("goals", [])}
    lines += ["", "| target | run 1 | run 2 |", "|---|---|---|"]
    mark = {True: "held", False: "**not held**", None: "not measured"}
    for goal in second.get("goals", []):
        other = goals_one.get(goal["name"])
        lines.append(
            f"| {goal['target']} | {other['measured'] + ' — ' + mark[other['held']] if other else '–'} "
            f"| {goal['measured']} — {mark[goal['held']]} |"
        )
    if picture:
        lines += ["", f"![p50 and p99 against offered load, every setup, peers included, run 2]({picture})"]
    return "\n".join(lines)


def headline_markdown(first: dict[str, Any], second: dict[str, Any], picture: str) -> str:
    """The README's short form: run 2's medians per workload, targets held in both runs."""
    lines = [f"Two runs of `make bench`, {_machine(second)} (run 2; run 1: "
             f"{first['meta'].get('started_at')}). Full tables: [docs/bench.md](docs/bench.md).", "",
             "| workload | setup | SLO-RPS, median of 3 searches (run 1 / run 2) |", "|---|---|---|"]
    one = _records(first)
    for key, record in _records(second).items():
        lines.append(f"| {key[0]} | {key[1]} | {_rps(one.get(key))} / {_rps(record)} |")
    both = {g["name"] for g in first.get("goals", []) if g["held"]} & {
        g["name"] for g in second.get("goals", []) if g["held"]}
    lines += ["", "Targets held in both runs: " + (", ".join(sorted(both)) or "none") + ".", "",
              f"![p50 and p99 against offered load, every setup, peers included]({picture})"]
    return "\n".join(lines)


def replace_between(text: str, begin: str, end: str, body: str) -> str:
    """`text` with what lies between the `begin` and `end` markers replaced by `body`.

    Raises:
        ValueError: a marker is missing.
    """
    start, stop = text.find(begin), text.find(end)
    if start < 0 or stop < start:
        raise ValueError(f"markers {begin} ... {end} not found")
    return text[: start + len(begin)] + "\n" + body + "\n" + text[stop:]


def main(argv: Sequence[str] | None = None) -> int:
    """Write the docs page and the README's headline; 2 on bad input."""
    parser = argparse.ArgumentParser(prog="python -m bench.publish", description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs=2, type=Path, help="two run folders (bench/results/<timestamp>)")
    args = parser.parse_args(argv)
    try:
        first, second = (load(p) for p in args.runs)
        date = str(second["meta"].get("started_at", "run"))[:10].replace("-", "")
        picture = f"docs/bench/slo_curves-{date}.png"
        shutil.copyfile(second["dir"] / "slo_curves.png", REPO / picture)
        shown = str(Path(picture).relative_to("docs"))  # the docs page's own folder
        DOCS.write_text(replace_between(DOCS.read_text(), BEGIN, END, results_markdown(first, second, shown)))
        README.write_text(replace_between(README.read_text(), HEAD_BEGIN, HEAD_END,
                                          headline_markdown(first, second, picture)))
    except (ValueError, OSError) as exc:
        print(f"python -m bench.publish: {exc}", file=sys.stderr)
        return 2
    print(f"[bench] wrote {DOCS.relative_to(REPO)}, the README's headline and {picture}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
