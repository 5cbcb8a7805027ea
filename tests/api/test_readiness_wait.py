"""`api.ops.readiness_wait`: run-server.sh's wait for the API's /readyz (clock and probe injected)."""

from __future__ import annotations

from collections.abc import Iterator

from api.ops.readiness_wait import MAX_INTERVAL_S, wait_ready


class Script:
    """Plays `answers` as successive probes (the last one repeats) on a fake clock."""

    def __init__(self, answers: list[tuple[bool, str | None]]) -> None:
        self._answers: Iterator[tuple[bool, str | None]] = iter(answers)
        self._last = answers[-1]
        self.now = 0.0
        self.sleeps: list[float] = []
        self.reports: list[str] = []

    def probe(self, url: str) -> tuple[bool, str | None]:
        self._last = next(self._answers, self._last)
        return self._last

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds

    def run(self, *, timeout_s: float = 60.0) -> int:
        return wait_ready(
            "http://api/readyz",
            timeout_s=timeout_s,
            report=self.reports.append,
            probe=self.probe,
            sleep=self.sleep,
            clock=lambda: self.now,
        )


def test_each_reason_is_reported_once_per_change_until_ready() -> None:
    script = Script([(False, None), (False, "a"), (False, "a"), (False, "b"), (False, "b"), (False, "a"), (True, None)])
    assert script.run() == 0
    assert script.reports == ["a", "b", "a"]  # not answering yet (None) is no reason


def test_the_interval_grows_to_its_cap() -> None:
    script = Script([(False, "a")])
    assert script.run(timeout_s=20.0) == 2
    assert script.sleeps[:4] == [0.25, 0.5, 1.0, 2.0]
    assert max(script.sleeps) == MAX_INTERVAL_S
    assert len(script.sleeps) <= 14  # 20 s: a poll every 2 s once grown, not five a second
    assert script.reports == ["a"]
