"""`export_testdata`, as the README runs it: into a folder that may already hold the models."""

from __future__ import annotations

from pathlib import Path

from tests.serving.tf_serving_testdata import HALF_PLUS_TWO_VERSION, export_testdata


def test_exporting_again_into_the_same_folder_keeps_the_models_there(tmp_path: Path) -> None:
    root = export_testdata(tmp_path)
    exported = root / "half_plus_two" / str(HALF_PLUS_TWO_VERSION) / "saved_model.pb"
    written = exported.stat().st_mtime_ns
    assert export_testdata(tmp_path) == tmp_path  # TensorFlow's builder refused: "already exists"
    assert exported.stat().st_mtime_ns == written
    assert sorted(p.name for p in (root / "half_plus_two_versions").iterdir()) == ["1", "2"]  # nothing half-written
