"""Model rollouts: version routing, weighted canary, shadow traffic and rollback, per model route.

A rollout is data (`api.config.rollouts.Rollout`: a stable target, an optional canary with a
weight, an optional shadow with a sample rate, whether clients may pin a version) read by one
router per route and worker:

- `router` (`RouteRollout`): assigns each request an arm (`assignment`: a stable hash of the
  route's key, e.g. the fraud route's `user_id`, else the request id; or `pinned` by
  `X-Model-Version` / `X-Model-Label`), calls that target's `ServedModel`, mirrors answered
  requests to the shadow, reports each target's readiness;
- `shadow` (`ShadowMirror`): shadow calls off the critical path, bounded, dropped and counted,
  compared with the primary's answers (`compare`);
- `watcher` (`RolloutWatcher`): the rollout file, watched by every worker, so a change (a
  rollback to weight 0) is in force everywhere within a poll interval, without a restart.

Which serving replica has a target's version, and pinning the call to it, is the serving
client's (`api.serving_client`, versions per replica). The layer sits between `routes` (the
endpoints that call it) and `inference` (the served models it calls).
"""

from api.rollouts.assignment import Arm, choose_arm
from api.rollouts.router import Assignment, PinnedVersionNotFound, PinningRefused, RouteRollout
from api.rollouts.shadow import ShadowMirror
from api.rollouts.watcher import RolloutWatcher

__all__ = [
    "Arm",
    "Assignment",
    "PinnedVersionNotFound",
    "PinningRefused",
    "RolloutWatcher",
    "RouteRollout",
    "ShadowMirror",
    "choose_arm",
]
