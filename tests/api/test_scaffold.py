"""`python -m api.model_routes.scaffold`: a route module and a config entry from a SavedModel's signature.

Read from the example exports under models/ (TensorFlow wrote them) and from SavedModels
built here with the API's protos for the dtypes and shapes the examples lack; the generated
module is imported and checked as the app would use it (its declaration fits the signature,
its schema is strict). Serving a scaffolded route through both tiers: tests/test_own_model.py.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from pydantic import ValidationError

from api.config.serving_config import model_names
from api.inference.readiness import signature_mismatches
from api.model_routes import DataType, ModelInfo, Prediction
from api.model_routes.scaffold import JSON_TYPES, main
from api.protos.tensorflow.core.protobuf import saved_model_pb2
from api.serving_client import SignatureInfo, TensorInfo
from tests.support import REPO


def scaffold(*args: str) -> tuple[int, str, str]:
    done = subprocess.run(
        [sys.executable, "-m", "api.model_routes.scaffold", *args], capture_output=True, text=True, cwd=REPO, timeout=60
    )
    return done.returncode, done.stdout, done.stderr


def load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module  # as an import would (pydantic resolves the annotations there)
    spec.loader.exec_module(module)
    return module


def served(version_dir: Path) -> SignatureInfo:
    saved = saved_model_pb2.SavedModel()
    saved.ParseFromString((version_dir / "saved_model.pb").read_bytes())
    signature = saved.meta_graphs[0].signature_def["serving_default"]

    def infos(tensors: object) -> dict[str, TensorInfo]:
        return {
            alias: TensorInfo(DataType(info.dtype), tuple(d.size for d in info.tensor_shape.dim))
            for alias, info in tensors.items()  # type: ignore[attr-defined]
        }

    return SignatureInfo(inputs=infos(signature.inputs), outputs=infos(signature.outputs))


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A project of one's own: the example digits model in <project>/models/digits/1."""
    shutil.copytree(REPO / "models" / "digits", tmp_path / "models" / "digits")
    return tmp_path


def test_a_route_for_an_exported_model_fits_its_signature_and_is_strict(project: Path) -> None:
    code, out, err = scaffold("--saved-model", str(project / "models" / "digits"), "--name", "digits")
    assert code == 0, err
    module_path = project / "routes" / "digits_route.py"
    assert f"wrote {module_path}: POST /v1/digits/predict" in out
    assert f"MODELS_DIR={project / 'models'} MODEL_CONFIG_FILE={project / 'models.config'}" in out
    assert model_names((project / "models.config").read_text()) == ["digits"]
    assert 'base_path: "/models/digits"' in (project / "models.config").read_text()
    route = load(module_path).route
    assert route.path == "/v1/digits/predict" and route.signature.model_name == "digits"
    assert signature_mismatches(route.signature, served(project / "models" / "digits" / "1")) == []
    request = route.request.model
    image = [[[1.5]] * 8] * 8
    assert route.preprocess(request(image=image), None) == {"image": image}  # passed through
    for bad in ({"image": [[["1.5"]] * 8] * 8}, {"image": [[[1.5]] * 8] * 7}, {"image": image, "extra": 1},
                {"image": [[[float("nan")]] * 8] * 8}, {"image": [[[1e39]] * 8] * 8}):  # fmt: skip
        with pytest.raises(ValidationError):
            request.model_validate_json(json.dumps(bad))
    prediction = Prediction({"probabilities": [0.1] * 10}, ModelInfo(name="digits", version=1))
    answer = route.postprocess(None, prediction, None)
    assert answer.model_dump() == {"probabilities": [0.1] * 10, "model": {"name": "digits", "version": 1}}
    # A second model goes into the same config; the same name twice is refused.
    shutil.copytree(REPO / "models" / "fraud", project / "models" / "fraud")
    assert scaffold("--saved-model", str(project / "models" / "fraud" / "1"), "--name", "fraud")[0] == 0
    assert model_names((project / "models.config").read_text()) == ["digits", "fraud"]
    code, _, err = scaffold("--saved-model", str(project / "models" / "fraud"), "--name", "fraud")
    assert code == 2 and "fraud_route.py exists; pass --force" in err


Tensors = dict[str, tuple[int, list[int]]]


def saved_model(path: Path, inputs: Tensors, outputs: Tensors) -> Path:
    """A saved_model.pb with one `serve` MetaGraph whose serving_default has these (dtype, shape) tensors."""
    saved = saved_model_pb2.SavedModel(saved_model_schema_version=1)
    graph = saved.meta_graphs.add()
    graph.meta_info_def.tags.append("serve")
    signature = graph.signature_def["serving_default"]
    for tensors, group in ((inputs, signature.inputs), (outputs, signature.outputs)):
        for alias, (dtype, shape) in tensors.items():
            group[alias].name = f"{alias}:0"
            group[alias].dtype = dtype
            for size in shape:
                group[alias].tensor_shape.dim.add(size=size)
    (path / "1").mkdir(parents=True)
    (path / "1" / "saved_model.pb").write_bytes(saved.SerializeToString())
    return path


def test_every_dtype_the_api_sends_gets_a_strict_field(tmp_path: Path) -> None:
    inputs = {f"in_{d.name.lower()}": (int(d), [-1, 2]) for d in JSON_TYPES}
    inputs["class"] = (int(DataType.DT_INT64), [-1])  # a keyword: the field is renamed, the alias kept
    base = saved_model(tmp_path / "models" / "many", inputs, {"score": (int(DataType.DT_FLOAT), [-1])})
    assert main(["--saved-model", str(base), "--name", "many"]) == 0
    route = load(tmp_path / "routes" / "many_route.py").route
    assert route.signature.inputs["in_dt_uint8"].dtype is DataType.DT_UINT8
    assert route.signature.inputs["class"].shape == () and route.signature.outputs["score"].shape == ()
    fields = {
        "in_dt_float": [1, 2.5], "in_dt_double": [1.0, 2.0], "in_dt_int8": [-128, 127], "in_dt_int16": [1, 2],
        "in_dt_int32": [1, 2], "in_dt_int64": [1, 2], "in_dt_uint8": [0, 255], "in_dt_uint16": [1, 2],
        "in_dt_uint32": [1, 2], "in_dt_uint64": [0, 2**64 - 1], "in_dt_bool": [True, False],
        "in_dt_string": ["a", "é"], "class": 7,
    }  # fmt: skip
    request = route.request.model.model_validate(fields)
    values = route.preprocess(request, None)
    assert values["in_dt_string"] == [b"a", "é".encode()] and values["class"] == 7
    for name, wrong in (("in_dt_uint8", [0, 256]), ("in_dt_int8", [-129, 0]), ("in_dt_bool", [1, 0]),
                        ("in_dt_int32", [1.0, 2]), ("in_dt_float", ["1", 2]), ("in_dt_string", [1, 2])):  # fmt: skip
        with pytest.raises(ValidationError):
            route.request.model.model_validate({**fields, name: wrong})


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        ({"x": (int(DataType.DT_FLOAT), [-1, -1])}, "input 'x' has shape [-1, -1]: a size beyond the batch"),
        ({"x": (19, [-1, 2])}, "input 'x' has dtype 19, which the API does not send"),  # DT_HALF
        ({"x": (int(DataType.DT_FLOAT), [])}, "input 'x' has no batch dimension"),
    ],
)
def test_what_cannot_be_scaffolded_says_what_to_do(tmp_path: Path, inputs: dict, message: str) -> None:
    base = saved_model(tmp_path / "models" / "m", inputs, {"y": (int(DataType.DT_FLOAT), [-1])})
    code, _, err = scaffold("--saved-model", str(base), "--name", "m")
    assert code == 2 and err.startswith("scaffold: ") and message in err, err
    assert not (tmp_path / "routes").exists() and not (tmp_path / "models.config").exists()


def test_no_saved_model_or_signature_is_one_line(tmp_path: Path) -> None:
    code, _, err = scaffold("--saved-model", str(tmp_path), "--name", "m")
    assert code == 2 and "no saved_model.pb there nor in a numeric version folder" in err
    base = saved_model(tmp_path / "models" / "m", {"x": (1, [-1])}, {"y": (1, [-1])})
    code, _, err = scaffold("--saved-model", str(base), "--name", "m", "--signature", "scores")
    assert code == 2 and "no signature 'scores' (it has: serving_default)" in err
    code, _, err = scaffold("--saved-model", str(base), "--name", "Bad-Name")
    assert code == 2 and "--name 'Bad-Name'" in err
