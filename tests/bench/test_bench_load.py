"""wrk output parsing and latency statistics, on output captured from real wrk 4.1 runs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bench.load import (
    LoadToolError,
    fixed_rate_result,
    parse_paced_counters,
    parse_time_ms,
    parse_wrk,
    percentile,
    read_latency_file,
    summarize_latencies,
)

DATA = Path(__file__).parent / "data"


def test_closed_loop_report_with_latency_distribution() -> None:
    s = parse_wrk((DATA / "wrk_closed_latency.txt").read_text())
    assert s.requests == 6812
    assert s.duration_s == pytest.approx(5.02)
    assert s.rps == pytest.approx(1356.05)
    assert s.latency_avg_ms == pytest.approx(36.80)
    assert s.latency_stdev_ms == pytest.approx(48.53)
    assert s.latency_max_ms == pytest.approx(364.43)
    assert s.percentiles_ms == pytest.approx(
        {"50": 18.19, "75": 25.32, "90": 97.07, "99": 248.72}
    )
    assert s.errors.total == 0


def test_non_2xx_answers_are_status_errors() -> None:
    s = parse_wrk((DATA / "wrk_closed_non2xx.txt").read_text())
    assert s.requests == 1285
    assert s.errors.status == 1285
    assert s.errors.socket == 0
    assert s.errors.total == 1285


def test_all_answers_late_counts_timeouts_and_nan_stdev() -> None:
    # A server answering after 1.5 s, wrk --timeout 1s: the late answers are requests,
    # their latencies are left out of wrk's stats, and each is a timeout error.
    s = parse_wrk((DATA / "wrk_all_timeouts.txt").read_text())
    assert s.requests == 3
    assert s.errors.timeout == 3
    assert s.latency_max_ms == 0.0
    assert s.percentiles_ms == {}


def test_wrk_failure_text_is_an_error() -> None:
    with pytest.raises(LoadToolError):
        parse_wrk("unable to connect to 127.0.0.1:1 Connection refused\n")


@pytest.mark.parametrize(
    ("text", "ms"),
    [("812.00us", 0.812), ("1.23ms", 1.23), ("2.00s", 2000.0), ("1.50m", 90_000.0)],
)
def test_time_units(text: str, ms: float) -> None:
    assert parse_time_ms(text) == pytest.approx(ms)


def test_time_rejects_garbage() -> None:
    with pytest.raises(ValueError):
        parse_time_ms("fast")


def test_paced_run_counters_and_samples() -> None:
    text = (DATA / "wrk_paced_300rps.txt").read_text()
    counters = parse_paced_counters(text)
    samples = read_latency_file(DATA / "paced_latencies_us.txt")
    assert counters["samples"] == [len(samples)] == [908]
    result = fixed_rate_result(300.0, 16, counters, samples, load_cpu_cores=0.1)
    assert result.sent == 909
    assert result.ok == 908
    assert result.duration_s == pytest.approx(3.062247)
    assert result.achieved_rps == pytest.approx(908 / 3.062247)
    assert result.planned == int(300 * 3.062247)
    assert result.schedule_kept  # 909 sent of 918 planned
    assert result.in_flight_at_end == 1
    assert result.errors.total == 0
    assert result.latency is not None
    assert result.latency.count == 908
    # nearest rank, checked against NumPy's inverted-CDF percentile
    values = np.array(samples, dtype=float)
    assert result.latency.p99_ms == pytest.approx(
        np.percentile(values, 99, method="inverted_cdf") / 1e3
    )
    assert result.latency.max_ms == pytest.approx(values.max() / 1e3)
    assert result.latency.avg_ms == pytest.approx(values.mean() / 1e3)


def test_paced_counters_missing_is_an_error() -> None:
    # wrk's own report without paced.lua's done() lines
    with pytest.raises(LoadToolError):
        parse_paced_counters((DATA / "wrk_closed_latency.txt").read_text())


def test_percentile_nearest_rank() -> None:
    values = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0]
    assert percentile(values, 50) == 5.0
    assert percentile(values, 90) == 9.0
    assert percentile(values, 99) == 10.0
    assert percentile(values, 100) == 10.0
    assert percentile([7.0], 99.9) == 7.0
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError):
        percentile(values, 0)


def test_summary_of_nothing_is_none() -> None:
    assert summarize_latencies([]) is None
