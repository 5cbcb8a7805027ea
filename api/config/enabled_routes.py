"""Which model routes this deployment serves, and each one's settings applied to its declaration.

    routes = load_routes(settings.model_routes)        # ModelRoute declarations
    configured = configure_routes(routes, settings)    # with MODELS__<ROUTE>__... applied

`MODEL_ROUTES` names each route by the import path of its `ModelRoute`,
`package.module:attribute` (as MLServer's `implementation` names a model class), e.g.
`examples.fraud.route:route`, imported from the Python path (`PYTHONPATH`, the working
directory, site-packages). The API has no routes of its own: the examples in `examples/`
are enabled like any user's route, and no module of the app imports them.

Every mistake here stops the app at build time with a message naming the variable the
user set (`MODEL_ROUTES`, `MODELS__<ROUTE>__...`): no route, a path that does not import,
two routes on one path, settings for a route that is not enabled, an option the route does
not have, a value its options model refuses.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from pydantic import BaseModel, ValidationError

from api.config.settings import ModelSettings, Settings
from api.model_routes import FileUpload, JsonBody, ModelRoute, Signature

# Room for the multipart framing around an uploaded file (boundaries, part headers, a
# long filename) when the whole body is checked against the file's limit.
MULTIPART_ALLOWANCE_BYTES = 16 * 1024


class RouteConfigError(ValueError):
    """A route cannot be loaded or configured as the settings ask (the app does not start)."""


@dataclass(frozen=True, slots=True)
class ConfiguredRoute:
    """A model route as this deployment serves it.

    Attributes:
        route: the declaration.
        signature: the declaration's, with this deployment's model and signature names.
        options: the route's options model, validated from its settings.
        max_body_bytes: the route's body limit, bytes (for an upload, the file's limit
            plus `MULTIPART_ALLOWANCE_BYTES`).
        max_upload_bytes: the file's limit of an upload route, bytes; None for JSON.
        capture_sample_rate: the fraction of answered requests captured (the route's
            `PayloadCapture.sample_rate` unless `MODELS__<ROUTE>__CAPTURE_SAMPLE_RATE` is set).
    """

    route: ModelRoute[Any, Any, Any]
    signature: Signature
    options: BaseModel
    max_body_bytes: int
    max_upload_bytes: int | None
    capture_sample_rate: float = 0.0


def load_routes(entries: Sequence[str]) -> list[ModelRoute[Any, Any, Any]]:
    """The `ModelRoute` of each `MODEL_ROUTES` entry, in order.

    Raises:
        RouteConfigError: there is no entry; an entry is not `package.module:attribute`; its
            module is not on the Python path (the message names `PYTHONPATH`) or fails to
            import (a package it needs is not installed, or its own code raises: the
            exception is the cause); or the attribute is missing or not a `ModelRoute`.
            The message ends with the fix.
    """
    if not entries:
        raise RouteConfigError(
            "MODEL_ROUTES is not set: name the model routes to serve, each the import path of its ModelRoute, "
            "package.module:attribute, comma-separated"
        )
    return [_import_route(entry) for entry in entries]


def _import_route(entry: str) -> ModelRoute[Any, Any, Any]:
    module_name, _, attribute = entry.partition(":")
    if not module_name or not attribute:
        raise RouteConfigError(f"MODEL_ROUTES: {entry!r} is not an import path package.module:attribute")
    path = os.environ.get("PYTHONPATH")
    python_path = f"PYTHONPATH is {path!r}" if path else "PYTHONPATH is not set"
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if module_name == missing or module_name.startswith(missing + "."):
            # Nothing of the user's ran: the traceback would only show importlib's frames.
            raise RouteConfigError(
                f"MODEL_ROUTES: cannot import {entry!r}: no module {missing!r} on the Python path "
                f"({python_path}). Fix: add the folder that holds {module_name.split('.')[0]!r} to PYTHONPATH."
            ) from None
        raise RouteConfigError(
            f"MODEL_ROUTES: cannot import {entry!r}: its module imports {missing!r}, which is not installed or "
            f"not on the Python path ({python_path}). Fix: install it, or add its folder to PYTHONPATH."
        ) from exc
    except Exception as exc:  # the user's module failed while it ran: its traceback is the cause
        raise RouteConfigError(
            f"MODEL_ROUTES: cannot import {entry!r}: {type(exc).__name__}: {exc}. Fix the module "
            "(the traceback above shows where)."
        ) from exc
    declared = getattr(module, attribute, None)
    if declared is None:
        raise RouteConfigError(f"MODEL_ROUTES: module {module_name!r} has no attribute {attribute!r}")
    if not isinstance(declared, ModelRoute):
        raise RouteConfigError(f"MODEL_ROUTES: {entry!r} is a {type(declared).__name__}, not a ModelRoute")
    return declared


def configure_routes(routes: Sequence[ModelRoute[Any, Any, Any]], settings: Settings) -> list[ConfiguredRoute]:
    """Apply `settings.models[<route name>]` to each route.

    Raises:
        RouteConfigError: two routes share a name or a path, settings name a route that is
            not among `routes`, or a route's settings name an option it does not have or a
            value it refuses.
    """
    seen_names: set[str] = set()
    seen_paths: set[str] = set()
    configured = []
    for route in routes:
        if route.name in seen_names or route.path in seen_paths:
            raise RouteConfigError(f"MODEL_ROUTES: two routes named {route.name!r} or on {route.path!r}")
        seen_names.add(route.name)
        seen_paths.add(route.path)
        configured.append(_configure(route, settings.models.get(route.name, ModelSettings()), settings))
    unknown = sorted(settings.models.keys() - seen_names)
    if unknown:
        variables = settings.model_setting_variables(unknown[0]) or [f"MODELS__{unknown[0].upper()}__..."]
        raise RouteConfigError(
            f"{', '.join(variables)}: no route is named {unknown[0]!r} (MODEL_ROUTES serves "
            f"{', '.join(sorted(seen_names))})"
        )
    return configured


def _configure(route: ModelRoute[Any, Any, Any], own: ModelSettings, settings: Settings) -> ConfiguredRoute:
    def variable(key: str) -> str:
        return settings.model_setting_variable(route.name, key)

    extra = own.model_extra or {}
    allowed = set(route.options.model_fields)
    for key in extra:
        if key not in allowed:
            common = ", ".join(sorted(ModelSettings.model_fields))
            own_options = ", ".join(sorted(allowed)) or "none"
            raise RouteConfigError(
                f"{variable(key)}: route {route.name!r} has no such setting "
                f"(common: {common}; its own: {own_options})"
            )
    try:
        options = route.options.model_validate(extra)
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            loc = [str(part) for part in error["loc"]]
            # A field's variable, deeper parts as pydantic-settings nests them; a check of
            # the whole options model names the route's prefix.
            name = (
                variable(loc[0]) + "".join(f"__{part.upper()}" for part in loc[1:])
                if loc
                else f"MODELS__{route.name.upper()}"
            )
            problems.append(f"{name}: {error['msg']}")
        raise RouteConfigError("; ".join(problems)) from exc
    signature = replace(
        route.signature,
        model_name=own.model_name or route.signature.model_name,
        signature_name=own.signature_name or route.signature.signature_name,
    )
    rate = own.capture_sample_rate if own.capture_sample_rate is not None else route.capture.sample_rate
    if isinstance(route.request, FileUpload):
        upload = own.max_body_bytes or route.request.max_bytes
        return ConfiguredRoute(route, signature, options, upload + MULTIPART_ALLOWANCE_BYTES, upload, rate)
    assert isinstance(route.request, JsonBody)
    body = own.max_body_bytes or route.request.max_bytes or settings.max_body_bytes
    return ConfiguredRoute(route, signature, options, body, None, rate)
