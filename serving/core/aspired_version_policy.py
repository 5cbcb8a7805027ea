"""Which servable version to load or unload next: TF Serving's ``AvailabilityPreservingPolicy``.

The manager (:mod:`serving.core.manager`) keeps one *loader harness* per managed version and asks the
policy, per model, for the next action; it applies what the policy returns and asks again, until
the policy has nothing to do. Everything here is pure (snapshots in, at most one action out), so
the rules are tested by table.

Follows ``tensorflow_serving/core/availability_preserving_policy.cc`` (the policy
``tensorflow_model_server`` uses) and ``AspiredVersionsManager::GetNextAction``:

1. **Unload** the *lowest* version that is ``READY`` but no longer aspired -- but only if no version
   is aspired at all (the model was removed or its directories deleted), or some aspired version
   is already ``READY``, or more than one un-aspired version is ``READY``. So an old version keeps
   serving until its replacement is ``READY``: the model never has zero available versions during
   a swap.
2. Otherwise **load** the *highest* aspired version that is still ``NEW``.
3. Otherwise nothing.

Across models, an unload is taken before any load (``CompareActions``): memory is freed before
more is taken.

Traps this keeps, as TF Serving has them:

* Removing the old version's directory *before* the new one is in place leaves no aspired version:
  the old one is unloaded at once and the model serves nothing until the new one loads. Put the new
  version in first (atomically: copy under a non-numeric name, then rename), remove the old after.
* A version whose load failed stays in ``ERROR`` while it is aspired: it is neither retried (beyond
  ``--max_num_load_retries``) nor replaced by an older one. It is dropped only once it is no longer
  aspired (its directory removed, or a newer version aspired under ``latest``).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = [
    "Action",
    "AspiredServableStateSnapshot",
    "HarnessState",
    "ServableAction",
    "availability_preserving_policy",
    "next_action",
]


class HarnessState(enum.Enum):
    """``LoaderHarness::State``, folded to the states a policy or a request can tell apart.

    TF Serving's ``kLoadRequested``/``kLoadApproved``/``kLoading`` are ``LOADING`` here, and
    ``kUnloadRequested``/``kQuiescing``/``kQuiesced``/``kUnloading`` are ``UNLOADING``.
    """

    NEW = "new"  # aspired and managed, not loading yet (status: START)
    LOADING = "loading"  # a load (and its retries, and warmup) is under way (status: LOADING)
    READY = "ready"  # loaded; requests are served from it (status: AVAILABLE)
    UNLOADING = "unloading"  # no new requests; waits for in-flight ones, then closes (UNLOADING)
    DISABLED = "disabled"  # unloaded; awaiting removal from the manager (status: END)
    ERROR = "error"  # the load failed; the error is the version's status (status: END)


class Action(enum.Enum):
    """``AspiredVersionPolicy::Action``."""

    LOAD = "load"
    UNLOAD = "unload"


@dataclass(frozen=True)
class AspiredServableStateSnapshot:
    """``AspiredServableStateSnapshot``: one managed version as the policy sees it."""

    version: int
    state: HarnessState
    is_aspired: bool


@dataclass(frozen=True)
class ServableAction:
    """``AspiredVersionPolicy::ServableAction``: what to do to which version of a model."""

    action: Action
    version: int


def availability_preserving_policy(
    versions: Iterable[AspiredServableStateSnapshot],
) -> ServableAction | None:
    """``AvailabilityPreservingPolicy::GetNextAction`` for one model's managed versions.

    ``versions`` are the model's managed versions (any order). Returns the action to take next,
    or ``None`` when there is nothing to do. See the module docstring for the rules.
    """
    snapshots = list(versions)
    has_aspired = any(s.is_aspired for s in snapshots)
    has_aspired_serving = any(s.is_aspired and s.state is HarnessState.READY for s in snapshots)
    unaspired_serving = [
        s.version for s in snapshots if not s.is_aspired and s.state is HarnessState.READY
    ]
    if unaspired_serving and (
        not has_aspired or has_aspired_serving or len(unaspired_serving) > 1
    ):
        return ServableAction(Action.UNLOAD, min(unaspired_serving))
    new_aspired = [s.version for s in snapshots if s.is_aspired and s.state is HarnessState.NEW]
    if new_aspired:
        return ServableAction(Action.LOAD, max(new_aspired))
    return None


def next_action(
    actions: Sequence[tuple[str, ServableAction | None]],
) -> tuple[str, ServableAction] | None:
    """``AspiredVersionsManager::GetNextAction``: one action across models, unloads first.

    ``actions`` are ``(model name, that model's policy action)`` pairs in the manager's order;
    among the non-``None`` ones the first unload wins, else the first load.
    """
    pending = [(name, action) for name, action in actions if action is not None]
    for name, action in pending:
        if action.action is Action.UNLOAD:
            return name, action
    return pending[0] if pending else None
