"""The hop profile's counters, the peers' pins, the CPU flags and the publishing of two runs
(pure functions and files; nothing started, nothing timed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.__main__ import cpu_info
from bench.hop import hop_setups, latest_tuned_rate, parse_switches, per_role
from bench.peers import PEERS, STAMP, Peer
from bench.publish import agreement, load, replace_between, results_markdown
from bench.setups import wrap_body

STATUS = "Name:\tpython\nvoluntary_ctxt_switches:\t120\nnonvoluntary_ctxt_switches:\t7\n"
CPUINFO = ("processor\t: 0\nmodel name\t: AMD EPYC 9B14\nflags\t\t: fpu sse4_2 avx avx2 fma avx512f\n\n"
           "processor\t: 1\nmodel name\t: AMD EPYC 9B14\nflags\t\t: fpu\n")


def test_context_switches_are_both_kinds() -> None:
    assert parse_switches(STATUS) == 127 and parse_switches("Name:\tx\n") == 0


def test_values_are_summed_by_role() -> None:
    assert per_role({1: 2.0, 2: 3.0, 3: 1.0}, {1: "serving", 2: "serving"}) == {"serving": 5.0, "other": 1.0}


def test_the_hop_compares_tuned_with_each_transport() -> None:
    names = [s.name for s in hop_setups()]
    assert names == ["tuned", "split", "split+SERVING_UNIX_SOCKETS=0", "split+SERVING_PROTOCOL=grpc",
                     "split+SERVING_ARGS=--session_run_inline_below_us=0"]


def test_the_hop_rate_is_ten_percent_of_the_latest_tuned(tmp_path: Path) -> None:
    (tmp_path / "latest").mkdir()
    assert latest_tuned_rate(tmp_path, "fraud") is None
    (tmp_path / "latest" / "results.json").write_text(json.dumps({"setups": [
        {"workload": "fraud", "column": "tuned", "slo_rps": 1900.0}]}))
    assert latest_tuned_rate(tmp_path, "fraud") == pytest.approx(190.0)


def test_cpu_model_and_flags_come_from_the_first_cpu() -> None:
    model, flags = cpu_info(CPUINFO)
    assert model == "AMD EPYC 9B14" and "avx512f" in flags and "fpu" in flags
    assert cpu_info("") == ("?", set())


def test_peers_are_pinned_with_our_tensorflow() -> None:
    pins = PEERS["bentoml"].pins()
    assert pins[0] == "bentoml==1.4.40" and PEERS["ray-serve"].pins()[0] == "ray[serve]==2.60.0"
    assert any(p.startswith("tensorflow==") for p in pins) and all("==" in p for p in pins)


def test_a_peer_is_installed_only_with_exactly_its_pins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("bench.peers.PEERS_DIR", tmp_path)
    peer = Peer("x", "x==1", "docs")
    assert not peer.installed()
    (peer.venv / "bin").mkdir(parents=True)
    (peer.venv / "bin" / "python").write_text("")
    (peer.venv / STAMP).write_text("\n".join(peer.pins()) + "\n")
    assert peer.installed()
    (peer.venv / STAMP).write_text("x==0\n")
    assert not peer.installed()


def test_a_batchable_api_gets_its_body_as_a_one_item_list() -> None:
    assert wrap_body(b'{"a":1}', "transactions") == b'{"transactions":[{"a":1}]}'
    assert wrap_body(b'{"a":1}', "") == b'{"a":1}'


@pytest.mark.parametrize(("first", "second", "shown"),
                         [(1000.0, 1050.0, "+5%"), (1000.0, 850.0, "-15% **outside ±10 %**"), (None, 5.0, "–")])
def test_two_runs_agree_within_ten_percent(first: float | None, second: float | None, shown: str) -> None:
    assert agreement(first, second) == shown


def test_markers_are_replaced_and_required() -> None:
    text = "a\n<!-- b -->\nold\n<!-- e -->\nz"
    assert replace_between(text, "<!-- b -->", "<!-- e -->", "new") == "a\n<!-- b -->\nnew\n<!-- e -->\nz"
    with pytest.raises(ValueError):
        replace_between("nothing", "<!-- b -->", "<!-- e -->", "new")


def run_file(tmp_path: Path, name: str, rps: float, mode: str = "quick") -> Path:
    run = tmp_path / name
    run.mkdir()
    record = {"workload": "fraud", "name": "split", "column": "split", "status": "ok", "slo_rps": rps,
              "slo_rps_min": rps * 0.95, "slo_rps_max": rps * 1.05, "latency_curve": [
                  {"offered_rps": rps, "passed": True, "p50_ms": 3.0, "p99_ms": 20.0}], "memory": []}
    meta = {"mode": mode, "started_at": "2027-01-01 10:00:00 UTC", "cpu_model": "AMD EPYC", "avx512": False,
            "cpu_flags": ["avx2"], "slo": {"fraud": {"slo_ms": 40.0, "how": "derived"}}, "duration_s": 700}
    goals = [{"name": "SLO-RPS vs tuned", "target": "split >= tuned", "measured": "1.1x", "held": True}]
    (run / "results.json").write_text(json.dumps({"meta": meta, "setups": [record], "goals": goals}))
    return run


def test_two_runs_side_by_side(tmp_path: Path) -> None:
    first, second = load(run_file(tmp_path, "a", 1000.0)), load(run_file(tmp_path, "b", 1040.0))
    text = results_markdown(first, second)
    assert "AVX-512 no" in text and "fraud p99 ≤ 40 ms (run 1), 40 ms (run 2: derived)" in text
    assert "| fraud | split | 1,000 (950–1,050) | 1,040 (988–1,092) | +4% | 3.0 / 20.0 |" in text
    assert "| split >= tuned | 1.1x — held | 1.1x — held |" in text
    assert "![" not in text  # no picture unless given
    pictured = results_markdown(first, second, "bench/slo_curves-20261204.png")
    assert pictured.endswith("peers included, run 2](bench/slo_curves-20261204.png)")


def test_a_figure_at_the_relaxed_slo_names_its_slo_and_is_compared_only_with_one_at_the_same(
        tmp_path: Path) -> None:
    first, second = load(run_file(tmp_path, "a", 12.0)), load(run_file(tmp_path, "b", 13.0))
    for run in (first, second):
        run["setups"][0].update(relaxed_from_ms=40.0, slo_ms=160.0)
    assert "| fraud | split | never met at 40 ms; at 160 ms: 12 (11–13) | never met at 40 ms; at 160 ms: 13 " \
           "(12–14) | +8% |" in results_markdown(first, second)
    second["setups"][0].update(relaxed_from_ms=None, slo_ms=40.0)  # met the workload's SLO this time
    assert "| fraud | split | never met at 40 ms; at 160 ms: 12 (11–13) | 13 (12–14) | – |" in \
        results_markdown(first, second)


def test_smoke_runs_are_not_published(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="smoke"):
        load(run_file(tmp_path, "s", 10.0, mode="smoke"))


def test_server_timing_stages_are_read_in_ms() -> None:
    from bench.hop import parse_server_timing

    header = "validate;dur=0.74, features;dur=0.04, serving;dur=3.24, total;dur=4.34"
    assert parse_server_timing(header) == {"validate": 0.74, "features": 0.04, "serving": 3.24, "total": 4.34}
    assert parse_server_timing("") == {} and parse_server_timing("x;desc=y") == {}
