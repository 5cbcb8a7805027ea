"""api.security.rate_limit: the token bucket's arithmetic, the shared table across forked
processes (exact under contention, a dead lock holder stalls no one), its bounded memory."""

from __future__ import annotations

import fcntl
import multiprocessing
import os
import signal
import threading

import pytest

from api.config.security import RateLimitSettings
from api.security.rate_limit import PROBES, RateLimiter, SharedBuckets
from tests.api.tokens import Clock

FORK = multiprocessing.get_context("fork")


def test_a_bucket_gives_its_burst_then_its_rate() -> None:
    clock = Clock()
    buckets = SharedBuckets(64, clock)
    assert [buckets.take(b"k", 2.0, 3) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert buckets.take(b"k", 2.0, 3) == pytest.approx(0.5)  # one token every 0.5 s
    clock.now += 0.25
    assert buckets.take(b"k", 2.0, 3) == pytest.approx(0.25)
    clock.now += 0.25
    assert buckets.take(b"k", 2.0, 3) == 0.0
    clock.now += 100  # refills to the burst, no more
    assert [buckets.take(b"k", 2.0, 3) for _ in range(4)].count(0.0) == 3


def test_keys_have_their_own_buckets() -> None:
    buckets = SharedBuckets(64, Clock())
    assert buckets.take(b"a", 1.0, 1) == 0.0
    assert buckets.take(b"a", 1.0, 1) > 0
    assert buckets.take(b"b", 1.0, 1) == 0.0


def _hammer(buckets: SharedBuckets, calls: int, start: threading.Event, out: multiprocessing.Queue) -> None:
    start.wait()
    out.put(sum(buckets.take(b"shared", 1e-9, 1000) == 0.0 for _ in range(calls)))


def test_forked_workers_share_the_buckets_exactly() -> None:
    # Four processes race for one bucket of 1,000 tokens (refill negligible): exactly 1,000 are
    # taken in all. Without the lock their read-modify-writes would interleave and overshoot.
    buckets = SharedBuckets(64)
    start, out = FORK.Event(), FORK.Queue()
    procs = [FORK.Process(target=_hammer, args=(buckets, 600, start, out)) for _ in range(4)]
    for p in procs:
        p.start()
    start.set()
    taken = [out.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(30)
    assert sum(taken) == 1000, taken
    assert sum(1 for t in taken if t > 0) >= 2  # more than one process did get tokens


def _hold_the_lock(buckets: SharedBuckets, held: multiprocessing.synchronize.Event) -> None:
    fcntl.lockf(buckets._fd, fcntl.LOCK_EX)
    held.set()
    signal.pause()


def test_a_worker_killed_holding_the_lock_stalls_no_one() -> None:
    buckets = SharedBuckets(64)
    held = FORK.Event()
    holder = FORK.Process(target=_hold_the_lock, args=(buckets, held))
    holder.start()
    assert held.wait(30)
    with pytest.raises(BlockingIOError):  # the lock is real: another process cannot take it now
        fcntl.lockf(buckets._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.kill(holder.pid, signal.SIGKILL)
    holder.join(30)
    done = threading.Event()
    result: list[float] = []

    def take() -> None:
        result.append(buckets.take(b"k", 1.0, 1))
        done.set()

    threading.Thread(target=take, daemon=True).start()
    assert done.wait(30), "take() still waits for the dead worker's lock"
    assert result == [0.0]


def test_the_table_is_bounded_and_reuses_the_bucket_touched_longest_ago() -> None:
    clock = Clock()
    buckets = SharedBuckets(PROBES, clock)  # every key probes every slot
    for i in range(PROBES):
        clock.now += 1
        assert buckets.take(f"k{i}".encode(), 0.001, 1) == 0.0
    assert buckets.take(b"k3", 0.001, 1) > 0  # still held: k3 has no token left
    clock.now += 0.01
    assert buckets.take(b"new", 0.001, 1) == 0.0  # takes k0's slot, the oldest
    assert buckets.take(b"k0", 0.001, 1) == 0.0  # k0 comes back with a fresh bucket (k1's slot)
    assert buckets.take(b"k5", 0.001, 1) > 0  # the recent ones kept theirs


def test_the_limiter_matches_rules_by_pattern_and_rounds_retry_after_up() -> None:
    limiter = RateLimiter(
        RateLimitSettings.model_validate(
            {"routes": {"/v1/fraud/score": {"rate": 0.4, "burst": 1}, "/v1/*": {"rate": 100, "burst": 100}}}
        )
    )
    assert limiter.check("/healthz", "addr:1") is None  # no rule
    assert limiter.check("/v1/fraud/score", "key:a") is None
    limited = limiter.check("/v1/fraud/score", "key:a")
    assert limited is not None and limited.pattern == "/v1/fraud/score" and limited.retry_after_s == 3  # 2.5 s up
    assert limiter.check("/v1/fraud/score", "key:b") is None  # another client
    assert limiter.check("/v1/digits/classify", "key:a") is None  # another rule, its own bucket
