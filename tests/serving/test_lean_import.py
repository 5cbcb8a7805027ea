"""serving.util.lean_import: TensorFlow's optional packages stay out of the model server process.

Each case runs in a fresh interpreter, since the finder must be installed before
``import tensorflow`` and this test process has TensorFlow (and Keras) imported already.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FRAUD_VERSION = REPO / "models" / "fraud" / "1"

_SCRIPT = """
import json, sys
import numpy as np
from serving.util.lean_import import OPTIONAL_PACKAGES, keep_optional_packages_out
installed = keep_optional_packages_out()
from serving.servables.tensorflow.servable import Servable
servable = Servable.load(sys.argv[1], intra_op_threads=1, inter_op_threads=1)
_, outputs = servable.run("serving_default", {"features": np.zeros((2, 11), np.float32)})
try:
    import keras  # noqa: F401
    keras_import = "imported"
except ModuleNotFoundError as exc:
    keras_import = str(exc)
print(json.dumps({
    "installed": installed,
    "loaded": sorted({m.partition(".")[0] for m in sys.modules} & OPTIONAL_PACKAGES),
    "shapes": {k: list(v.shape) for k, v in outputs.items()},
    "keras_import": keras_import,
}))
"""


def _run(env_extra: dict[str, str]) -> dict[str, object]:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", **env_extra}
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT, str(FRAUD_VERSION)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_tensorflow_loads_and_runs_a_savedmodel_without_the_optional_packages() -> None:
    result = _run({"SERVING_KEEP_OPTIONAL_IMPORTS": ""})
    assert result["installed"] is True
    assert result["loaded"] == []
    assert result["shapes"] == {"fraud_score": [2, 1]}
    assert "kept out of the model server" in str(result["keras_import"])


def test_the_opt_out_variable_leaves_imports_alone() -> None:
    result = _run({"SERVING_KEEP_OPTIONAL_IMPORTS": "1"})
    assert result["installed"] is False
    assert "keras" in result["loaded"]  # TensorFlow imports Keras eagerly when it can
    assert result["keras_import"] == "imported"
