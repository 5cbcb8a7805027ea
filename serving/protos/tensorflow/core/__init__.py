"""Generated protobuf code; see serving/protos/generate.py."""
