"""Whether each model route can be served: its model, version, signature and tensors on serving.

A route is ready when serving has the version it calls AVAILABLE (the latest, a number, or the
version a label names) and that version's SignatureDef (GetModelMetadata, which resolves the
version on a replica that has it) has the signature the route calls, with every input and
output it declares, of the declared dtype and per-example shape, and no input the route
does not send. `/readyz` reports this per route and per target of its rollout
(`api.routes.health`, `api.rollouts`); at start-up, `require_models` refuses an app whose
routes call a model serving does not have at all, or whose AVAILABLE version's signature does
not fit the route.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from api.model_routes import Signature, TensorSpec
from api.serving_client import Deadline, ServingClient, ServingError, ServingNotFound, SignatureInfo, TensorInfo

logger = logging.getLogger("api.inference.readiness")


class ModelsNotServed(RuntimeError):
    """Serving has no model an enabled route calls, or its signature does not fit the route's
    declaration: the app refuses to start."""


@dataclass(frozen=True, slots=True)
class ModelReadiness:
    """One route's readiness.

    Attributes:
        route: the route's name.
        model / signature: the servable and SignatureDef it calls.
        version: the latest AVAILABLE version, when there is one.
        problems: why it is not ready; () when it is.
    """

    route: str
    model: str
    signature: str
    version: int | None
    problems: tuple[str, ...]

    @property
    def ready(self) -> bool:
        """True when nothing stands in the way."""
        return not self.problems

    def as_json(self) -> dict[str, Any]:
        """`{"ready", "model", "signature", "version", "problems"}` for `/readyz`."""
        return {
            "ready": self.ready,
            "model": self.model,
            "signature": self.signature,
            "version": self.version,
            "problems": list(self.problems),
        }


async def model_readiness(
    client: ServingClient,
    route: str,
    signature: Signature,
    deadline: Deadline,
    *,
    version: int | None = None,
    label: str | None = None,
) -> ModelReadiness:
    """Check one route's model at `version`, or `label`'s version, or its latest (neither)
    against serving: that version's metadata, and model status to say why when it has none.

    Never raises for a serving failure: it becomes the reason the route is not ready.
    """

    def not_ready(problem: str, found: int | None = None) -> ModelReadiness:
        return ModelReadiness(route, signature.model_name, signature.signature_name, found, (problem,))

    try:
        metadata = await client.model_metadata(signature.model_name, version, deadline, label=label)
    except ServingNotFound as exc:
        return not_ready(await _not_available(client, signature.model_name, version, label, exc, deadline))
    except ServingError as exc:
        return not_ready(f"model metadata: {exc.message}", version)
    version = metadata.version
    served = metadata.signatures.get(signature.signature_name)
    if served is None:
        known = ", ".join(sorted(metadata.signatures))
        return not_ready(f"version {version} has no signature '{signature.signature_name}' (it has: {known})", version)
    problems = signature_mismatches(signature, served)
    return ModelReadiness(route, signature.model_name, signature.signature_name, version, tuple(problems))


async def _not_available(
    client: ServingClient, model: str, version: int | None, label: str | None, exc: ServingNotFound, deadline: Deadline
) -> str:
    """Why `model` has no such version: the version states model status lists."""
    try:
        status = await client.model_status(model, deadline)
    except ServingError as status_exc:
        return f"model status: {status_exc.message}"
    states = ", ".join(f"{v.version}: {v.state}" for v in status.versions) or "none"
    if version is not None:
        return f"version {version} is not AVAILABLE ({states})"
    if label is not None:
        return f"label '{label}' names no AVAILABLE version: {exc.message} ({states})"
    return f"no version AVAILABLE ({states})"


def signature_mismatches(declared: Signature, served: SignatureInfo) -> list[str]:
    """What in the served SignatureDef does not fit the route's declaration; [] when all does."""
    problems = _mismatches("input", declared.inputs, served.inputs)
    problems += _mismatches("output", declared.outputs, served.outputs)
    problems += [
        f"input '{name}' of the signature is not sent by the route"
        for name in sorted(served.inputs.keys() - declared.inputs.keys())
    ]
    return problems


def _mismatches(kind: str, declared: Mapping[str, TensorSpec], served: Mapping[str, TensorInfo]) -> list[str]:
    problems = []
    for name, spec in declared.items():
        info = served.get(name)
        if info is None:
            problems.append(f"no {kind} '{name}' (the signature's {kind}s: {', '.join(sorted(served)) or 'none'})")
        elif info.dtype != spec.dtype:
            problems.append(f"{kind} '{name}' is {info.dtype.name}, the route declares {spec.dtype.name}")
        elif info.shape is not None and not _fits(info.shape, spec.shape):
            shape = ", ".join(["batch", *map(str, spec.shape)])
            problems.append(f"{kind} '{name}' has shape {list(info.shape)}, the route declares [{shape}]")
    return problems


def _fits(served: tuple[int, ...], example: tuple[int, ...]) -> bool:
    """A served [batch, ...] shape (-1 = any size) takes [1, *example]."""
    return len(served) == len(example) + 1 and all(s in (-1, e) for s, e in zip(served[1:], example, strict=True))


async def require_models(
    client: ServingClient,
    signatures: Mapping[str, Signature],
    deadline: Deadline,
    served_models: Sequence[str] | None = None,
) -> None:
    """Refuse to start when a route calls a model serving does not have, or one that does not fit.

    Serving answering NOT_FOUND for a model's status means it is not in serving's model
    config (or no version of it exists on disk yet). A model with a version AVAILABLE whose
    SignatureDef does not have the route's signature, inputs and outputs (names, dtypes,
    per-example shapes: `signature_mismatches`) would answer every request 502 or, over
    REST, silently convert a wrong dtype: that stops the start-up too. Serving unreachable or
    failing otherwise, or a model still loading, says nothing about either: logged, and
    `/readyz` will tell.

    Args:
        signatures: route name -> the signature it calls.
        served_models: the models serving's model config names, when the API can read it
            (`SERVING_MODEL_CONFIG_FILE`): listed in the message of a model serving lacks.

    Raises:
        ModelsNotServed: naming every route whose model serving lacks or does not fit; its
            message ends with the fix.
    """
    missing: list[str] = []
    mismatched: list[str] = []
    for route, signature in signatures.items():
        try:
            status = await client.model_status(signature.model_name, deadline)
        except ServingNotFound as exc:
            missing.append(f"route '{route}' calls model '{signature.model_name}': {exc.message}")
            continue
        except ServingError as exc:
            logger.warning("cannot check that serving has model %r: %s", signature.model_name, exc.message)
            return
        readiness = await model_readiness(client, route, signature, deadline)
        if readiness.version is not None and readiness.problems:
            mismatched.append(
                f"route '{route}' does not fit model '{signature.model_name}' version {readiness.version}, "
                f"signature '{signature.signature_name}': {'; '.join(readiness.problems)}"
            )
        elif status.latest_available() is None:
            logger.info("model %r has no version AVAILABLE yet; /readyz reports it", signature.model_name)
    if missing:
        names = ", ".join(served_models) if served_models else None
        listed = f" Serving's model config names: {names}." if names else ""
        raise ModelsNotServed(
            "serving does not have the model of every enabled route: " + "; ".join(missing) + "." + listed
            + " Fix: add the model to serving's model config (models.config), set MODELS__<ROUTE>__MODEL_NAME "
            "to a model it names, or leave the route out of MODEL_ROUTES."
        )
    if mismatched:
        raise ModelsNotServed(
            "; ".join(mismatched) + ". Fix: declare the route's Signature as the model's SignatureDef says "
            "(saved_model_cli show --dir <version dir> --all, or python -m api.model_routes.scaffold), or set "
            "MODELS__<ROUTE>__SIGNATURE_NAME."
        )
