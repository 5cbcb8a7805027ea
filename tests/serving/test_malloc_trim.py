"""MallocTrimmer: one trim shortly after large requests, or once released bytes add up to as much."""

from __future__ import annotations

import time

from serving.util.malloc_trim import LARGE_REQUEST_BYTES, MallocTrimmer


def _counting_trimmer() -> tuple[MallocTrimmer, list[int]]:
    calls: list[int] = []
    trimmer = MallocTrimmer(delay_s=0.01)
    trimmer._trim = lambda pad: calls.append(pad) or 1  # the glibc call, counted instead
    return trimmer, calls


def _settle() -> None:
    time.sleep(0.2)  # the trim runs on a timer thread


def test_released_bytes_trim_once_they_add_up_to_a_large_request() -> None:
    trimmer, calls = _counting_trimmer()
    for _ in range(15):
        trimmer.released(1024 * 1024)
    _settle()
    assert calls == []  # 15 MiB: not yet
    trimmer.released(1024 * 1024)
    _settle()
    assert calls == [0]
    trimmer.released(LARGE_REQUEST_BYTES - 1)  # the count started again after the trim
    _settle()
    assert calls == [0]


def test_large_requests_ending_together_trim_once() -> None:
    trimmer, calls = _counting_trimmer()
    for _ in range(5):
        trimmer.large_request_done()
    _settle()
    assert calls == [0]
