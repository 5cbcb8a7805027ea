"""Request coalescing: the pure merge/split functions and the batching client.

The client is driven with a fake inner `ServingClient` whose predicts wait on an event
the test controls, so which requests share a batch is decided by the test, not by
timing. The last tests go through `open_serving_client` to real fake-serving processes
(tests.api.fake_serving) told to hold their predicts, for what the factory wires in.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from api.serving_client import (
    ClientConfig,
    CoalescingConfig,
    DataType,
    Deadline,
    ModelSpec,
    ModelStatus,
    PredictRequest,
    PredictResponse,
    ServingBadResponse,
    ServingRejected,
    ServingTimeout,
    Tensor,
    open_serving_client,
)
from api.serving_client._coalescing import CoalescingClient, batch_key, merge_requests, split_response
from tests.api.fake_serving import fake_score
from tests.api.stack import FakeServing, start_fake

pytestmark = pytest.mark.anyio
SPEC = ModelSpec("fraud", "serving_default", 1)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def rows_request(*rows: list[float], spec: ModelSpec = SPEC) -> PredictRequest:
    return PredictRequest(spec, {"features": Tensor.from_rows(list(rows))})


# --- pure functions ------------------------------------------------------------------------


def test_batch_key_groups_only_compatible_requests() -> None:
    a = rows_request([1.0, 2.0])
    assert batch_key(a) == batch_key(rows_request([3.0, 4.0], [5.0, 6.0]))
    assert batch_key(a) != batch_key(rows_request([1.0, 2.0, 3.0]))  # row width
    assert batch_key(a) != batch_key(rows_request([1.0, 2.0], spec=ModelSpec("fraud", "serving_default", 2)))
    as_double = PredictRequest(SPEC, {"features": Tensor((1, 2), [1.0, 2.0], DataType.DT_DOUBLE)})
    assert batch_key(a) != batch_key(as_double)
    scalar = PredictRequest(SPEC, {"x": Tensor((), [1.0], DataType.DT_FLOAT)})
    assert batch_key(scalar) is None
    disagreeing = PredictRequest(SPEC, {"x": Tensor.from_rows([[1.0]]), "y": Tensor.from_rows([[1.0], [2.0]])})
    assert batch_key(disagreeing) is None


def test_merge_then_split_gives_each_request_its_rows() -> None:
    requests = [rows_request([1.0, 2.0]), rows_request([3.0, 4.0], [5.0, 6.0]), rows_request([7.0, 8.0])]
    merged = merge_requests(requests)
    assert merged.inputs["features"].shape == (4, 2)
    assert merged.inputs["features"].values == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]
    answer = PredictResponse(
        {
            "score": Tensor((4, 1), [0.1, 0.2, 0.3, 0.4]),
            "probs": Tensor((4, 2), [1, 2, 3, 4, 5, 6, 7, 8]),
        },
        model_version=1,
    )
    parts = split_response(answer, [1, 2, 1])
    assert [p.outputs["score"].values for p in parts] == [[0.1], [0.2, 0.3], [0.4]]
    assert [p.outputs["probs"].shape for p in parts] == [(1, 2), (2, 2), (1, 2)]
    assert parts[1].outputs["probs"].values == [3, 4, 5, 6]
    assert all(p.model_version == 1 for p in parts)


def test_merge_refuses_incompatible_and_split_refuses_unsplittable() -> None:
    with pytest.raises(ValueError):
        merge_requests([rows_request([1.0]), rows_request([1.0, 2.0])])
    with pytest.raises(ServingBadResponse, match="cannot split"):
        split_response(PredictResponse({"score": Tensor((3,), [1, 2, 3])}), [1, 1])
    with pytest.raises(ServingBadResponse):
        split_response(PredictResponse({"total": Tensor((), [1.0])}), [1, 1])


# --- the batching client ---------------------------------------------------------------


def row_sums(tensor: Tensor) -> PredictResponse:
    """The fake model: each row's sum, as output "score" of shape [rows, 1]."""
    width = tensor.row_size
    sums = [sum(tensor.values[i * width : (i + 1) * width]) for i in range(tensor.shape[0])]  # type: ignore[misc]
    return PredictResponse({"score": Tensor((len(sums), 1), sums)}, model_version=1)


class GatedServing:
    """Fake inner client: scores are row sums; every predict waits for `gate`."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.batches: list[int] = []
        self.deadlines: list[Deadline] = []
        self.fail_with: Exception | None = None
        self.closed = False

    async def predict(self, request: PredictRequest, deadline: Deadline) -> PredictResponse:
        tensor = request.inputs["features"]
        self.batches.append(tensor.shape[0])
        self.deadlines.append(deadline)
        await self.gate.wait()
        if self.fail_with is not None:
            raise self.fail_with
        return row_sums(tensor)

    async def model_status(self, model_name: str, deadline: Deadline) -> ModelStatus:
        return ModelStatus(())

    async def aclose(self) -> None:
        self.closed = True


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


class OneByOneServing:
    """Fake inner client: scores are row sums; each predict waits until the test releases
    that one (`release(i)`, the i-th call in order of arrival) or all (`release_all`)."""

    def __init__(self) -> None:
        self.batches: list[int] = []
        self._gates: list[asyncio.Event] = []
        self._all = False

    async def predict(self, request: PredictRequest, deadline: Deadline) -> PredictResponse:
        tensor = request.inputs["features"]
        self.batches.append(tensor.shape[0])
        gate = asyncio.Event()
        if self._all:
            gate.set()
        self._gates.append(gate)
        await gate.wait()
        return row_sums(tensor)

    def release(self, call: int) -> None:
        self._gates[call].set()

    def release_all(self) -> None:
        self._all = True
        for gate in self._gates:
            gate.set()

    async def model_status(self, model_name: str, deadline: Deadline) -> ModelStatus:
        return ModelStatus(())

    async def aclose(self) -> None:
        pass


async def test_a_full_batch_leaves_at_once_and_each_caller_gets_its_rows() -> None:
    inner = GatedServing()
    client = CoalescingClient(inner, window_s=60.0, max_batch_rows=4, eager_batches=0)
    calls = [asyncio.create_task(client.predict(rows_request([float(i), 1.0]), Deadline.after(30))) for i in range(4)]
    await settle()
    assert inner.batches == [4]  # the size, not the (one minute) window, sent it
    inner.gate.set()
    answers = await asyncio.gather(*calls)
    assert [a.outputs["score"].values for a in answers] == [[1.0], [2.0], [3.0], [4.0]]


async def test_the_window_sends_a_partial_batch_and_a_big_request_goes_alone() -> None:
    inner = GatedServing()
    inner.gate.set()
    client = CoalescingClient(inner, window_s=0.01, max_batch_rows=4, eager_batches=0)
    two = [client.predict(rows_request([1.0]), Deadline.after(30)) for _ in range(2)]
    big = client.predict(rows_request([1.0], [2.0], [3.0], [4.0], [5.0]), Deadline.after(30))
    answers = await asyncio.gather(*two, big)
    assert sorted(inner.batches) == [2, 5]
    assert answers[2].outputs["score"].values == [1.0, 2.0, 3.0, 4.0, 5.0]


async def test_a_request_that_would_overflow_starts_the_next_batch() -> None:
    inner = GatedServing()
    client = CoalescingClient(inner, window_s=60.0, max_batch_rows=3, eager_batches=0)
    first = asyncio.create_task(client.predict(rows_request([1.0], [1.0]), Deadline.after(30)))
    await settle()
    second = asyncio.create_task(client.predict(rows_request([2.0], [2.0]), Deadline.after(30)))
    await settle()
    assert inner.batches == [2]  # the first batch left when the second could not fit
    third = asyncio.create_task(client.predict(rows_request([3.0]), Deadline.after(30)))
    await settle()
    assert inner.batches == [2, 3]
    inner.gate.set()
    assert (await first).outputs["score"].values == [1.0, 1.0]
    assert (await second).outputs["score"].values == [2.0, 2.0]
    assert (await third).outputs["score"].values == [3.0]


async def test_a_cancelled_or_late_caller_does_not_break_the_batch() -> None:
    inner = GatedServing()
    client = CoalescingClient(inner, window_s=60.0, max_batch_rows=3, eager_batches=0)
    patient = asyncio.create_task(client.predict(rows_request([1.0]), Deadline.after(30)))
    cancelled = asyncio.create_task(client.predict(rows_request([2.0]), Deadline.after(30)))
    hasty = asyncio.create_task(client.predict(rows_request([3.0]), Deadline.after(0.05)))
    await settle()
    assert inner.batches == [3]
    cancelled.cancel()
    with pytest.raises(ServingTimeout):
        await hasty  # its own deadline, while the batch is still running
    inner.gate.set()
    assert (await patient).outputs["score"].values == [1.0]
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    # The batch ran with the latest deadline of its members, not the hasty one's.
    assert inner.deadlines[0].remaining() > 20


async def test_callers_that_left_before_the_batch_went_are_dropped() -> None:
    inner = GatedServing()
    inner.gate.set()
    client = CoalescingClient(inner, window_s=0.05, max_batch_rows=10, eager_batches=0)
    gone = asyncio.create_task(client.predict(rows_request([1.0]), Deadline.after(30)))
    stays = asyncio.create_task(client.predict(rows_request([2.0]), Deadline.after(30)))
    await settle()
    gone.cancel()
    assert (await stays).outputs["score"].values == [2.0]
    assert inner.batches == [1]


async def test_a_failed_batch_fails_every_caller_with_its_own_error() -> None:
    inner = GatedServing()
    inner.fail_with = ServingRejected("Expects arg[0] to be float")
    inner.gate.set()
    client = CoalescingClient(inner, window_s=60.0, max_batch_rows=2, eager_batches=0)
    results = await asyncio.gather(
        client.predict(rows_request([1.0]), Deadline.after(30)),
        client.predict(rows_request([2.0]), Deadline.after(30)),
        return_exceptions=True,
    )
    assert all(isinstance(r, ServingRejected) for r in results)
    assert results[0] is not results[1]


async def test_close_sends_what_is_queued_then_closes_the_inner_client() -> None:
    inner = GatedServing()
    inner.gate.set()
    client = CoalescingClient(inner, window_s=60.0, max_batch_rows=10, eager_batches=0)
    queued = asyncio.create_task(client.predict(rows_request([4.0]), Deadline.after(30)))
    await settle()
    await client.aclose()
    assert (await queued).outputs["score"].values == [4.0]
    assert inner.closed


# --- eager dispatch: no waiting for company while nothing is in flight -------------


async def test_a_lone_request_leaves_at_once_when_nothing_is_in_flight() -> None:
    inner = GatedServing()
    inner.gate.set()
    client = CoalescingClient(inner, window_s=60.0, max_batch_rows=64, eager_batches=1)
    answer = await asyncio.wait_for(client.predict(rows_request([5.0]), Deadline.after(30)), 5)
    assert answer.outputs["score"].values == [5.0]  # not held for the one-minute window
    assert inner.batches == [1]


async def test_requests_that_arrive_together_still_merge_when_eager() -> None:
    inner = GatedServing()
    inner.gate.set()
    client = CoalescingClient(inner, window_s=60.0, max_batch_rows=64, eager_batches=1)
    answers = await asyncio.gather(*(client.predict(rows_request([float(i)]), Deadline.after(30)) for i in range(8)))
    assert inner.batches == [8]
    assert [a.outputs["score"].values for a in answers] == [[float(i)] for i in range(8)]


async def test_what_queues_while_a_batch_is_in_flight_leaves_when_it_returns() -> None:
    inner = GatedServing()
    client = CoalescingClient(inner, window_s=60.0, max_batch_rows=64, eager_batches=1)
    first = asyncio.create_task(client.predict(rows_request([1.0]), Deadline.after(30)))
    await settle()
    assert inner.batches == [1]  # went at once
    later = [asyncio.create_task(client.predict(rows_request([float(i)]), Deadline.after(30))) for i in (2, 3, 4)]
    await settle()
    assert inner.batches == [1]  # one batch in flight: the next one waits (window: 1 min)
    inner.gate.set()
    assert (await first).outputs["score"].values == [1.0]
    answers = await asyncio.wait_for(asyncio.gather(*later), 5)
    assert inner.batches == [1, 3]  # sent when the first came back, not after the window
    assert [a.outputs["score"].values for a in answers] == [[2.0], [3.0], [4.0]]


async def test_the_window_still_bounds_the_wait_behind_a_slow_batch() -> None:
    inner = GatedServing()
    client = CoalescingClient(inner, window_s=0.02, max_batch_rows=64, eager_batches=1)
    slow = asyncio.create_task(client.predict(rows_request([1.0]), Deadline.after(30)))
    await settle()
    queued = asyncio.create_task(client.predict(rows_request([2.0]), Deadline.after(30)))
    await asyncio.sleep(0.1)
    assert inner.batches == [1, 1]  # the window sent it although the first is still out
    inner.gate.set()
    assert (await slow).outputs["score"].values == [1.0]
    assert (await queued).outputs["score"].values == [2.0]


@pytest.mark.parametrize(
    ("replicas", "eager_batches", "limit"),
    [(1, 1, 1), (2, 1, 2), (1, 2, 2), (2, 2, 4), (0, 1, 1)],  # no replica known yet: counted as one
)
async def test_the_eager_limit_counts_per_serving_replica(replicas: int, eager_batches: int, limit: int) -> None:
    inner = OneByOneServing()
    client = CoalescingClient(
        inner, window_s=60.0, max_batch_rows=64, eager_batches=eager_batches, replicas=lambda: replicas
    )
    calls = []
    for i in range(limit):  # one at a time: each finds the earlier ones in flight
        calls.append(asyncio.create_task(client.predict(rows_request([float(i)]), Deadline.after(30))))
        await settle()
    assert inner.batches == [1] * limit  # eager_batches x replicas left at once, side by side
    calls += [asyncio.create_task(client.predict(rows_request([float(i)]), Deadline.after(30))) for i in (10, 11)]
    await settle()
    assert inner.batches == [1] * limit  # at the limit: they wait (not for the one-minute window)
    inner.release(0)
    await settle()
    assert inner.batches == [1] * limit + [2]  # one came back: what queued leaves together
    inner.release_all()
    answers = await asyncio.wait_for(asyncio.gather(*calls), 5)
    assert [a.outputs["score"].values for a in answers] == [[float(i)] for i in (*range(limit), 10, 11)]


async def test_the_replica_count_is_read_per_batch() -> None:
    inner = GatedServing()
    replicas = [2]
    client = CoalescingClient(
        inner, window_s=60.0, max_batch_rows=64, eager_batches=1, replicas=lambda: replicas[0]
    )
    calls = [asyncio.create_task(client.predict(rows_request([1.0]), Deadline.after(30)))]
    await settle()
    calls.append(asyncio.create_task(client.predict(rows_request([2.0]), Deadline.after(30))))
    await settle()
    assert inner.batches == [1, 1]  # two replicas: a second batch goes beside the first
    replicas[0] = 1  # one replica left: the third waits for a batch to come back
    calls += [asyncio.create_task(client.predict(rows_request([float(i)]), Deadline.after(30))) for i in (3, 4)]
    await settle()
    assert inner.batches == [1, 1]
    inner.gate.set()
    await asyncio.wait_for(asyncio.gather(*calls), 5)
    assert inner.batches == [1, 1, 2]


async def test_a_lone_request_starts_no_timer_and_only_a_held_batch_gets_the_window(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Every timer the client starts goes through the loop's call_later (deadlines use
    # call_at, through asyncio.timeout); count them.
    loop = asyncio.get_running_loop()
    delays: list[float] = []
    call_later = loop.call_later

    def counted(delay: float, callback: Callable[..., object], *args: object) -> asyncio.TimerHandle:
        delays.append(delay)
        return call_later(delay, callback, *args)

    monkeypatch.setattr(loop, "call_later", counted)
    inner = GatedServing()
    inner.gate.set()
    client = CoalescingClient(inner, window_s=60.0, max_batch_rows=64, eager_batches=1)
    for i in range(3):
        answer = await client.predict(rows_request([float(i)]), Deadline.after(5))
        assert answer.outputs["score"].values == [float(i)]
    assert inner.batches == [1, 1, 1] and delays == []  # the idle path: no timer at all
    inner.gate.clear()
    first = asyncio.create_task(client.predict(rows_request([1.0]), Deadline.after(30)))
    await settle()
    held = asyncio.create_task(client.predict(rows_request([2.0]), Deadline.after(30)))
    await settle()
    assert delays == [60.0]  # the batch behind one in flight: the window, as a bound only
    inner.gate.set()
    assert (await first).outputs["score"].values == [1.0]
    assert (await held).outputs["score"].values == [2.0]
    assert inner.batches == [1, 1, 1, 1, 1]


# --- wired by open_serving_client, against real (fake) serving processes ------------------


@pytest.fixture
def two_replicas(tmp_path: Path) -> Iterator[list[FakeServing]]:
    """Two fake-serving processes (tests.api.fake_serving), stopped at the end."""
    replicas: list[FakeServing] = []
    try:
        for i in range(2):
            replicas.append(start_fake(tmp_path, f"replica-{i}"))
        yield replicas
    finally:
        for replica in replicas:
            replica.proc.stop()


async def until(predicate: Callable[[], Awaitable[bool]], timeout_s: float, what: str) -> None:
    """Poll `predicate` every 20 ms without blocking the loop; fail after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not await predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s}s waiting for {what}")
        await asyncio.sleep(0.02)


@pytest.mark.parametrize("replica_count", [1, 2])
async def test_open_serving_client_counts_the_replicas_it_spreads_over(
    two_replicas: list[FakeServing], replica_count: int
) -> None:
    """The client open_serving_client builds lets COALESCING_EAGER_BATCHES (1) batches per
    replica leave at once: with 2 replicas the second request's batch goes beside the first,
    with 1 it waits; the request after the limit waits until a batch comes back (the window
    is a minute, no attempt timeout moves a held predict on)."""
    replicas = two_replicas[:replica_count]
    for replica in replicas:
        await asyncio.to_thread(replica.hold)

    async def at_serving() -> list[int]:
        """Per replica: predicts held there or answered."""
        stats = [await asyncio.to_thread(r.stats) for r in replicas]
        return [s["pending"] + len(s["batches"]) for s in stats]

    rows = [[float(i)] * 11 for i in range(replica_count + 1)]
    config = ClientConfig(
        rest_targets=tuple(r.url for r in replicas),
        call_timeout_s=30.0,
        attempt_timeout_s=None,
        coalescing=CoalescingConfig(window_s=60.0, eager_batches=1),
    )
    async with open_serving_client(config) as client:

        def score(row: list[float]) -> asyncio.Task[PredictResponse]:
            request = PredictRequest(ModelSpec("fraud"), {"features": Tensor.from_rows([row])})
            return asyncio.create_task(client.predict(request, Deadline.after(30)))

        calls = []
        for sent, row in enumerate(rows[:replica_count], start=1):
            calls.append(score(row))

            async def reached(sent: int = sent) -> bool:
                return sum(await at_serving()) == sent

            await until(reached, 20, f"batch {sent} held at serving")
        assert await at_serving() == [1] * replica_count  # one batch in flight per replica
        calls.append(score(rows[-1]))
        await asyncio.sleep(0.5)  # time the queued batch must not use
        assert sum(await at_serving()) == replica_count and not calls[-1].done()
        await asyncio.to_thread(replicas[0].release)  # a batch comes back: the queued one leaves

        async def all_sent() -> bool:
            return sum(await at_serving()) == replica_count + 1

        await until(all_sent, 20, "the queued batch sent when one came back")
        for replica in replicas:
            await asyncio.to_thread(replica.release)
        answers = await asyncio.wait_for(asyncio.gather(*calls), 30)
    for row, answer in zip(rows, answers, strict=True):
        (output,) = answer.outputs.values()
        assert output.values == [pytest.approx(fake_score(row))]


def test_eager_batches_must_not_be_negative() -> None:
    with pytest.raises(ValueError):
        CoalescingClient(GatedServing(), window_s=0.01, max_batch_rows=4, eager_batches=-1)
