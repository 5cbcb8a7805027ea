"""Merging requests into one batch and splitting its outputs back: pure numpy functions.

TF Serving's ``BatchingSession`` (``tensorflow_serving/batching/batching_session.cc``:
``ComputeInputSize``, ``MergeInputTensors``, ``SplitOutputTensors``) and ``batching_util.cc``
(``RoundToLowestAllowedBatchSize``, ``CalculateMaxDimSizes``, ``AddPadding``), with their error
messages. A *task* is one request's inputs, ``{input alias: array}``, every array batched along its
0-th dimension; the scheduler that forms batches lives in :mod:`serving.batching.batching_session`.

* :func:`task_size` -- rows of one task; all of its inputs must agree on the 0-th dimension.
* :func:`padded_batch_size` -- the smallest allowed batch size that holds the batch.
* :func:`merge_inputs` -- concatenate the tasks' inputs along dimension 0, optionally padding
  dimensions 1+ of variable-length inputs, then append padding rows up to the allowed size.
* :func:`split_outputs` -- cut each batched output back into one zero-copy slice per task.
* :func:`split_task_sizes`, :func:`split_inputs`, :func:`concat_outputs` -- large batch
  splitting (``enable_large_batch_splitting``): how a task is cut into parts that fit batches of
  at most ``max_execution_batch_size`` rows (``InputSplitMetadata``, ``SplitInputTask``), and how
  the parts' outputs are joined back in order (``split_task_done_callback``).

Padding follows TF Serving, not intuition -- both are traps worth knowing:

* rows added to reach an ``allowed_batch_sizes`` entry are copies of the *last* task's first row
  (a valid row, so the model runs on it; the outputs for those rows are dropped);
* with ``pad_variable_length_inputs``, dimensions 1+ of every input are padded up to the largest
  in the batch with the *first element of that task's own tensor* (``AddPadding``'s
  ``pad_value(input.flat<T>()(0))``), not with zeros; and the outputs are not un-padded, so a
  caller gets outputs as long as the longest request in its batch.

Everything here is pure: numpy and :mod:`serving.util.errors` only, no TensorFlow.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Mapping, Sequence

import numpy as np

from serving.util.errors import Code, ServingError

__all__ = [
    "MAX_PADDED_RANK",
    "check_paddable",
    "concat_outputs",
    "max_dim_sizes",
    "merge_inputs",
    "pad_to_dim_sizes",
    "padded_batch_size",
    "split_inputs",
    "split_outputs",
    "split_task_sizes",
    "task_size",
    "unpaddable_tasks",
]

Task = Mapping[str, np.ndarray]

#: ``AddPadding`` handles ranks 1 to 6 (like TensorFlow's ``PadOp``).
MAX_PADDED_RANK = 6


def task_size(inputs: Task) -> int:
    """The task's batch size: the 0-th dimension shared by all its inputs (``ComputeInputSize``).

    Raises ``INVALID_ARGUMENT`` with TF Serving's messages: ``Batching Run() must have at least
    one input tensor``, ``Batching Run() input tensors must have at least one dimension``,
    ``Batching Run() input tensors must have equal 0th-dimension size``.
    """
    if not inputs:
        raise ServingError(
            Code.INVALID_ARGUMENT, "Batching Run() must have at least one input tensor"
        )
    size: int | None = None
    for tensor in inputs.values():
        if tensor.ndim == 0:
            raise ServingError(
                Code.INVALID_ARGUMENT,
                "Batching Run() input tensors must have at least one dimension",
            )
        if size is None:
            size = int(tensor.shape[0])
        elif tensor.shape[0] != size:
            raise ServingError(
                Code.INVALID_ARGUMENT,
                "Batching Run() input tensors must have equal 0th-dimension size",
            )
    assert size is not None
    return size


def padded_batch_size(allowed_batch_sizes: Sequence[int], batch_size: int) -> int:
    """``RoundToLowestAllowedBatchSize``: the smallest allowed size >= ``batch_size``.

    ``allowed_batch_sizes`` is sorted ascending (checked when the options are read). With no
    allowed sizes, or none large enough (TF Serving logs an error then), ``batch_size`` itself;
    an empty batch (0 rows) stays empty, as there is no row to repeat as padding.
    """
    if batch_size == 0:
        return 0
    index = bisect.bisect_left(allowed_batch_sizes, batch_size)
    return allowed_batch_sizes[index] if index < len(allowed_batch_sizes) else batch_size


def check_paddable(inputs: Task) -> None:
    """Raise TF Serving's error for inputs ``AddPadding`` refuses whatever the batch.

    ``INVALID_ARGUMENT`` ``Only tensors with rank from 1 to 6 can be padded.``; call it per task
    before queueing, so that such a request fails alone.
    """
    for tensor in inputs.values():
        if not 1 <= tensor.ndim <= MAX_PADDED_RANK:
            raise ServingError(
                Code.INVALID_ARGUMENT, "Only tensors with rank from 1 to 6 can be padded."
            )


def max_dim_sizes(tasks: Sequence[Task]) -> dict[str, tuple[int, ...]]:
    """``CalculateMaxDimSizes``: per input alias, the largest size of every dimension."""
    sizes: dict[str, tuple[int, ...]] = {}
    for task in tasks:
        for alias, tensor in task.items():
            previous = sizes.get(alias)
            sizes[alias] = (
                tensor.shape if previous is None else tuple(map(max, previous, tensor.shape))
            )
    return sizes


def pad_to_dim_sizes(tensor: np.ndarray, dim_sizes: Sequence[int]) -> np.ndarray:
    """``AddPadding``: grow dimensions 1+ of ``tensor`` to ``dim_sizes`` (dimension 0 is kept).

    The new elements repeat the tensor's first element, as TF Serving pads. Returns ``tensor``
    itself when nothing grows. Raises ``INVALID_ARGUMENT`` ``Only tensors with rank from 1 to 6
    can be padded.`` and ``Got empty tensor in batch of non-empty tensors.``.
    """
    check_paddable({"": tensor})
    shape = (tensor.shape[0], *dim_sizes[1:])
    if shape == tensor.shape:
        return tensor
    if tensor.size == 0:
        raise ServingError(
            Code.INVALID_ARGUMENT, "Got empty tensor in batch of non-empty tensors."
        )
    padded = np.full(shape, tensor.flat[0], dtype=tensor.dtype)
    padded[tuple(slice(0, size) for size in tensor.shape)] = tensor
    return padded


def unpaddable_tasks(tasks: Sequence[Task]) -> dict[int, ServingError]:
    """Tasks that :func:`merge_inputs` with padding would refuse, by index, with their error.

    An empty tensor that would have to grow cannot be padded: there is no first element to
    repeat. TF Serving fails the whole batch then; the caller here fails those tasks alone and
    merges the others (which the refused tasks cannot have widened: they are empty).
    """
    sizes = max_dim_sizes(tasks)
    return {
        index: ServingError(
            Code.INVALID_ARGUMENT, "Got empty tensor in batch of non-empty tensors."
        )
        for index, task in enumerate(tasks)
        if any(
            tensor.size == 0 and tensor.shape[1:] != sizes[alias][1:]
            for alias, tensor in task.items()
        )
    }


def merge_inputs(
    tasks: Sequence[Task], padded_size: int, *, pad_variable_length_inputs: bool = False
) -> dict[str, np.ndarray]:
    """``MergeInputTensors``: one array per input alias, the tasks' rows in task order.

    ``padded_size`` (from :func:`padded_batch_size`) >= the sum of the tasks' sizes; the missing
    rows repeat the first row of the last task that has one. Without
    ``pad_variable_length_inputs``, every task's input must have the same dimensions 1+ (the
    scheduler queues requests by shape, so they do); with it, they are padded first
    (:func:`pad_to_dim_sizes`). Raises ``INVALID_ARGUMENT`` for an empty batch and for what
    :func:`pad_to_dim_sizes` refuses.
    """
    if not tasks:
        raise ServingError(Code.INTERNAL, "Batch size expected to be positive; was 0")
    sizes = max_dim_sizes(tasks) if pad_variable_length_inputs else {}
    merged: dict[str, np.ndarray] = {}
    for alias in tasks[0]:
        parts = [task[alias] for task in tasks]
        if pad_variable_length_inputs:
            parts = [pad_to_dim_sizes(part, sizes[alias]) for part in parts]
        missing = padded_size - sum(int(part.shape[0]) for part in parts)
        if missing > 0:
            donor = next((part for part in reversed(parts) if part.shape[0] > 0), None)
            if donor is not None:
                parts.append(np.repeat(donor[:1], missing, axis=0))
        merged[alias] = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=0)
    return merged


def split_outputs(
    outputs: Sequence[np.ndarray], task_sizes: Sequence[int], padded_size: int
) -> list[list[np.ndarray]]:
    """``SplitOutputTensors``: per task, its rows of every output, in order (views, no copies).

    Every output must be batched like the inputs: at least one dimension, and a 0-th dimension of
    exactly ``padded_size`` (the tasks' rows, then the padding rows, which are dropped). Raises
    ``FAILED_PRECONDITION`` with TF Serving's messages ``Batched output tensor has 0 dimensions``
    and ``Batched output tensor's 0th dimension does not equal the sum of the 0th dimension sizes
    of the input tensors``.
    """
    for tensor in outputs:
        if tensor.ndim == 0:
            raise ServingError(Code.FAILED_PRECONDITION, "Batched output tensor has 0 dimensions")
        if tensor.shape[0] != padded_size:
            raise ServingError(
                Code.FAILED_PRECONDITION,
                "Batched output tensor's 0th dimension does not equal the sum of the 0th "
                "dimension sizes of the input tensors",
            )
    bounds = itertools.accumulate(task_sizes, initial=0)
    return [
        [tensor[start:stop] for tensor in outputs] for start, stop in itertools.pairwise(bounds)
    ]


def split_task_sizes(
    size: int, open_batch_remaining: int, max_execution_batch_size: int
) -> list[int]:
    """``InputSplitMetadata::task_sizes`` (``batching_util/input_split_metadata.cc``).

    The rows of each part a task of ``size`` rows is split into, in order: the first part fills
    the open batch's ``open_batch_remaining`` free rows (or, when the open batch is full, a whole
    batch), every middle part is ``max_execution_batch_size`` rows, the last what is left. Every
    part is non-empty; the sizes add up to ``size``. All arguments must be positive except
    ``open_batch_remaining`` (>= 0); the scheduler only splits a task larger than the open batch's
    free rows.
    """
    if size <= 0 or max_execution_batch_size <= 0 or open_batch_remaining < 0:
        raise ServingError(
            Code.INTERNAL,
            f"Cannot split a task of {size} rows into batches of {max_execution_batch_size} "
            f"with {open_batch_remaining} rows free",
        )
    head = open_batch_remaining if open_batch_remaining > 0 else max_execution_batch_size
    sizes = [min(size, head)]
    left = size - sizes[0]
    while left > 0:
        sizes.append(min(left, max_execution_batch_size))
        left -= sizes[-1]
    return sizes


def split_inputs(inputs: Task, sizes: Sequence[int]) -> list[dict[str, np.ndarray]]:
    """``SplitInputTask``'s ``tensor::Split``: per part, each input's consecutive rows (views).

    ``sizes`` (from :func:`split_task_sizes`) add up to the task's 0-th dimension.
    """
    bounds = list(itertools.pairwise(itertools.accumulate(sizes, initial=0)))
    return [
        {alias: tensor[start:stop] for alias, tensor in inputs.items()} for start, stop in bounds
    ]


def concat_outputs(parts: Sequence[Sequence[np.ndarray]]) -> list[np.ndarray]:
    """``split_task_done_callback``: each output of a split task, its parts' rows concatenated
    along dimension 0 in part order (the task gets exactly the rows it would get unsplit).

    ``parts[j][i]`` is output ``i`` of part ``j``. Raises ``INVALID_ARGUMENT`` when two parts'
    outputs differ beyond dimension 0 (possible only for outputs whose size depends on the batch,
    such as padded variable-length ones; TF Serving's ``tensor::Concat`` does not check this).
    """
    if len(parts) == 1:
        return list(parts[0])
    outputs: list[np.ndarray] = []
    for index in range(len(parts[0])):
        pieces = [part[index] for part in parts]
        if any(piece.shape[1:] != pieces[0].shape[1:] for piece in pieces):
            raise ServingError(
                Code.INVALID_ARGUMENT,
                "Cannot concatenate the outputs of a split task: output "
                f"{index} has shapes {[list(piece.shape) for piece in pieces]} in its parts",
            )
        outputs.append(np.concatenate(pieces, axis=0))
    return outputs
