"""The REST codecs are pure: importing them loads neither TensorFlow nor a web or RPC framework.

import-linter checks the direct imports (``[tool.importlinter]`` in pyproject.toml); this test checks
what a fresh interpreter actually loads, which also catches a package that pulls TensorFlow in
behind it (any ``tensorflow.*`` or ``tensorflow_serving.apis`` module runs ``tensorflow/__init__``).
"""

from __future__ import annotations

import json
import subprocess
import sys

from tests.support import REPO

#: The codecs, and the module their REST worker processes run (it stays small beside them).
PURE_CODECS = ("serving.apis", "serving.util.json_tensor", "serving.util.json_example", "serving.util.process_executor")
FORBIDDEN = ("tensorflow", "tensorflow_serving", "keras", "starlette", "uvicorn", "grpc", "fastapi")


def test_pure_codecs_load_no_tensorflow_and_no_framework() -> None:
    script = (
        "import importlib, json, sys\n"
        f"for name in {PURE_CODECS!r}: importlib.import_module(name)\n"
        f"print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}} & set({FORBIDDEN!r}))))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60, check=True
    )
    assert json.loads(result.stdout) == []
