"""The public surfaces are pinned (httpx's tests/test_exported_members.py shape).

For `api.serving_client` and `api.model_routes` (the extension point), `__all__` is sorted
and lists every public member. Every name the client exports is one the rest of the API
imports (or a type in the signatures it calls), and the API reaches into no private
module: adding a name nobody uses, or using one that is not exported, fails here.
"""

from __future__ import annotations

import ast
import inspect

import pytest

import api.model_routes as model_routes
import api.serving_client as serving_client
from tests.support import REPO


@pytest.mark.parametrize("package", [serving_client, model_routes], ids=lambda p: p.__name__)
def test_all_public_members_are_exported_sorted(package: object) -> None:
    # Submodules are not members (api.model_routes.scaffold is a tool run with -m).
    public = [name for name, value in vars(package).items() if not name.startswith("_") and not inspect.ismodule(value)]
    assert package.__all__ == sorted(public)  # type: ignore[attr-defined]


def test_exported_members_are_defined_in_the_package() -> None:
    # A typing alias of Callable (its __module__ is collections.abc), and the canonical codes the
    # model server shares (the top-level canonical_codes).
    aliases = {"MetadataProvider", "Code"}
    for name in set(serving_client.__all__) - aliases:
        assert getattr(serving_client, name).__module__.startswith("api.serving_client."), name


def names_used_outside_the_package() -> set[str]:
    """Names the rest of `api/` imports from `api.serving_client` or reads off it."""
    used: set[str] = set()
    for path in (REPO / "api").rglob("*.py"):
        if "serving_client" in path.parts or "protos" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "api.serving_client":
                used.update(alias.name for alias in node.names)
    return used


def test_the_exported_members_are_what_the_api_uses() -> None:
    # Parts of the signatures the API calls (ServingError.code, ServingClient.model_status
    # and .predict, open_serving_client's metadata): public, whether or not a module names them.
    in_signatures = {"Code", "MetadataProvider", "ModelMetadata", "ModelStatus", "PredictResponse", "VersionStatus"}
    assert set(serving_client.__all__) == names_used_outside_the_package() | in_signatures
    # ...and nothing outside reaches into a private module.
    for path in (REPO / "api").rglob("*.py"):
        if "serving_client" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                assert not node.module.startswith("api.serving_client._"), (path, node.module)
