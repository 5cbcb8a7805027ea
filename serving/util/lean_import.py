"""Keep TensorFlow's optional Python packages out of the model server process.

``import tensorflow`` (2.16+) eagerly imports Keras (``keras.src.optimizers`` and the
``keras._tf_keras`` aliases) and its own legacy ``tensorflow.python.keras``; those in turn import
whatever optional packages happen to be installed beside them -- SciPy, Matplotlib,
scikit-learn, h5py, rich, narwhals. In one environment with the training and benchmark extras
installed that is about 1,500 extra modules and 135 MB of RSS in a process that never uses them:
the model server runs SavedModels through a Session over the SignatureDefs (as
``tensorflow_model_server`` does, which has no Python and no Keras at all).

:func:`keep_optional_packages_out` installs a ``sys.meta_path`` finder that makes those packages
look absent. TensorFlow already guards every one of these imports (``try: import h5py except
ImportError``, ``importlib.util.find_spec`` for the Keras alias paths), so it simply carries on
without them. It is called by ``python -m serving`` before TensorFlow is imported, never on
``import serving``: tests and export scripts that import :mod:`serving` modules keep Keras.
Set ``SERVING_KEEP_OPTIONAL_IMPORTS=1`` to turn it off (for example to debug a custom op
library that needs one of them).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from types import ModuleType

__all__ = ["OPTIONAL_PACKAGES", "keep_optional_packages_out"]

# Top-level packages TensorFlow imports only optionally and a Session-based server never needs.
# Not listed: requests (tensorflow.python.distribute imports it unconditionally), numpy,
# protobuf, absl and the rest of TensorFlow's hard dependencies.
OPTIONAL_PACKAGES: frozenset[str] = frozenset(
    {
        "keras",
        "tf_keras",
        "scipy",
        "matplotlib",
        "sklearn",
        "h5py",
        "rich",
        "narwhals",
        "pandas",
        "PIL",
        "joblib",
    }
)
_OPT_OUT_ENV = "SERVING_KEEP_OPTIONAL_IMPORTS"


class _AbsentPackages(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds the listed packages with a loader that fails, so they import as missing.

    A spec is returned (rather than ``None``, which would let the next finder find the real
    package) with ``origin=None``: ``importlib.util.find_spec`` callers such as TensorFlow's
    ``module_util.get_parent_dir_for_name`` read that as "not installed", and an ``import``
    raises ``ModuleNotFoundError`` like a package that is not there.
    """

    def __init__(self, names: frozenset[str]) -> None:
        self.names = names

    def find_spec(
        self, fullname: str, path: object = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname.partition(".")[0] in self.names:
            return importlib.machinery.ModuleSpec(fullname, self, origin=None)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        raise ModuleNotFoundError(
            f"No module named {spec.name!r} (kept out of the model server; "
            f"{_OPT_OUT_ENV}=1 lets it in)",
            name=spec.name,
        )

    def exec_module(self, module: ModuleType) -> None:  # never reached: create_module raises
        raise AssertionError(module)


def keep_optional_packages_out(names: frozenset[str] = OPTIONAL_PACKAGES) -> bool:
    """Make `names` (top-level package names) unimportable in this process from now on.

    Must run before ``import tensorflow``; packages already imported stay. Returns False
    (and changes nothing) when ``SERVING_KEEP_OPTIONAL_IMPORTS`` is set to a true value.
    """
    if os.environ.get(_OPT_OUT_ENV, "").strip().lower() in {"1", "true", "yes"}:
        return False
    if not any(isinstance(finder, _AbsentPackages) for finder in sys.meta_path):
        sys.meta_path.insert(0, _AbsentPackages(names))
    return True
