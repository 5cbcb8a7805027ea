"""Which model routes this deployment serves, and each one's settings applied to its declaration.

    routes = load_routes(settings.model_routes)        # ModelRoute declarations
    configured = configure_routes(routes, settings)    # with MODELS__<ROUTE>__... applied

`MODEL_ROUTES` names each route: a built-in one by its name (`BUILT_IN`), any other by
the import path of its `ModelRoute`, `package.module:attribute` (as MLServer's
`implementation` names a model class). Routes are imported by path: no module of the
app imports an example (`api/examples/` uses the app's extension point, not the reverse).

Every mistake here stops the app at build time with a message naming the variable the
user set (a deprecated flat name such as `FRAUD_THRESHOLD`, or `MODELS__<ROUTE>__...`): an
unknown route, two routes on one path, settings for a route that is neither enabled nor
built in, an option the route does not have, a value its options model refuses. Settings
of a built-in route that this deployment does not enable are not a mistake -- one
environment may be shared by deployments serving different subsets -- and are ignored
(`ignored_model_settings` says which, for the start-up log).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any

from pydantic import BaseModel, ValidationError

from api.config.settings import ModelSettings, Settings
from api.model_routes import FileUpload, JsonBody, ModelRoute, Signature

# Built-in routes by name -> import path of their declaration.
BUILT_IN: Mapping[str, str] = MappingProxyType(
    {"fraud": "examples.fraud.route:route", "digits": "examples.digits.route:route"}
)

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
    """

    route: ModelRoute[Any, Any, Any]
    signature: Signature
    options: BaseModel
    max_body_bytes: int
    max_upload_bytes: int | None


def load_routes(entries: Sequence[str]) -> list[ModelRoute[Any, Any, Any]]:
    """The `ModelRoute` of each `MODEL_ROUTES` entry, in order.

    Raises:
        RouteConfigError: an entry is neither a built-in name nor an importable
            `module:attribute` holding a `ModelRoute`.
    """
    routes = []
    for entry in entries:
        path = BUILT_IN.get(entry, entry)
        module_name, _, attribute = path.partition(":")
        if not attribute:
            raise RouteConfigError(
                f"MODEL_ROUTES: {entry!r} is neither a built-in route ({', '.join(BUILT_IN)}) "
                "nor an import path package.module:attribute"
            )
        try:
            declared = getattr(importlib.import_module(module_name), attribute)
        except (ImportError, AttributeError) as exc:
            raise RouteConfigError(f"MODEL_ROUTES: cannot import {path!r}: {exc}") from exc
        if not isinstance(declared, ModelRoute):
            raise RouteConfigError(f"MODEL_ROUTES: {path!r} is a {type(declared).__name__}, not a ModelRoute")
        routes.append(declared)
    return routes


def configure_routes(routes: Sequence[ModelRoute[Any, Any, Any]], settings: Settings) -> list[ConfiguredRoute]:
    """Apply `settings.models[<route name>]` to each route.

    Settings of a built-in route not among `routes` are ignored (`ignored_model_settings`).

    Raises:
        RouteConfigError: two routes share a name or a path, settings name a route that is
            neither among `routes` nor built in, or a route's settings name an option it
            does not have or a value it refuses.
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
    unknown = sorted(settings.models.keys() - seen_names - BUILT_IN.keys())
    if unknown:
        variables = settings.model_setting_variables(unknown[0]) or [f"MODELS__{unknown[0].upper()}__..."]
        raise RouteConfigError(
            f"{', '.join(variables)}: no route is named {unknown[0]!r} (MODEL_ROUTES serves "
            f"{', '.join(sorted(seen_names))}; built-in routes: {', '.join(BUILT_IN)})"
        )
    return configured


def ignored_model_settings(routes: Sequence[ModelRoute[Any, Any, Any]], settings: Settings) -> list[str]:
    """One message per built-in route that has settings but is not among `routes`,
    naming the variables, for the start-up log: they are not applied."""
    enabled = {route.name for route in routes}
    return [
        f"{', '.join(settings.model_setting_variables(name))} ignored: route {name!r} is not enabled "
        f"(MODEL_ROUTES serves {', '.join(sorted(enabled))})"
        for name in sorted(settings.models.keys() & BUILT_IN.keys() - enabled)
        if settings.model_setting_variables(name)
    ]


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
    if isinstance(route.request, FileUpload):
        upload = own.max_body_bytes or route.request.max_bytes
        return ConfiguredRoute(route, signature, options, upload + MULTIPART_ALLOWANCE_BYTES, upload)
    assert isinstance(route.request, JsonBody)
    body = own.max_body_bytes or route.request.max_bytes or settings.max_body_bytes
    return ConfiguredRoute(route, signature, options, body, None)
