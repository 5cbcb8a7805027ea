"""The API process must never load TensorFlow."""

from __future__ import annotations

import subprocess
import sys

from tests.support import REPO

PROBE = """
import sys
from fastapi.testclient import TestClient
from api.app import create_app
from api.config.settings import Settings
from tests.support import EXAMPLE_ROUTES

app = create_app(Settings(model_routes=EXAMPLE_ROUTES.split(","), serving_url="http://127.0.0.1:9"))
with TestClient(app) as client:
    assert client.get("/healthz").json() == {"status": "ok"}
    client.post("/v1/fraud/score", json={})  # validation path
    client.get("/readyz")  # serving path (fails: nothing listens on port 9)
heavy = sorted(m for m in sys.modules if m.split(".")[0] in {"tensorflow", "keras", "tensorflow_serving"})
print("HEAVY:" + ",".join(heavy))
"""


def test_api_app_runs_without_importing_tensorflow() -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert "HEAVY:\n" in out.stdout or out.stdout.strip().endswith("HEAVY:"), out.stdout
