"""The descriptor pool of the vendored TF Serving protos (see `generate.py`).

A pool of our own, not protobuf's default one, so these messages can share a process
with the official ones that TensorFlow registers under the same file and symbol names.
The well-known types our protos import (`Int64Value` in ModelSpec, `Any` in
GetModelMetadataResponse) are added to it first.
"""

from __future__ import annotations

from google.protobuf import any_pb2, descriptor_pool, wrappers_pb2

POOL = descriptor_pool.DescriptorPool()
for _well_known in (any_pb2, wrappers_pb2):
    POOL.AddSerializedFile(_well_known.DESCRIPTOR.serialized_pb)
