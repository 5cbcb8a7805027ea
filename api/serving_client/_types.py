"""The client's transport-neutral request and response types.

One internal representation of TF Serving's Predict and GetModelStatus calls; the REST
JSON (`_json`) and the gRPC protos (`_tensor_proto`) are codecs at the edges. A tensor
is a flat, row-major sequence of values plus a shape, like `TensorProto` with its
`tensor_content`: batch-first `[batch, ...]` for model inputs and outputs.
"""

from __future__ import annotations

import enum
import gc
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from api.serving_client._deadline import Deadline

Scalar = float | int | bool | bytes

# Metadata sent with every call: REST headers and gRPC metadata alike (lower-case keys),
# read per call from the caller's context (the API passes its request id this way).
MetadataProvider = Callable[[], Mapping[str, str]]


def no_metadata() -> Mapping[str, str]:
    """The default `MetadataProvider`: nothing added to calls."""
    return {}


class DataType(enum.IntEnum):
    """Tensor element types: names and numbers of `tensorflow.DataType` (types.proto)."""

    DT_INVALID = 0
    DT_FLOAT = 1
    DT_DOUBLE = 2
    DT_INT32 = 3
    DT_UINT8 = 4
    DT_INT16 = 5
    DT_INT8 = 6
    DT_STRING = 7
    DT_INT64 = 9
    DT_BOOL = 10
    DT_BFLOAT16 = 14
    DT_UINT16 = 17
    DT_HALF = 19
    DT_UINT32 = 22
    DT_UINT64 = 23


@dataclass(frozen=True, slots=True)
class Tensor:
    """A dense tensor: `values` flat in row-major order, `len(values) == prod(shape)`.

    Attributes:
        shape: dimensions, outermost (the batch) first; () for a scalar.
        values: the elements, flat. Floats for DT_FLOAT/DT_DOUBLE/DT_HALF/DT_BFLOAT16
            (values of the 16-bit types are rounded to them on the wire), ints for integer
            types, bools, bytes for DT_STRING. Any sequence: a list, or an `array.array`
            whose typecode is the dtype's (`_tensor_proto` then copies its bytes as they are).
        dtype: element type; None when the transport does not say (REST answers carry
            JSON numbers only).

    Raises:
        ValueError: a negative dimension, or a value count that does not match the shape.
    """

    shape: tuple[int, ...]
    values: Sequence[Scalar]
    dtype: DataType | None = None

    def __post_init__(self) -> None:
        if any(d < 0 for d in self.shape):
            raise ValueError(f"tensor shape {list(self.shape)} has a negative dimension")
        if len(self.values) != math.prod(self.shape):
            raise ValueError(
                f"tensor of shape {list(self.shape)} needs {math.prod(self.shape)} values, "
                f"got {len(self.values)}"
            )

    @classmethod
    def from_rows(cls, rows: Sequence[Sequence[float]], dtype: DataType = DataType.DT_FLOAT) -> Tensor:
        """A `[len(rows), width]` tensor from equal-length rows.

        Raises:
            ValueError: rows of different lengths, or no rows.
        """
        if not rows:
            raise ValueError("a batch needs at least one row")
        width = len(rows[0])
        flat: list[Scalar] = []
        for row in rows:
            if len(row) != width:
                raise ValueError(f"rows of different lengths: {width} and {len(row)}")
            flat.extend(row)
        return cls((len(rows), width), flat, dtype)

    @property
    def batch_size(self) -> int:
        """Size of the first dimension (1 for a scalar)."""
        return self.shape[0] if self.shape else 1

    @property
    def row_size(self) -> int:
        """Elements per batch row: the product of the dimensions after the first."""
        return math.prod(self.shape[1:])

    def to_nested(self) -> object:
        """The values as nested lists of the tensor's shape (TF Serving's JSON form)."""
        return nest(self.values, self.shape)


def nest(flat: Sequence[Scalar], shape: Sequence[int]) -> object:
    """Row-major `flat` as nested lists of `shape`; a scalar for shape ()."""
    if len(flat) <= _GC_PAUSE_ABOVE or not gc.isenabled():
        return _nest(flat, shape)
    # Millions of new lists set off the cyclic collector every 700 allocations, and each
    # pass walks the young objects again: [[v] for v in 4 Mi values] took 1.45 s with it and
    # 0.30 s without (AMD EPYC with AVX-512). None of these lists can be part of a cycle, and
    # the loop does not yield meanwhile, so nothing else allocates while it is off.
    gc.disable()
    try:
        return _nest(flat, shape)
    finally:
        gc.enable()


#: Tensors with more values than this are nested with the cyclic collector paused.
_GC_PAUSE_ABOVE = 65_536


def _nest(flat: Sequence[Scalar], shape: Sequence[int]) -> object:
    if not shape:
        return flat[0]
    if len(shape) == 1:
        return list(flat)
    if len(shape) == 2:
        # The innermost rows in one comprehension: a v2 request of [N, 1] BOOL or FP32 under
        # OIP__MAX_BODY_BYTES holds up to 4 Mi values, and a recursive call per row cost
        # ~1 µs each on the event loop.
        width = shape[1]
        if width == 1:
            return [[value] for value in flat]
        if width == 0:
            return [[] for _ in range(shape[0])]
        return [list(flat[start : start + width]) for start in range(0, shape[0] * width, width)]
    step = math.prod(shape[1:])
    return [_nest(flat[i * step : (i + 1) * step], shape[1:]) for i in range(shape[0])]


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """Which servable to call (tensorflow_serving/apis/model.proto `ModelSpec`).

    At most one of `version` and `version_label` (model.proto's `version_choice` oneof);
    neither lets serving pick its latest AVAILABLE version.

    Attributes:
        name: servable name, e.g. "fraud".
        signature_name: SignatureDef key.
        version: pin this version (`model_spec.version`, REST `/versions/N`).
        version_label: the version serving's config labels so (`model_spec.version_label`,
            REST `/labels/L`; models.config `version_labels`).

    Raises:
        ValueError: both `version` and `version_label` are set.
    """

    name: str
    signature_name: str = "serving_default"
    version: int | None = None
    version_label: str | None = None

    def __post_init__(self) -> None:
        if self.version is not None and self.version_label is not None:
            raise ValueError(
                f"model '{self.name}': both a version ({self.version}) and a version label "
                f"({self.version_label!r}) cannot be supplied"
            )

    def describe(self) -> str:
        """`fraud version 2`, `fraud label 'stable'`, `fraud latest` (for messages)."""
        if self.version is not None:
            return f"{self.name} version {self.version}"
        if self.version_label is not None:
            return f"{self.name} label '{self.version_label}'"
        return f"{self.name} latest"


@dataclass(frozen=True, slots=True)
class PredictRequest:
    """A Predict call (predict.proto `PredictRequest`).

    Attributes:
        model_spec: servable, signature and optional version.
        inputs: signature input name -> tensor, batch first.
        output_filter: output names to return; () for all of them. Sent over gRPC;
            TF Serving's REST API has no such field, so the REST transport filters the
            answer itself.
    """

    model_spec: ModelSpec
    inputs: Mapping[str, Tensor]
    output_filter: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class PredictResponse:
    """A Predict answer (predict.proto `PredictResponse`).

    Attributes:
        outputs: output name -> tensor. A REST answer for a signature with a single
            output does not name it (TF Serving's columnar format); it is under "".
        model_version: the version that ran, when the transport says (gRPC does, in
            `model_spec`; REST does not: None).
    """

    outputs: Mapping[str, Tensor]
    model_version: int | None = None


@dataclass(frozen=True, slots=True)
class VersionStatus:
    """One entry of GetModelStatusResponse.model_version_status.

    Attributes:
        version: model version number.
        state: START, LOADING, AVAILABLE, UNLOADING, END (or UNKNOWN).
        error_message: the version's status message; "" when OK.
    """

    version: int
    state: str
    error_message: str = ""


@dataclass(frozen=True, slots=True)
class ModelStatus:
    """GetModelStatusResponse: every version serving knows of one model."""

    versions: tuple[VersionStatus, ...] = field(default_factory=tuple)

    def latest_available(self) -> int | None:
        """Highest version in state AVAILABLE, or None."""
        available = [v.version for v in self.versions if v.state == "AVAILABLE"]
        return max(available) if available else None


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """One input or output of a SignatureDef (meta_graph.proto `TensorInfo`).

    Attributes:
        dtype: element type.
        shape: dimensions, -1 where unknown (the batch, usually); None when the rank is
            unknown.
        name: the graph tensor it feeds or fetches, e.g. "serving_default_features:0".
    """

    dtype: DataType
    shape: tuple[int, ...] | None
    name: str = ""


@dataclass(frozen=True, slots=True)
class SignatureInfo:
    """A SignatureDef (meta_graph.proto): its inputs and outputs by alias, and its method."""

    inputs: Mapping[str, TensorInfo]
    outputs: Mapping[str, TensorInfo]
    method_name: str = ""


@dataclass(frozen=True, slots=True)
class ModelMetadata:
    """GetModelMetadataResponse with its "signature_def" field (get_model_metadata.proto).

    Attributes:
        version: the version described: the answer's `model_spec.version`, which serving
            sets to the version it resolved (the latest AVAILABLE, or the one a label names).
        signatures: SignatureDef key -> signature.
    """

    version: int
    signatures: Mapping[str, SignatureInfo]


class ServingClient(Protocol):
    """What the API needs from the serving tier, whatever the transport.

    Implemented by `RestTransport` and `GrpcTransport` (one replica each),
    `ReplicatedClient` (round-robin and retries over several) and
    `CoalescingClient` (merges concurrent predicts). Each method raises
    only `ServingError` subclasses, and gives up by `deadline`.
    """

    async def predict(self, request: PredictRequest, deadline: Deadline) -> PredictResponse:
        """Run `request` (TF Serving Predict)."""
        ...

    async def model_status(self, model_name: str, deadline: Deadline) -> ModelStatus:
        """Every version's state of `model_name` (TF Serving GetModelStatus)."""
        ...

    async def model_metadata(
        self, model_name: str, version: int | str | None, deadline: Deadline, *, label: str | None = None
    ) -> ModelMetadata:
        """The SignatureDefs of one version (TF Serving GetModelMetadata, "signature_def"):
        `version`, else the version `label` names, else the latest AVAILABLE. A str `version`
        is a version label (as `label=`), which serving resolves."""
        ...

    async def aclose(self) -> None:
        """Release connections and tasks; the client is unusable afterwards."""
        ...
