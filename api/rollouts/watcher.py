"""The rollout file, watched: a change reaches every API worker within a poll interval.

Each gunicorn worker is its own process with its own `RouteRollout`s; the file is the one thing
they all see without talking to each other (no shared memory, no IPC, no lock a dead worker
could hold). `RolloutWatcher` runs in each worker's lifespan and every `poll_interval_s`
(default 0.25 s) compares the file's identity (`api.config.rollouts.file_signature`: device,
inode, size, mtime in ns; a stat, with the symlink followed, so an atomic rename and Kubernetes'
ConfigMap `..data` swap both count) with the last one it read. On a change it reads the file
off the event loop and puts the new rollouts in force at once; routes the file does not name get
their settings' rollout (`MODELS__<ROUTE>__ROLLOUT__...`, else the default), and so do all routes
when the file is removed. So a change is in force in every worker within one poll interval plus
one read (well under the 1 s a rollback is promised in), with no restart and no request dropped:
a request already assigned finishes on its arm.

A file that does not parse or holds an invalid rollout changes nothing (the rollouts in force
stay), is logged once per version of the file and counted
(`api_rollout_reloads_total{outcome="invalid"}`); a writer that truncates and rewrites in place is
read again at the next poll once it is done. At start-up (`create_app`) an invalid file stops the
app instead, naming the file and the field.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

import anyio.to_thread

from api.config.rollouts import Rollout, RolloutFileError, file_signature, read_rollout_file
from api.observability.metrics import ApiMetrics
from api.rollouts.router import RouteRollout

logger = logging.getLogger("api.rollouts.watcher")


def describe(rollout: Rollout, route_model: str) -> str:
    """One line for the log: `stable fraud:1, canary fraud:2 at 10%, shadow fraud:3 at 100%`."""
    parts = [f"stable {rollout.stable.text(route_model)}"]
    if rollout.canary is not None:
        parts.append(f"canary {rollout.canary.text(route_model)} at {rollout.canary_weight:g}%")
    if rollout.shadow is not None:
        parts.append(f"shadow {rollout.shadow.text(route_model)} at {rollout.shadow_rate:g}%")
    if rollout.allow_pinning:
        parts.append("pinning allowed")
    return ", ".join(parts)


def rollouts_in_force(
    routes: Iterable[str], from_settings: Mapping[str, Rollout], from_file: Mapping[str, Rollout]
) -> dict[str, Rollout]:
    """Each route's rollout: the file's, else its settings', else the default."""
    return {name: from_file.get(name) or from_settings.get(name) or Rollout() for name in routes}


class RolloutWatcher:
    """Keeps one worker's `RouteRollout`s in step with the rollout file (see module doc).

    Args:
        path: the rollout file.
        routes: route name -> its rollout in this worker.
        from_settings: route name -> its settings' rollout (used where the file names none).
        metrics: `api_rollout_reloads_total` is counted here.
        interval_s: seconds between two checks of the file.
        seen: the file's signature when its rollouts were read last (by `create_app`), so an
            unchanged file is not read again at start.
    """

    def __init__(
        self,
        path: Path,
        routes: Mapping[str, RouteRollout],
        from_settings: Mapping[str, Rollout],
        metrics: ApiMetrics,
        *,
        interval_s: float,
        seen: tuple[int, int, int, int] | None = None,
    ) -> None:
        self.path = path
        self._routes = routes
        self._from_settings = from_settings
        self._metrics = metrics
        self._interval_s = interval_s
        self._seen = seen
        self._refused: tuple[int, int, int, int] | None = None
        self._task: asyncio.Task[None] | None = None

    async def check(self) -> bool:
        """Look at the file once; apply it if it changed. True when new rollouts were applied."""
        signature = file_signature(self.path)
        if signature == self._seen or (signature is not None and signature == self._refused):
            return False
        if signature is None:
            from_file: dict[str, Rollout] = {}
        else:
            try:
                from_file = await anyio.to_thread.run_sync(read_rollout_file, self.path, list(self._routes))
            except RolloutFileError as exc:
                if file_signature(self.path) == signature:  # not being rewritten: refuse this version
                    self._refused = signature
                    self._metrics.child(self._metrics.rollouts.reloads, "invalid").inc()
                    logger.error("rollout file ignored, the rollouts in force stay: %s", exc)
                return False
        self._seen = signature
        self._apply(rollouts_in_force(self._routes, self._from_settings, from_file))
        self._metrics.child(self._metrics.rollouts.reloads, "applied").inc()
        return True

    def start(self) -> None:
        """Check the file every `interval_s` in the background."""
        self._task = asyncio.get_running_loop().create_task(self._run(), name="rollout-file-watcher")

    async def aclose(self) -> None:
        """Stop watching."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        while True:
            try:
                await self.check()
            except Exception:  # never let the watcher die: the next poll tries again
                logger.exception("checking the rollout file %s failed", self.path)
            await asyncio.sleep(self._interval_s)

    def _apply(self, rollouts: Mapping[str, Rollout]) -> None:
        for name, rollout in rollouts.items():
            route = self._routes[name]
            if route.rollout != rollout:
                route.update(rollout)
                logger.info(
                    "rollout of route %s: %s",
                    name,
                    describe(rollout, route.signature.model_name),
                    # Which worker put it in force: each one logs its own line.
                    extra={"route": name, "worker_pid": os.getpid()},
                )
