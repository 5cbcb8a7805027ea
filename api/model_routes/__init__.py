"""The extension point of the API: one typed declaration per model route.

    from api.model_routes import DataType, JsonBody, ModelInfo, ModelRoute, Signature,
    TensorSpec

    route = ModelRoute(
        name="iris",
        path="/v1/iris/classify",
        request=JsonBody(Flower),                 # a pydantic model of the JSON body
        response=Species,                         # a pydantic model of the answer
        signature=Signature(
            model_name="iris",
            inputs={"measurements": TensorSpec(DataType.DT_FLOAT, (4,))},
            outputs={"probabilities": TensorSpec(DataType.DT_FLOAT, (3,), bounds=(0.0, 1.0))},
        ),
        preprocess=lambda flower, options: {"measurements": flower.as_vector()},
        postprocess=lambda flower, prediction, options: Species.from_prediction(prediction),
    )

The app builds the rest from the declaration (`ModelRoute` says what): the served-model
client pinned to the latest AVAILABLE version, the route and its OpenAPI entry, its
readiness in `/readyz`, its body limit, metrics labels, score events, payload capture
(`PayloadCapture`: a sampled copy with fields redacted) and per-model settings. A
deployment enables routes with `MODEL_ROUTES` (the `package.module:attribute` of each
`ModelRoute`); the examples in `examples/` use this package and nothing else of the API.

The names below are this package's public surface; its modules are private.
"""

from api.model_routes._declaration import (
    FileUpload,
    InvalidInput,
    JsonBody,
    ModelInfo,
    ModelRoute,
    NoOptions,
    PayloadCapture,
    Prediction,
    Signature,
    TensorSpec,
    Upload,
)
from api.serving_client import DataType

__all__ = [
    "DataType",
    "FileUpload",
    "InvalidInput",
    "JsonBody",
    "ModelInfo",
    "ModelRoute",
    "NoOptions",
    "PayloadCapture",
    "Prediction",
    "Signature",
    "TensorSpec",
    "Upload",
]
