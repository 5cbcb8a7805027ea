"""Batching options: TF Serving's ``BatchingParameters`` (``--batching_parameters_file``), checked.

The scheduler's and the batching session's options (``SharedBatchScheduler::Options`` /
``QueueOptions``, ``BatchingSessionOptions`` of ``batching/batching_session.h`` and
``batching/batching_options.h``), read from ``session_bundle_config.proto``'s ``BatchingParameters``
and checked as TF Serving checks them (``servables/tensorflow/bundle_factory_util.cc``). What each
option does is :mod:`serving.batching.batching_session`'s to say.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass
from typing import Literal

from serving.protos.tensorflow_serving.servables.tensorflow import session_bundle_config_pb2
from serving.util.errors import Code, ServingError
from serving.util.proto_util import read_text_proto_file

__all__ = [
    "MODEL_SERVER_THREAD_POOL_NAME",
    "BatchingOptions",
    "BatchingParameters",
    "read_batching_parameters_file",
]

#: The batch threads' name when the server batches without ``--batching_parameters_file``
#: (``model_servers/server.cc``); with a file, ``thread_pool_name`` or ``batch_threads``.
MODEL_SERVER_THREAD_POOL_NAME = "model_server_batch_threads"

BatchingParameters = session_bundle_config_pb2.BatchingParameters
# The BatchingParameters fields that wrap an int64 (google.protobuf.Int64Value).
_Int64Field = Literal["max_batch_size", "batch_timeout_micros", "max_enqueued_batches", "num_batch_threads"]


def read_batching_parameters_file(path: str) -> BatchingParameters:
    """Parse ``--batching_parameters_file`` (text-format ``BatchingParameters``).

    Raises ``INVALID_ARGUMENT`` ``Invalid protobuf file: '<path>': ...`` or ``Could not read
    batching parameters file '<path>': ...``.
    """
    return read_text_proto_file(path, BatchingParameters(), "batching parameters")


@dataclass(frozen=True)
class BatchingOptions:
    """The scheduler's and the batching session's options, TF Serving's defaults.

    ``SharedBatchScheduler::Options`` / ``QueueOptions`` and ``BatchingSessionOptions``; each
    field documented as in ``session_bundle_config.proto``.
    """

    max_batch_size: int = 1000
    """Most rows in one batch (and in one request)."""
    batch_timeout_micros: int = 0
    """How long the first task of an open batch waits for company before the batch may run."""
    max_enqueued_batches: int = 10
    """Batches a queue holds (the open one included) before it refuses tasks."""
    num_batch_threads: int = 1
    """Batches processed at once, over all queues."""
    thread_pool_name: str = "batch_threads"
    """Name of the batch threads (and the ``queuing_latency`` metric's label)."""
    allowed_batch_sizes: tuple[int, ...] = ()
    """Batch sizes to pad up to (ascending, the last equal to ``max_batch_size``); empty: any."""
    pad_variable_length_inputs: bool = False
    """Pad dimensions 1+ of the batch's inputs to the largest in the batch."""
    enable_large_batch_splitting: bool = False
    """Split requests across batches of at most ``max_execution_batch_size`` rows (see the module
    docstring); ``max_batch_size`` then bounds one request, not one batch."""
    max_execution_batch_size: int | None = None
    """With splitting: most rows in one executed batch, padding included (``None``:
    ``max_batch_size``). Ignored without splitting, as TF Serving ignores it."""

    @property
    def execution_batch_size_limit(self) -> int:
        """Most rows in one executed batch (``Queue::max_execution_batch_size``): with splitting,
        ``max_execution_batch_size`` (``max_batch_size`` when unset), else ``max_batch_size``."""
        if self.enable_large_batch_splitting and self.max_execution_batch_size is not None:
            return self.max_execution_batch_size
        return self.max_batch_size

    @classmethod
    def from_parameters(
        cls,
        parameters: BatchingParameters | None,
        *,
        default_num_batch_threads: int,
    ) -> BatchingOptions:
        """Options from a ``BatchingParameters`` proto (``None``: the flag-less defaults).

        Unset fields keep TF Serving's defaults; ``num_batch_threads`` defaults to
        ``default_num_batch_threads`` (``port::MaxParallelism()``, the schedulable CPUs). Raises
        ``INVALID_ARGUMENT`` with TF Serving's messages (``num_batch_threads must be positive;
        was 0``, ``max_batch_size must be positive; was 0``, ``batch_timeout_micros must be
        non-negative; was -1``, ``max_enqueued_batches must be non-negative; was -1``,
        ``allowed_batch_sizes entries must be monotonically increasing``, ``Last entry in
        allowed_batch_sizes must match max_batch_size; last entry was 64; expected 128``; with
        ``enable_large_batch_splitting``, the rules of :meth:`validate`).
        """
        if parameters is None:
            return cls(
                num_batch_threads=default_num_batch_threads,
                thread_pool_name=MODEL_SERVER_THREAD_POOL_NAME,
            )

        def value(field: _Int64Field, default: int) -> int:
            return int(getattr(parameters, field).value) if parameters.HasField(field) else default

        options = cls(
            max_batch_size=value("max_batch_size", cls.max_batch_size),
            batch_timeout_micros=value("batch_timeout_micros", cls.batch_timeout_micros),
            max_enqueued_batches=value("max_enqueued_batches", cls.max_enqueued_batches),
            num_batch_threads=value("num_batch_threads", default_num_batch_threads),
            thread_pool_name=(
                parameters.thread_pool_name.value
                if parameters.HasField("thread_pool_name")
                else cls.thread_pool_name
            ),
            allowed_batch_sizes=tuple(parameters.allowed_batch_sizes),
            pad_variable_length_inputs=parameters.pad_variable_length_inputs,
            enable_large_batch_splitting=parameters.enable_large_batch_splitting.value,
            max_execution_batch_size=(
                int(parameters.max_execution_batch_size.value)
                if parameters.HasField("max_execution_batch_size")
                else None
            ),
        )
        options.validate()
        return options

    def validate(self) -> None:
        """Raise ``INVALID_ARGUMENT`` for options TF Serving refuses (:meth:`from_parameters`).

        With ``enable_large_batch_splitting``, ``allowed_batch_sizes`` are checked as TF Serving's
        ``CreateBasicBatchingSession`` checks them (increasing; ``Last entry in allowed_batch_sizes
        must be less than or equal to max_batch_size; last entry was 16; expected 8``; ``Last entry
        in allowed_batch_sizes must be equal to max_execution_batch_size; last entry was 8;
        expected 4``), then the queue as ``SharedBatchScheduler::AddQueue`` checks it
        (``max_enqueued_batches must be positive; was 0``; ``When enable_large_batch_splitting is
        true, input_batch_size_limit must be greater than or equal to max_execution_batch_size.``
        followed by the values TF appends), then ``max_execution_batch_size must be positive; was
        0`` (ours).
        """

        def invalid(message: str) -> ServingError:
            return ServingError(Code.INVALID_ARGUMENT, message)

        if self.num_batch_threads < 1:
            raise invalid(f"num_batch_threads must be positive; was {self.num_batch_threads}")
        if self.max_batch_size <= 0:
            raise invalid(f"max_batch_size must be positive; was {self.max_batch_size}")
        if self.batch_timeout_micros < 0:
            raise invalid(
                f"batch_timeout_micros must be non-negative; was {self.batch_timeout_micros}"
            )
        if self.max_enqueued_batches < 0:
            raise invalid(
                f"max_enqueued_batches must be non-negative; was {self.max_enqueued_batches}"
            )
        sizes = self.allowed_batch_sizes
        if sizes and any(later <= earlier for earlier, later in itertools.pairwise(sizes)):
            raise invalid("allowed_batch_sizes entries must be monotonically increasing")
        if not self.enable_large_batch_splitting:
            if sizes and sizes[-1] != self.max_batch_size:
                raise invalid(
                    "Last entry in allowed_batch_sizes must match max_batch_size; last entry "
                    f"was {sizes[-1]}; expected {self.max_batch_size}"
                )
            return
        limit = self.execution_batch_size_limit
        if sizes:
            if sizes[-1] > self.max_batch_size:
                raise invalid(
                    "Last entry in allowed_batch_sizes must be less than or equal to "
                    f"max_batch_size; last entry was {sizes[-1]}; expected {self.max_batch_size}"
                )
            if sizes[-1] != limit:
                raise invalid(
                    "Last entry in allowed_batch_sizes must be equal to max_execution_batch_size; "
                    f"last entry was {sizes[-1]}; expected {limit}"
                )
        if self.max_enqueued_batches == 0:
            # AddQueue rewrites 0 to 1 only when not splitting.
            raise invalid("max_enqueued_batches must be positive; was 0")
        if self.max_batch_size < limit:
            # TF's errors::InvalidArgument(message, splitting, limit, max_execution_batch_size)
            # StrCats its arguments: the flag prints as 1 and the numbers follow unseparated.
            raise invalid(
                "When enable_large_batch_splitting is true, input_batch_size_limit must be "
                f"greater than or equal to max_execution_batch_size.1{self.max_batch_size}{limit}"
            )
        if limit <= 0:
            raise invalid(f"max_execution_batch_size must be positive; was {limit}")

    def describe(self) -> str:
        """One line for the start-up log."""
        return ", ".join(
            f"{field.name}={getattr(self, field.name)!r}" for field in dataclasses.fields(self)
        )
