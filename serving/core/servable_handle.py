"""The servable a request runs on: TF Serving's ``core/servable_handle.h``.

:meth:`ServableManager.acquire <serving.core.manager.ServableManager.acquire>` hands one out and
holds a reference on the version until the request ends, so the version is not unloaded under it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["ServableHandle"]


@dataclass(frozen=True)
class ServableHandle:
    """The servable a request runs on, pinned for the request's duration."""

    name: str
    version: int
    # A serving.servables.tensorflow.servable.Servable, not imported: core stays TensorFlow-free.
    servable: Any
