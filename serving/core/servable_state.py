"""A servable version's lifecycle as the model-status API reports it: TF Serving's
``core/servable_state.h``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from serving.util.errors import ServingError

__all__ = ["ManagerState", "ServableState"]


class ManagerState(enum.IntEnum):
    """Lifecycle of one servable version: ``ServableState::ManagerState``.

    The numbers are those of ``ModelVersionStatus.State`` in get_model_status.proto, which the
    model-status endpoint reports.
    """

    START = 10  # aspired (on disk, wanted by the version policy); not loading yet
    LOADING = 20  # the SavedModel is being read, its Session restored, warmup replayed
    AVAILABLE = 30  # loaded; requests are served from it
    UNLOADING = 40  # being torn down: no new requests reach it, in-flight ones finish first
    END = 50  # gone: unloaded, or its load failed (``health`` then holds the error)


@dataclass(frozen=True)
class ServableState:
    """A version's state and health (``None`` = OK), as ``GetModelStatus`` reports it."""

    state: ManagerState
    health: ServingError | None = None
