"""Regenerate the Python code of the vendored TF Serving and Open Inference Protocol protos (`make protos`).

    python -m api.protos.generate

Runs grpcio-tools' protoc on the `.proto` sources under `api/protos/` (messages:
`*_pb2.py`; services: `*_pb2_grpc.py`) with mypy-protobuf's plugins for their type
stubs (`*_pb2.pyi`, `*_pb2_grpc.pyi`: typed maps, enums and `grpc.aio` stubs, which
protoc's own `--pyi_out` does not give; mypy checks the API against them), then
rewrites two things in the output, so the code can live inside this package:

* imports: protoc writes `from tensorflow.core.framework import tensor_pb2`, after the
  proto's own path; that would import the real TensorFlow (about 700 MB). They become
  `from api.protos.tensorflow.core.framework import tensor_pb2`.
* descriptor pool: the generated modules register their files in `api.protos._pool.POOL`
  instead of protobuf's default pool. Our files keep the official file names and
  symbol names (`tensorflow.TensorProto`, ...), which is what makes them
  wire-compatible, and the default pool refuses a second definition of the same file.
  With a pool of our own, our messages and the official ones (loaded by TensorFlow or
  `tensorflow-serving-api`) can live in one process: the compatibility test and any
  tool that imports both rely on that.

Needs `grpcio-tools` and `mypy-protobuf` (dev dependencies); the API itself only needs
`protobuf` and `grpcio` at run time.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
PACKAGE = "api.protos"
# Top-level proto packages vendored here; their Python imports are re-rooted under PACKAGE.
ROOTS = ("inference", "tensorflow", "tensorflow_serving", "xla")
SERVICES = (
    "inference/open_inference_grpc.proto",
    "tensorflow_serving/apis/prediction_service.proto",
    "tensorflow_serving/apis/model_service.proto",
)
_IMPORT = re.compile(rf"^(from|import) ({'|'.join(ROOTS)})([. ])", re.MULTILINE)
_DEFAULT_POOL = "DESCRIPTOR = _descriptor_pool.Default().AddSerializedFile("
_OUR_POOL = f"from {PACKAGE} import _pool\nDESCRIPTOR = _pool.POOL.AddSerializedFile("
_MYPY_PLUGINS = ("protoc-gen-mypy", "protoc-gen-mypy_grpc")


def _protoc(*args: str) -> None:
    from grpc_tools import protoc  # dev-only dependency, imported only when generating

    include = str(Path(protoc.__file__).parent / "_proto")  # google/protobuf/*.proto
    # mypy-protobuf's plugins, installed beside this Python (the venv's bin/).
    plugins = [f"--plugin={name}={Path(sys.executable).parent / name}" for name in _MYPY_PLUGINS]
    code = protoc.main(["grpc_tools.protoc", f"-I{HERE}", f"-I{include}", *plugins, *args])
    if code != 0:
        raise SystemExit(f"protoc failed with exit code {code}")


def rewrite(source: str) -> str:
    """Re-root the vendored packages' imports under `api.protos`; use our descriptor pool."""
    source = _IMPORT.sub(lambda m: f"{m[1]} {PACKAGE}.{m[2]}{m[3]}", source)
    return source.replace(_DEFAULT_POOL, _OUR_POOL)


def main() -> None:
    protos = sorted(p.relative_to(HERE).as_posix() for p in HERE.rglob("*.proto"))
    for stale in HERE.rglob("*_pb2*.py*"):
        stale.unlink()
    _protoc(f"--python_out={HERE}", f"--mypy_out=quiet:{HERE}", *protos)
    _protoc(f"--grpc_python_out={HERE}", f"--mypy_grpc_out=quiet:{HERE}", *SERVICES)
    generated = sorted(HERE.rglob("*_pb2*.py*"))
    for path in generated:
        path.write_text(rewrite(path.read_text()))
    for directory in {p.parent for p in generated}:
        while directory != HERE:
            init = directory / "__init__.py"
            if not init.exists():
                init.write_text('"""Generated protobuf code; see api/protos/generate.py."""\n')
            directory = directory.parent
    print(f"generated {len(generated)} modules from {len(protos)} protos", file=sys.stderr)


if __name__ == "__main__":
    main()
