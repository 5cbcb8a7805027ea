"""bench.front_door: every case runs and reports a CPU figure (a few calls: the figures mean nothing)."""

from __future__ import annotations

import json

import pytest

from bench.front_door import main


def test_every_case_reports_cpu_per_call(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--calls", "300", "--json"]) == 0
    cases = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [c["case"] for c in cases] == [
        "buckets.take",
        "rate limit, auth off",
        "rate limit, refused",
        "api key",
        "api key + rate limit",
        "jwt cached + rate limit",
        "jwt verify (RS256)",
        "rate limit, 2 processes",
    ]
    assert all(c["cpu_us_per_call"] > 0 for c in cases)
