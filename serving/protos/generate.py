"""Regenerate the Python code of the config protos in this folder.

    python -m serving.protos.generate

Runs grpcio-tools' protoc (a dev dependency) on every ``.proto`` under ``serving/protos/``, with
mypy-protobuf's plugin for the type stubs (``*_pb2.pyi``, which mypy checks the server against), and
points the generated modules at :data:`serving.protos._pool.POOL` instead of protobuf's default
pool (see ``_pool.py`` for why), and their imports of each other at ``serving.protos`` (protoc
writes ``from tensorflow.core.example import feature_pb2``, which would load TensorFlow's own).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
_DEFAULT_POOL = "DESCRIPTOR = _descriptor_pool.Default().AddSerializedFile("
_OUR_POOL = "from serving.protos import _pool\nDESCRIPTOR = _pool.POOL.AddSerializedFile("
_IMPORT = re.compile(r"^from ([\w.]+) import (\w+_pb2)\b", re.M)
_INIT = '"""Generated protobuf code; see serving/protos/generate.py."""\n'


def main() -> None:
    from grpc_tools import protoc  # dev-only dependency, imported only when generating

    protos = sorted(p.relative_to(HERE).as_posix() for p in HERE.rglob("*.proto"))
    for stale in [*HERE.rglob("*_pb2.py"), *HERE.rglob("*_pb2.pyi")]:
        stale.unlink()
    include = str(Path(protoc.__file__).parent / "_proto")  # google/protobuf/*.proto
    # mypy-protobuf's plugin, installed beside this Python (the venv's bin/).
    mypy = [f"--plugin=protoc-gen-mypy={Path(sys.executable).parent / 'protoc-gen-mypy'}", f"--mypy_out=quiet:{HERE}"]
    args = ["protoc", f"-I{HERE}", f"-I{include}", f"--python_out={HERE}", *mypy]
    if protoc.main([*args, *protos]) != 0:
        raise SystemExit("protoc failed")
    generated = [*HERE.rglob("*_pb2.py"), *HERE.rglob("*_pb2.pyi")]
    ours = {p.relative_to(HERE).with_suffix("").as_posix().replace("/", ".") for p in generated}

    def local_import(match: re.Match[str]) -> str:
        module = f"{match.group(1)}.{match.group(2)}"
        return f"from serving.protos.{match.group(1)} import {match.group(2)}" if module in ours else match.group(0)

    for path in generated:
        text = path.read_text().replace(_DEFAULT_POOL, _OUR_POOL)
        path.write_text(_IMPORT.sub(local_import, text))
    for directory in {p.parent for p in generated}:
        while directory != HERE:
            init = directory / "__init__.py"
            if not init.exists():
                init.write_text(_INIT)
            directory = directory.parent
    print(f"generated {len(generated)} modules from {len(protos)} protos", file=sys.stderr)


if __name__ == "__main__":
    main()
