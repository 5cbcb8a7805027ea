"""Fixtures for the serving tests (helpers live in :mod:`tests.serving.serving_testlib`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.serving.serving_testlib import export_models


@pytest.fixture(scope="session")
def serving_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model root with the SavedModels of :mod:`serving_testlib` (exported once per session)."""
    return export_models(tmp_path_factory.mktemp("models"))
