"""Generated protobuf code; see api/protos/generate.py."""
