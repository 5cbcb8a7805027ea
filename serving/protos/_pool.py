"""The descriptor pool of the generated config protos (see ``generate.py``).

Our own pool, not protobuf's default one: the files keep TF Serving's names, and the default pool
refuses a second, different definition of a file. ``wrappers.proto`` (``Int64Value`` ...), which
``BatchingParameters`` imports, is added first.
"""

from __future__ import annotations

from google.protobuf import descriptor_pool, wrappers_pb2

POOL = descriptor_pool.DescriptorPool()
POOL.AddSerializedFile(wrappers_pb2.DESCRIPTOR.serialized_pb)
