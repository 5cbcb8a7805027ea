"""The canonical status codes both tiers speak: `tensorflow.error.Code`, which is gRPC's and absl's.

One enum for the API's serving client (`api.serving_client.Code`, the code a `ServingError`
carries) and the model server (`serving.util.errors.Code`, mapped to HTTP there), with the
names and numbers of `xla/tsl/protobuf/error_codes.proto` (TensorFlow's `error::Code`, the enum
TF Serving's `status.proto` uses), `google.rpc.Code` and `grpc.StatusCode`, so a code crosses
the wire as its number and is named the same on both sides.

Written here once, rather than derived at import from a tier's generated `error_codes_pb2`: an
enum built from a descriptor is invisible to the type checker (it cannot see the members of a
functional `IntEnum` made from a non-literal), and the protobuf enum itself is a plain int
without a name. Its members are checked against the API's generated `error_codes_pb2`,
TensorFlow's own and `grpc.StatusCode` by `tests/test_canonical_codes.py`.

Shared by both tiers and therefore stdlib only, importing neither (as `cpu_quota`).
"""

from __future__ import annotations

import enum

__all__ = ["Code"]


class Code(enum.IntEnum):
    """Canonical status codes: names and numbers of `tensorflow.error.Code` and `grpc.StatusCode`."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16
