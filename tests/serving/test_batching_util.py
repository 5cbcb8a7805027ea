"""Unit tests for serving.batching.batching_util: TF Serving's merge / split / pad rules, pure numpy."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from serving.batching import batching_util
from serving.util.errors import Code, ServingError


def _error(call: object, *args: object, **kwargs: object) -> ServingError:
    with pytest.raises(ServingError) as info:
        call(*args, **kwargs)  # type: ignore[operator]
    return info.value


# ---- task_size (ComputeInputSize) --------------------------------------------------------------


def test_task_size_is_the_shared_zeroth_dimension() -> None:
    feeds = {"a": np.zeros((3, 2), np.float32), "b": np.zeros(3, np.int64)}
    assert batching_util.task_size(feeds) == 3
    assert batching_util.task_size({"a": np.zeros((0, 4))}) == 0


@pytest.mark.parametrize(
    ("feeds", "message"),
    [
        ({}, "Batching Run() must have at least one input tensor"),
        (
            {"a": np.float32(1.0) * np.ones(())},
            "Batching Run() input tensors must have at least one dimension",
        ),
        (
            {"a": np.zeros(2), "b": np.zeros(3)},
            "Batching Run() input tensors must have equal 0th-dimension size",
        ),
    ],
)
def test_task_size_errors_are_tf_servings(feeds: dict[str, np.ndarray], message: str) -> None:
    error = _error(batching_util.task_size, feeds)
    assert (error.code, error.message) == (Code.INVALID_ARGUMENT, message)


# ---- padded_batch_size (RoundToLowestAllowedBatchSize) ------------------------------------------


@pytest.mark.parametrize(
    ("allowed", "size", "expected"),
    [
        ((), 7, 7),
        ((2, 4, 8), 1, 2),
        ((2, 4, 8), 2, 2),
        ((2, 4, 8), 3, 4),
        ((2, 4, 8), 8, 8),
        ((2, 4, 8), 9, 9),  # none large enough: unchanged (TF Serving logs an error)
        ((2, 4, 8), 0, 0),  # nothing to repeat as padding
    ],
)
def test_padded_batch_size(allowed: tuple[int, ...], size: int, expected: int) -> None:
    assert batching_util.padded_batch_size(allowed, size) == expected


# ---- merge_inputs (MergeInputTensors) -----------------------------------------------------------


def test_merge_concatenates_tasks_in_order() -> None:
    tasks = [
        {"x": np.array([[1, 2]], np.float32), "k": np.array([b"a"], object)},
        {"x": np.array([[3, 4], [5, 6]], np.float32), "k": np.array([b"b", b"c"], object)},
    ]
    merged = batching_util.merge_inputs(tasks, 3)
    np.testing.assert_array_equal(merged["x"], [[1, 2], [3, 4], [5, 6]])
    assert merged["x"].dtype == np.float32
    assert merged["k"].tolist() == [b"a", b"b", b"c"]


def test_merge_of_one_task_is_zero_copy() -> None:
    x = np.arange(4, dtype=np.float32).reshape(2, 2)
    assert batching_util.merge_inputs([{"x": x}], 2)["x"] is x


def test_merge_pads_with_copies_of_the_last_tasks_first_row() -> None:
    """``allowed_batch_sizes`` padding: TF Serving repeats ``tensor_vec.back().Slice(0, 1)``."""
    tasks = [{"x": np.array([[1, 1]], np.int32)}, {"x": np.array([[7, 8], [9, 9]], np.int32)}]
    merged = batching_util.merge_inputs(tasks, 6)
    np.testing.assert_array_equal(merged["x"], [[1, 1], [7, 8], [9, 9], [7, 8], [7, 8], [7, 8]])


def test_merge_pads_from_an_earlier_task_when_the_last_is_empty() -> None:
    tasks = [{"x": np.array([5.0])}, {"x": np.zeros(0)}]
    np.testing.assert_array_equal(batching_util.merge_inputs(tasks, 3)["x"], [5.0, 5.0, 5.0])


def test_merge_pads_variable_length_inputs_with_the_tasks_first_element() -> None:
    """``AddPadding``: dimensions 1+ grow to the batch's maximum, filled with tensor.flat[0]."""
    tasks = [
        {"ids": np.array([[4, 5]], np.int64)},
        {"ids": np.array([[7, 8, 9, 1]], np.int64)},
        {"ids": np.array([[2, 3, 6], [0, 0, 0]], np.int64)},
    ]
    merged = batching_util.merge_inputs(tasks, 4, pad_variable_length_inputs=True)
    np.testing.assert_array_equal(
        merged["ids"], [[4, 5, 4, 4], [7, 8, 9, 1], [2, 3, 6, 2], [0, 0, 0, 2]]
    )


def test_merge_pads_strings_too() -> None:
    tasks = [{"s": np.array([[b"a"]], object)}, {"s": np.array([[b"b", b"c"]], object)}]
    merged = batching_util.merge_inputs(tasks, 2, pad_variable_length_inputs=True)
    assert merged["s"].tolist() == [[b"a", b"a"], [b"b", b"c"]]


def test_merge_of_nothing_is_an_internal_error() -> None:
    assert _error(batching_util.merge_inputs, [], 0).code is Code.INTERNAL


# ---- padding checks (AddPadding) ----------------------------------------------------------------


def test_pad_to_dim_sizes_keeps_dimension_zero_and_returns_unchanged_tensors() -> None:
    x = np.ones((2, 3), np.float32)
    assert batching_util.pad_to_dim_sizes(x, (9, 3)) is x
    assert batching_util.pad_to_dim_sizes(x, (9, 5)).shape == (2, 5)


@pytest.mark.parametrize("rank", [0, 7])
def test_only_ranks_one_to_six_can_be_padded(rank: int) -> None:
    feeds = {"x": np.zeros((1,) * rank)}
    error = _error(batching_util.check_paddable, feeds)
    assert (error.code, error.message) == (
        Code.INVALID_ARGUMENT,
        "Only tensors with rank from 1 to 6 can be padded.",
    )
    batching_util.check_paddable({"x": np.zeros((1,) * 6)})


def test_an_empty_tensor_cannot_be_padded() -> None:
    error = _error(batching_util.pad_to_dim_sizes, np.zeros((0, 2)), (3, 4))
    assert error.message == "Got empty tensor in batch of non-empty tensors."


def test_unpaddable_tasks_are_refused_alone() -> None:
    tasks = [
        {"x": np.ones((1, 4))},
        {"x": np.zeros((0, 2))},  # empty and narrower than the batch: refused
        {"x": np.zeros((0, 4))},  # empty but already as wide: fine
        {"x": np.ones((2, 3))},
    ]
    refused = batching_util.unpaddable_tasks(tasks)
    assert list(refused) == [1]
    assert refused[1].code is Code.INVALID_ARGUMENT


def test_an_empty_tensor_already_as_wide_as_the_batch_is_not_refused() -> None:
    # The widest input is empty: the others are padded up to it, and it needs no padding itself.
    tasks = [{"x": np.ones((1, 3))}, {"x": np.zeros((0, 9))}, {"x": np.zeros((0, 3))}]
    assert list(batching_util.unpaddable_tasks(tasks)) == [2]
    merged = batching_util.merge_inputs(tasks[:2], 1, pad_variable_length_inputs=True)
    np.testing.assert_array_equal(merged["x"], [[1.0] * 9])


# ---- split_outputs (SplitOutputTensors) ---------------------------------------------------------


def test_split_gives_each_task_its_rows_as_views() -> None:
    scores = np.arange(12, dtype=np.float32).reshape(6, 2)
    labels = np.array([b"a", b"b", b"c", b"d", b"e", b"f"], object)
    parts = batching_util.split_outputs([scores, labels], [1, 3, 0], 6)  # 2 rows of padding
    assert [len(part[0]) for part in parts] == [1, 3, 0]
    np.testing.assert_array_equal(parts[1][0], scores[1:4])
    assert parts[1][1].tolist() == [b"b", b"c", b"d"]
    assert np.shares_memory(parts[1][0], scores)


def test_split_refuses_unbatched_outputs() -> None:
    error = _error(batching_util.split_outputs, [np.float32(1.0) * np.ones(())], [1], 1)
    assert (error.code, error.message) == (
        Code.FAILED_PRECONDITION,
        "Batched output tensor has 0 dimensions",
    )
    error = _error(batching_util.split_outputs, [np.zeros(5)], [2, 2], 4)
    assert error.code is Code.FAILED_PRECONDITION
    assert error.message.startswith("Batched output tensor's 0th dimension does not equal")


# ---- large batch splitting (InputSplitMetadata, SplitInputTask) ------------------------------


@pytest.mark.parametrize(
    ("size", "free", "limit", "expected"),
    [
        (10, 3, 4, [3, 4, 3]),  # input_split_metadata.cc's head / middle / tail
        (10, 0, 4, [4, 4, 2]),  # a full open batch: the head is a whole batch
        (8, 4, 4, [4, 4]),
        (9, 1, 4, [1, 4, 4]),
        (2, 1, 4, [1, 1]),
        (3, 5, 4, [3]),
    ],
)
def test_split_task_sizes(size: int, free: int, limit: int, expected: list[int]) -> None:
    assert batching_util.split_task_sizes(size, free, limit) == expected


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 200), st.integers(1, 16), st.data())
def test_split_task_sizes_cover_the_task_in_batches_no_larger_than_the_limit(
    size: int, limit: int, data: st.DataObject
) -> None:
    free = data.draw(st.integers(0, limit))
    sizes = batching_util.split_task_sizes(size, free, limit)
    assert sum(sizes) == size and all(0 < part <= limit for part in sizes)
    assert sizes[0] == min(size, free or limit)
    assert all(part == limit for part in sizes[1:-1])


def test_split_task_sizes_refuses_what_cannot_be_split() -> None:
    assert _error(batching_util.split_task_sizes, 4, 0, 0).code is Code.INTERNAL


def test_split_inputs_then_concat_outputs_is_the_identity() -> None:
    task = {"x": np.arange(20, dtype=np.float32).reshape(10, 2), "t": np.arange(10).astype(object)}
    parts = batching_util.split_inputs(task, [3, 4, 3])
    assert [len(part["x"]) for part in parts] == [3, 4, 3]
    assert all(np.shares_memory(part["x"], task["x"]) for part in parts)  # views, no copies
    joined = batching_util.concat_outputs([[part["x"], part["t"]] for part in parts])
    np.testing.assert_array_equal(joined[0], task["x"])
    assert joined[1].tolist() == task["t"].tolist()
    single = [np.ones((2, 2))]
    assert batching_util.concat_outputs([single])[0] is single[0]


def test_concat_outputs_refuses_parts_that_differ_beyond_dimension_0() -> None:
    error = _error(batching_util.concat_outputs, [[np.zeros((2, 3))], [np.zeros((1, 4))]])
    assert error.code is Code.INVALID_ARGUMENT
    assert error.message.startswith("Cannot concatenate the outputs of a split task: output 0")


# ---- round trip -----------------------------------------------------------------------------


@st.composite
def _tasks(draw: st.DrawFn) -> tuple[list[dict[str, np.ndarray]], tuple[int, ...]]:
    inner = tuple(draw(st.lists(st.integers(1, 3), max_size=2)))
    sizes = draw(st.lists(st.integers(0, 4), min_size=1, max_size=6))
    allowed = tuple(sorted(draw(st.sets(st.integers(1, 30), max_size=3))))
    counter = iter(range(10_000))
    tasks = [
        {
            "x": np.array(
                [next(counter) for _ in range(size * int(np.prod(inner)))], np.float64
            ).reshape((size, *inner)),
            "tag": np.array([f"{index}:{row}".encode() for row in range(size)], object),
        }
        for index, size in enumerate(sizes)
    ]
    return tasks, allowed


@settings(max_examples=200, deadline=None)
@given(_tasks())
def test_merge_then_split_gives_every_task_exactly_its_rows(
    case: tuple[list[dict[str, np.ndarray]], tuple[int, ...]],
) -> None:
    """An identity model's outputs, split, are each task's own inputs -- with any padding."""
    tasks, allowed = case
    sizes = [batching_util.task_size(task) for task in tasks]
    padded = batching_util.padded_batch_size(allowed, sum(sizes))
    merged = batching_util.merge_inputs(tasks, padded)
    assert merged["x"].shape[0] == padded if sum(sizes) else merged["x"].shape[0] == 0
    for task, (x, tag) in zip(
        tasks, batching_util.split_outputs([merged["x"], merged["tag"]], sizes, padded), strict=True
    ):
        np.testing.assert_array_equal(x, task["x"])
        assert tag.tolist() == task["tag"].tolist()
