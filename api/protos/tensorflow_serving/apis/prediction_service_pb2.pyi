from api.protos.tensorflow_serving.apis import get_model_metadata_pb2 as _get_model_metadata_pb2
from api.protos.tensorflow_serving.apis import predict_pb2 as _predict_pb2
from google.protobuf import descriptor as _descriptor
from typing import ClassVar as _ClassVar

DESCRIPTOR: _descriptor.FileDescriptor
