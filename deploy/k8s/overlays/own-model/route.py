"""A model route of your own: `POST /v1/iris/classify`, declared with `api.model_routes` only.

Enable it with `MODEL_ROUTES=iris_route:route` and this folder on `PYTHONPATH` (docs/own-model.md,
"Serve your own model"); nothing under `api/` changes.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from api.model_routes import DataType, JsonBody, ModelInfo, ModelRoute, NoOptions, Prediction, Signature, TensorSpec

SPECIES = ("setosa", "versicolor", "virginica")


class Flower(BaseModel):
    """The request: one flower's measurements, centimetres; strict types (a JSON number each, no
    string or boolean), unknown fields refused."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    sepal_length: float = Field(gt=0, le=100)
    sepal_width: float = Field(gt=0, le=100)
    petal_length: float = Field(gt=0, le=100)
    petal_width: float = Field(gt=0, le=100)


class Species(BaseModel):
    """The answer: the most probable species and every species' probability."""

    species: str
    probabilities: dict[str, float]
    model: ModelInfo


def preprocess(flower: Flower, options: NoOptions) -> dict[str, list[float]]:
    return {"measurements": [flower.sepal_length, flower.sepal_width, flower.petal_length, flower.petal_width]}


def postprocess(flower: Flower, prediction: Prediction, options: NoOptions) -> Species:
    probabilities = dict(zip(SPECIES, prediction.outputs["probabilities"], strict=True))
    return Species(species=max(probabilities, key=probabilities.__getitem__), probabilities=probabilities,
                   model=prediction.model)  # fmt: skip


route: ModelRoute[Flower, Species, NoOptions] = ModelRoute(
    name="iris",
    path="/v1/iris/classify",
    summary="Classify an iris flower from its measurements.",
    request=JsonBody(Flower),
    response=Species,
    signature=Signature(
        model_name="iris",
        inputs={"measurements": TensorSpec(DataType.DT_FLOAT, (4,))},
        outputs={"probabilities": TensorSpec(DataType.DT_FLOAT, (3,), bounds=(0.0, 1.0))},
    ),
    preprocess=preprocess,
    postprocess=postprocess,
)
