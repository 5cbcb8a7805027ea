"""The in-flight limit counted over every worker (`api.request.admission.in_flight.InFlightBoard`).

Unit tests with forked processes, then gunicorn with two workers against fake serving
that holds every predict: one worker is stopped (SIGSTOP) while the requests connect, so
the other accepts them all -- the uneven fill the kernel can produce on its own -- and the
limit must still be the two workers' total.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import httpx

from api.request.admission.in_flight import InFlightBoard
from tests.api.stack import launch_fake, transactions, wait_ready
from tests.api.test_gunicorn import children
from tests.support import free_port, http_ok, start_gunicorn, wait_until


def test_the_count_and_the_limit_are_every_live_workers() -> None:
    board = InFlightBoard(per_worker=2)
    board.claim()
    ready, go = os.pipe()
    child = os.fork()
    if child == 0:  # a second worker: claims its slot and holds 3 requests
        board.claim()
        for _ in range(3):
            assert not board.full()
            board.enter()
        os.write(go, b"x")
        time.sleep(30)
        os._exit(0)
    try:
        assert os.read(ready, 1) == b"x"
        board._look(force=True)
        assert board.totals() == (3, 4)  # two live workers of 2
        assert not board.full()
        board.enter()
        assert board.full()  # 4 of 4, though this worker holds only 1
    finally:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)
    board._look(force=True)
    assert board.totals() == (1, 2)  # the dead worker's slot and requests are gone
    board.leave()
    board.release()


def test_one_worker_may_take_the_share_of_another_that_accepted_nothing(tmp_path: Path) -> None:
    per_worker = 8
    fake = launch_fake(tmp_path, "serving")
    wait_ready(fake)
    port = free_port()
    gunicorn = start_gunicorn(
        tmp_path / "gunicorn.log",
        WEB_CONCURRENCY="2",
        API_BIND=f"127.0.0.1:{port}",
        SERVING_URL=fake.url,
        MAX_IN_FLIGHT_REQUESTS=str(per_worker),
        REQUEST_TIMEOUT_S="30",
        SERVING_TIMEOUT_S="30",
        ACCESS_LOG="false",
        # One predict per request, so that each request in flight is seen held at serving.
        COALESCING_ENABLED="false",
        EVENTS_JSONL_PATH=str(tmp_path / "events.jsonl"),
        PROMETHEUS_MULTIPROC_DIR=str(tmp_path / "prometheus"),
    )
    url = f"http://127.0.0.1:{port}/v1/fraud/score"
    bodies = transactions(2 * per_worker + 1)
    answers: list[int] = []
    try:
        wait_until(lambda: http_ok(f"http://127.0.0.1:{port}/readyz"), 60, "gunicorn")
        wait_until(lambda: gunicorn.log_path.read_text().count("Application startup complete") == 2, 30, "both workers")
        fake.hold()
        stopped = sorted(children(gunicorn.popen.pid))[1]
        os.kill(stopped, signal.SIGSTOP)  # the other worker accepts every connection
        try:

            def post(body: dict) -> None:
                answers.append(httpx.post(url, json=body, timeout=30).status_code)

            threads = [threading.Thread(target=post, args=(b,)) for b in bodies[: 2 * per_worker]]
            for t in threads:
                t.start()
            wait_until(lambda: fake.stats()["pending"] == 2 * per_worker, 15, "every request at serving")
        finally:
            os.kill(stopped, signal.SIGCONT)
        extra = httpx.post(url, json=bodies[-1], timeout=10)
        assert extra.status_code == 503 and extra.json()["code"] == "overloaded", extra.text
        assert "16 of 16" in extra.json()["detail"]
        fake.release()
        for t in threads:
            t.join(30)
        assert answers == [200] * (2 * per_worker)
    finally:
        fake.release()
        gunicorn.stop()
        fake.proc.stop()


def _run_with_bound(fn, timeout_s: float) -> bool:
    """Run `fn` in a thread; True when it returned within `timeout_s` (a blocked lock: False)."""
    done = threading.Event()

    def run() -> None:
        fn()
        done.set()

    threading.Thread(target=run, daemon=True).start()
    return done.wait(timeout_s)


def test_a_worker_killed_while_it_holds_the_shared_state_blocks_no_one() -> None:
    """A worker SIGKILLed in the middle of changing the table (inside `claim`, between
    taking the slot table and letting go of it) must leave the board usable by the others:
    `full()` answers, and a respawned worker's `claim()` gets a slot."""
    board = InFlightBoard(per_worker=2)
    board.claim()
    inside, told = os.pipe()
    child = os.fork()
    if child == 0:  # a worker that dies while it holds the table
        def stuck() -> None:
            os.write(told, b"x")
            time.sleep(60)

        board._free_dead_slots = stuck  # type: ignore[method-assign]  # called while the table is held
        board.claim()
        os._exit(0)
    assert os.read(inside, 1) == b"x"
    os.kill(child, signal.SIGKILL)
    os.waitpid(child, 0)
    board._looked_at = float("-inf")  # the next look also frees dead slots, as once a second
    assert _run_with_bound(board.full, 5.0), "full() blocked on the dead worker's hold"
    respawned: list[int] = []

    def claim_in_a_new_worker() -> None:
        pid = os.fork()
        if pid == 0:
            board.claim()
            os._exit(0 if not board.full() else 3)
        respawned.append(os.waitpid(pid, 0)[1])

    assert _run_with_bound(claim_in_a_new_worker, 10.0), "a respawned worker's claim() blocked"
    assert respawned == [0]
    board.release()
