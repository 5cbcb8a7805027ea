"""The extension point: a model route declared with `api.model_routes`, and what the app derives.

In process: the real app (`create_app`) with a route declared here and a fake serving
client (tests.api.fake_client), so each derived piece is checked on its own: the route and
its OpenAPI entry, per-model settings, readiness, the body limit, score events, the
refusal to start without the model. The examples over real serving are in
tests/test_end_to_end.py, tests/test_digits_end_to_end.py and tests/test_own_model.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from pydantic import BaseModel, ConfigDict, Field

from api.app import create_app
from api.config.enabled_routes import RouteConfigError, configure_routes, load_routes
from api.config.settings import ModelSettings, Settings
from api.inference.readiness import ModelsNotServed, signature_mismatches
from api.inference.tensors import example_inputs
from api.model_routes import (
    DataType,
    FileUpload,
    InvalidInput,
    JsonBody,
    ModelInfo,
    ModelRoute,
    Prediction,
    Signature,
    TensorSpec,
    Upload,
)
from api.serving_client import PredictRequest, SignatureInfo, Tensor, TensorInfo
from tests.api.fake_client import FakeClient, FakeModel, signature_info
from tests.support import REPO


class Point(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str
    x: float
    y: float


class Verdict(BaseModel):
    id: str
    inside: bool
    score: float
    model: ModelInfo


class CircleOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    cutoff: float = Field(default=0.5, ge=0.0, le=1.0)


def circle_preprocess(point: Point, options: CircleOptions) -> dict[str, list[float]]:
    if point.x == point.y == 0:
        raise InvalidInput("the origin is not a point this model was trained on")
    return {"xy": [point.x, point.y]}


def circle_postprocess(point: Point, prediction: Prediction, options: CircleOptions) -> Verdict:
    score = prediction.outputs["score"]
    return Verdict(id=point.id, inside=score >= options.cutoff, score=score, model=prediction.model)


CIRCLE: ModelRoute[Point, Verdict, CircleOptions] = ModelRoute(
    name="circle",
    path="/v1/circle/score",
    summary="Is the point inside the circle?",
    request=JsonBody(Point, max_bytes=2_000),
    response=Verdict,
    signature=Signature(
        model_name="circle",
        inputs={"xy": TensorSpec(DataType.DT_FLOAT, (2,))},
        outputs={"score": TensorSpec(DataType.DT_FLOAT, (), bounds=(0.0, 1.0))},
    ),
    preprocess=circle_preprocess,
    postprocess=circle_postprocess,
    options=CircleOptions,
    input_id=lambda point: point.id,
    event_fields=lambda point, verdict: {"inside": verdict.inside},
)


def circle_model(score: float = 0.75, **kwargs: object) -> FakeModel:
    def answer(request: PredictRequest) -> dict[str, Tensor]:
        return {"score": Tensor((1,), [score])}

    return FakeModel({"serving_default": signature_info(CIRCLE.signature)}, answer, **kwargs)  # type: ignore[arg-type]


# The fraud example, enabled as any route is: by the import path of its declaration.
FRAUD = "examples.fraud.route:route"


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(events_jsonl_path=tmp_path / "events.jsonl", serving_timeout_s=1.0)


@pytest.fixture
def fake() -> FakeClient:
    return FakeClient({"circle": circle_model()})


@pytest.fixture
def client(settings: Settings, fake: FakeClient) -> Iterator[TestClient]:
    with TestClient(create_app(settings, routes=[CIRCLE], open_client=fake.opener)) as c:
        yield c


def test_the_declared_route_answers(client: TestClient, fake: FakeClient) -> None:
    r = client.post("/v1/circle/score", json={"id": "p-1", "x": 0.5, "y": 0.25})
    assert r.status_code == 200, r.text
    assert r.json() == {"id": "p-1", "inside": True, "score": 0.75, "model": {"name": "circle", "version": 1}}
    assert list(r.headers["server-timing"].split(", ")[i].split(";")[0] for i in range(4)) == [
        "validate", "features", "serving", "total",
    ]  # fmt: skip
    [request] = fake.predicts
    assert request.inputs["xy"] == Tensor((1, 2), [0.5, 0.25], DataType.DT_FLOAT)
    assert request.output_filter == ("score",)


def test_the_openapi_entry_comes_from_the_declaration(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    op = spec["paths"]["/v1/circle/score"]["post"]
    assert op["summary"] == "Is the point inside the circle?" and op["tags"] == ["circle"]
    assert op["requestBody"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/Point"}
    assert op["responses"]["200"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/Verdict"}
    assert {"413", "422", "502", "503", "504"} <= set(op["responses"])


def test_invalid_input_from_preprocess_is_a_422_at_the_body(client: TestClient) -> None:
    r = client.post("/v1/circle/score", json={"id": "o", "x": 0, "y": 0})
    assert r.status_code == 422
    [error] = r.json()["detail"]
    assert error["loc"] == ["body"] and "origin" in error["msg"]


def test_the_route_body_limit_is_its_own(client: TestClient) -> None:
    r = client.post("/v1/circle/score", json={"id": "x" * 3_000, "x": 1, "y": 1})
    assert r.status_code == 413 and "2000 bytes" in r.json()["detail"]


def test_an_answer_outside_the_declared_bounds_is_502(settings: Settings) -> None:
    fake = FakeClient({"circle": circle_model(score=1.5)})
    with TestClient(create_app(settings, routes=[CIRCLE], open_client=fake.opener)) as c:
        r = c.post("/v1/circle/score", json={"id": "p", "x": 1, "y": 1})
    assert r.status_code == 502 and r.json()["code"] == "serving_bad_response"
    assert "outside [0.0, 1.0]" in r.json()["detail"]


def test_the_score_event_is_generic_with_the_routes_fields(settings: Settings, fake: FakeClient) -> None:
    with TestClient(create_app(settings, routes=[CIRCLE], open_client=fake.opener)) as c:
        c.post("/v1/circle/score", json={"id": "p-9", "x": 1, "y": 1}, headers={"X-Request-ID": "ev-1"})
    [line] = settings.events_jsonl_path.read_text().splitlines()
    event = json.loads(line)
    assert {k: event[k] for k in ("request_id", "route", "model_name", "model_version", "input_id")} == {
        "request_id": "ev-1", "route": "circle", "model_name": "circle", "model_version": 1, "input_id": "p-9",
    }  # fmt: skip
    assert event["outputs"] == {"score": 0.75} and event["fields"] == {"inside": True}


def test_per_model_settings_are_nested_by_route_name(settings: Settings, fake: FakeClient) -> None:
    fake.models["round"] = fake.models.pop("circle")
    # As MODELS__CIRCLE__MODEL_NAME=round MODELS__CIRCLE__CUTOFF=0.9 set them:
    models = {"circle": {"model_name": "round", "cutoff": 0.9}}
    own = Settings(models=models, events_jsonl_path=settings.events_jsonl_path)  # type: ignore[arg-type]
    with TestClient(create_app(own, routes=[CIRCLE], open_client=fake.opener)) as c:
        r = c.post("/v1/circle/score", json={"id": "p", "x": 1, "y": 1})
    assert r.json()["inside"] is False and r.json()["model"]["name"] == "round"


def test_settings_come_from_nested_environment_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODEL_ROUTES", f"{FRAUD}, tests.api.test_model_routes:CIRCLE")
    monkeypatch.setenv("MODELS__CIRCLE__CUTOFF", "0.25")
    monkeypatch.setenv("MODELS__FRAUD__SIGNATURE_NAME", "scores")
    settings = Settings()
    assert settings.model_routes == [FRAUD, "tests.api.test_model_routes:CIRCLE"]
    fraud, circle = configure_routes(load_routes(settings.model_routes), settings)
    assert fraud.signature.signature_name == "scores" and fraud.signature.model_name == "fraud"
    assert circle.route is CIRCLE and circle.options == CircleOptions(cutoff=0.25)


OWN = "tests.api.test_model_routes:CIRCLE"


@pytest.mark.parametrize(
    ("models", "routes", "message"),
    [
        ({"circle": {"cutof": 0.1}}, [OWN], "MODELS__CIRCLE__CUTOF: route 'circle' has no such setting"),
        ({"circle": {"cutoff": 7}}, [OWN], "MODELS__CIRCLE__CUTOFF: Input should be less than or equal to 1"),
        ({"fruad": {"threshold": 0.3}}, [FRAUD], "MODELS__FRUAD__THRESHOLD: no route is named 'fruad'"),
        # Settings of a route this deployment does not serve are a mistake like any other.
        ({"fraud": {"threshold": 0.3}}, [OWN], "MODELS__FRAUD__THRESHOLD: no route is named 'fraud' (MODEL_"),
        ({}, [], "MODEL_ROUTES is not set"),
        ({}, ["fraud"], "'fraud' is not an import path package.module:attribute"),
        ({}, ["tests.api.test_model_routes:Point"], "is a ModelMetaclass, not a ModelRoute"),
        ({}, ["no.such.module:route"], "cannot import 'no.such.module:route': no module 'no' on the Python path ("),
        ({}, ["no.such.module:route"], "Fix: add the folder that holds 'no' to PYTHONPATH."),
        ({}, ["examples.fraud.nope:route"], "no module 'examples.fraud.nope' on the Python path"),
        ({}, ["examples.fraud.route:nope"], "module 'examples.fraud.route' has no attribute 'nope'"),
        ({}, [FRAUD, FRAUD], "two routes named 'fraud'"),
    ],
)  # fmt: skip
def test_configuration_mistakes_stop_the_app_with_the_setting_named(
    models: dict[str, dict[str, object]], routes: list[str], message: str
) -> None:
    settings = Settings(models=models, model_routes=routes)  # type: ignore[arg-type]
    with pytest.raises(RouteConfigError, match=message.replace("(", r"\(").replace(".", r"\.")):
        create_app(settings)


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("MODELS__FRAUD__THRESHOLD", "2", "MODELS__FRAUD__THRESHOLD: Input should be less than or equal to 1"),
        ("MODELS__CIRCEL__CUTOFF", "0.5", "MODELS__CIRCEL__CUTOFF: no route is named 'circel'"),
    ],
)
def test_a_refused_setting_is_named_by_the_variable_that_was_set(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, message: str
) -> None:
    monkeypatch.setenv("MODEL_ROUTES", f"{FRAUD},{OWN}")
    monkeypatch.setenv(variable, value)
    with pytest.raises(RouteConfigError, match=message.replace("(", r"\(").replace(".", r"\.")):
        create_app()


def test_the_app_refuses_to_start_when_serving_lacks_a_routes_model(settings: Settings) -> None:
    fake = FakeClient({"other": circle_model()})
    app = create_app(settings, routes=[CIRCLE], open_client=fake.opener)
    with pytest.raises(RuntimeError, match="route 'circle' calls model 'circle': Could not find any versions"):
        with TestClient(app):
            pass


def test_the_app_refuses_to_start_with_the_models_serving_has_listed(settings: Settings, tmp_path: Path) -> None:
    config = tmp_path / "models.config"
    config.write_text('model_config_list { config { name: "circle" base_path: "/m/c" } config { name: "iris" } }')
    fake = FakeClient({"circle": circle_model()})
    renamed = settings.model_copy(
        update={"serving_model_config_file": config, "models": {"circle": ModelSettings(model_name="circel")}}
    )
    app = create_app(renamed, routes=[CIRCLE], open_client=fake.opener)
    with pytest.raises(ModelsNotServed) as refused:
        with TestClient(app):
            pass
    message = str(refused.value)
    assert "route 'circle' calls model 'circel'" in message
    assert "Serving's model config names: circle, iris." in message
    assert message.endswith("or leave the route out of MODEL_ROUTES.")  # the fix, last


def test_a_route_that_does_not_fit_its_models_signature_stops_the_start_up(settings: Settings) -> None:
    # A wrong dtype would be answered 200 over REST (JSON numbers convert) and 502 over gRPC:
    # neither, the API does not start, and the reason names the tensor.
    wrong = SignatureInfo(
        inputs={"xy": TensorInfo(DataType.DT_INT64, (-1, 2))}, outputs={"score": TensorInfo(DataType.DT_FLOAT, (-1,))}
    )
    fake = FakeClient({"circle": FakeModel({"serving_default": wrong}, lambda r: {})})
    with pytest.raises(ModelsNotServed) as refused:
        with TestClient(create_app(settings, routes=[CIRCLE], open_client=fake.opener)):
            pass
    message = str(refused.value)
    assert message.startswith(
        "route 'circle' does not fit model 'circle' version 1, signature 'serving_default': "
        "input 'xy' is DT_INT64, the route declares DT_FLOAT. Fix: declare the route's Signature"
    )
    loading = FakeClient({"circle": FakeModel({"serving_default": wrong}, lambda r: {}, versions={1: "LOADING"})})
    with TestClient(create_app(settings, routes=[CIRCLE], open_client=loading.opener)) as c:
        assert c.get("/readyz").status_code == 503  # not loaded yet: nothing to compare, /readyz tells


def test_readyz_reports_each_route(settings: Settings) -> None:
    wrong = SignatureInfo(
        inputs={"xy": TensorInfo(DataType.DT_DOUBLE, (-1, 2))},
        outputs={"score": TensorInfo(DataType.DT_FLOAT, (-1,))},
    )
    fake = FakeClient(
        {
            "circle": circle_model(versions={1: "AVAILABLE", 2: "LOADING"}),
            "fraud": FakeModel({"serving_default": wrong}, lambda r: {}),
        }
    )
    from examples.fraud.route import route as fraud

    fitting = fake.models.pop("fraud")
    fake.models["fraud"] = FakeModel({"serving_default": signature_info(fraud.signature)}, lambda r: {})
    with TestClient(create_app(settings, routes=[CIRCLE, fraud], open_client=fake.opener)) as c:
        fake.models["fraud"] = fitting  # a version published after start-up that does not fit
        r = c.get("/readyz")
    assert r.status_code == 503
    body = r.json()
    assert body["code"] == "serving_unavailable" and body["detail"].startswith("not ready: fraud: no input 'features'")
    assert body["models"]["circle"] == {
        "ready": True, "model": "circle", "signature": "serving_default", "version": 1, "problems": [],
    }  # fmt: skip
    assert body["models"]["fraud"]["problems"] == [
        "no input 'features' (the signature's inputs: xy)",
        "no output 'fraud_score' (the signature's outputs: score)",
        "input 'xy' of the signature is not sent by the route",
    ]


def test_readyz_says_which_versions_are_not_available(settings: Settings) -> None:
    fake = FakeClient({"circle": circle_model(versions={1: "LOADING"})})
    with TestClient(create_app(settings, routes=[CIRCLE], open_client=fake.opener)) as c:
        r = c.get("/readyz")
    assert r.status_code == 503
    assert r.json()["models"]["circle"]["problems"] == ["no version AVAILABLE (1: LOADING)"]


def test_signature_mismatches_name_dtype_and_shape() -> None:
    served = SignatureInfo(
        inputs={"xy": TensorInfo(DataType.DT_DOUBLE, (-1, 3))},
        outputs={"score": TensorInfo(DataType.DT_FLOAT, (-1, 1))},
    )
    assert signature_mismatches(CIRCLE.signature, served) == [
        "input 'xy' is DT_DOUBLE, the route declares DT_FLOAT",
        "output 'score' has shape [-1, 1], the route declares [batch]",  # a scalar per example
    ]
    wrong_width = SignatureInfo(
        inputs={"xy": TensorInfo(DataType.DT_FLOAT, (-1, 3))}, outputs={"score": TensorInfo(DataType.DT_FLOAT, (-1,))}
    )
    assert signature_mismatches(CIRCLE.signature, wrong_width) == [
        "input 'xy' has shape [-1, 3], the route declares [batch, 2]"
    ]
    unknown_rank = SignatureInfo(
        inputs={"xy": TensorInfo(DataType.DT_FLOAT, None)}, outputs={"score": TensorInfo(DataType.DT_FLOAT, (-1,))}
    )
    assert signature_mismatches(CIRCLE.signature, unknown_rank) == []


def test_example_inputs_check_the_declared_shape() -> None:
    specs = {"image": TensorSpec(DataType.DT_FLOAT, (2, 2, 1))}
    tensor = example_inputs(specs, {"image": [[[1], [2]], [[3], [4]]]})["image"]
    assert tensor == Tensor((1, 2, 2, 1), [1, 2, 3, 4], DataType.DT_FLOAT)
    for bad in ([[1, 2], [3, 4]], [[[1], [2]]], 5):
        with pytest.raises(ValueError, match="input 'image'"):
            example_inputs(specs, {"image": bad})
    with pytest.raises(ValueError, match="preprocess returned inputs"):
        example_inputs(specs, {"pixels": []})


def upload_route(media_types: tuple[str, ...]) -> ModelRoute[Upload, Verdict, CircleOptions]:
    def preprocess(upload: Upload, options: CircleOptions) -> dict[str, list[float]]:
        x, y = (float(v) for v in upload.data.split(b","))
        return {"xy": [x, y]}

    def postprocess(upload: Upload, prediction: Prediction, options: CircleOptions) -> Verdict:
        return Verdict(id=upload.filename or "", inside=True, score=prediction.outputs["score"], model=prediction.model)

    return ModelRoute(
        name="circle",
        path="/v1/circle/upload",
        request=FileUpload(field="points", description="x,y", max_bytes=10, media_types=media_types),
        response=Verdict,
        signature=CIRCLE.signature,
        preprocess=preprocess,
        postprocess=postprocess,
        options=CircleOptions,
        preprocess_in_thread=True,
    )


def test_an_upload_route_takes_its_field_limit_and_types(settings: Settings, fake: FakeClient) -> None:
    route = upload_route(("text/csv",))
    with TestClient(create_app(settings, routes=[route], open_client=fake.opener)) as c:
        ok = c.post("/v1/circle/upload", files={"points": ("p.csv", b"1,2", "text/csv")})
        assert ok.status_code == 200, ok.text
        assert ok.json()["id"] == "p.csv"
        big = c.post("/v1/circle/upload", files={"points": ("p.csv", b"1," + b"0" * 20, "text/csv")})
        assert big.status_code == 413 and big.json()["detail"] == (
            "points is larger than 10 bytes (raise the limit with MODELS__CIRCLE__MAX_BODY_BYTES)"
        )
        other = c.post("/v1/circle/upload", files={"points": ("p.txt", b"1,2", "text/plain")})
        assert other.status_code == 422
        [error] = other.json()["detail"]
        assert error["loc"] == ["body", "points"] and "accepted: text/csv" in error["msg"]
        assert error["input"] == {"filename": "p.txt", "content_type": "text/plain", "size": 3}
        op = c.get("/openapi.json").json()["paths"]["/v1/circle/upload"]["post"]
        assert "multipart/form-data" in op["requestBody"]["content"]


def test_a_declaration_is_checked_when_it_is_made() -> None:
    with pytest.raises(ValueError, match="lower-case letters"):
        ModelRoute(name="Circle", path="/c", request=JsonBody(Point), response=Verdict, signature=CIRCLE.signature,
                   preprocess=circle_preprocess, postprocess=circle_postprocess)  # fmt: skip


PROBE = """
import sys
import api.app, api.config.enabled_routes
print("LOADED:" + ",".join(sorted(m for m in sys.modules if m.startswith("examples"))))
"""


def test_the_app_imports_no_example_it_is_not_told_to() -> None:
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "LOADED:"
