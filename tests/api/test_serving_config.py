"""run-server.sh's reading of serving's model config: the protobuf text format, without TensorFlow."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from api.config.serving_config import ModelConfigError, model_names, parse_model_server_config
from tests.support import REPO

FULL = """
# comments, both message forms, labels, a version policy, logging: everything TF Serving takes
model_config_list {
  config {
    name: "fraud"
    base_path: "/models/fraud"
    model_platform: "tensorflow"
    model_version_policy { specific { versions: 1 versions: 2 } }
    version_labels { key: "stable" value: 1 }
    logging_config { sampling_config { sampling_rate: 0.5 } log_collector_config { type: "x" } }
  }
  config: < name: 'di\\x67its' base_path: "/models/digits" model_version_policy: { latest: { num_versions: 2 } } >
}
"""


def test_the_example_config_and_every_form_parse() -> None:
    assert model_names((REPO / "models.config").read_text()) == ["fraud", "digits"]
    assert model_names(FULL) == ["fraud", "digits"]
    assert model_names('model_config_list { config { name: "only" base_path: "/m/only" } }') == ["only"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('model_config_list { config { nam: "a" } }', 'no field named "nam"'),
        ('model_config_list { config { name: "a" }', "1:"),  # unbalanced, with its position
        ("model_config_list { }", "has no config"),
        ('model_config_list { config { base_path: "/m/a" } }', "has no name"),
        ('custom_model_config { type_url: "x" }', "names no models"),
        ("", "names no models"),
    ],
)
def test_what_is_not_a_list_of_models_is_refused(text: str, message: str) -> None:
    with pytest.raises(ModelConfigError, match=message):
        model_names(text)


def test_the_message_is_tf_servings_own() -> None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    official = pytest.importorskip("tensorflow_serving.config.model_server_config_pb2")
    from google.protobuf import text_format

    theirs = text_format.Parse(FULL, official.ModelServerConfig()).SerializeToString(deterministic=True)
    assert parse_model_server_config(FULL).SerializeToString(deterministic=True) == theirs


def test_the_command_prints_the_names_and_imports_no_tensorflow(tmp_path) -> None:  # type: ignore[no-untyped-def]
    probe = (
        "import runpy, sys; sys.argv = ['x', 'models.config']\n"
        "try:\n    runpy.run_module('api.config.serving_config', run_name='__main__')\n"
        "except SystemExit as e:\n    assert e.code == 0, e.code\n"
        "print('TF:' + str('tensorflow' in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["fraud", "digits", "TF:False"]
    bad = tmp_path / "bad.config"
    bad.write_text("model_config_list { config { nam: 1 } }")
    out = subprocess.run(
        [sys.executable, "-m", "api.config.serving_config", str(bad)],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 2 and 'no field named "nam"' in out.stderr
