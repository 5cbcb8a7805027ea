"""One model route's rollout in one API worker: which target a request calls, the call, the shadow.

    rollout = RouteRollout("fraud", signature, make_served, Rollout(stable=Target(version=1)), mirror)
    assignment = rollout.assign(key, pin_version=None, pin_label=None)   # stable | canary | pinned
    response = await rollout.predict(assignment, inputs, deadline, outputs)
    rollout.mirror(assignment, ...)                                       # after the answer is made
    rollout.update(new_rollout)                                           # the rollout file changed

The rollout is data (`api.config.rollouts.Rollout`) read here and only here; the endpoint has no
branch per strategy. `assign` is pure but for reading the current rollout: a pinned request
(`X-Model-Version` / `X-Model-Label`) gets the stable target's model at that version when the
rollout allows pinning (else `PinningRefused`, 403); any other request the arm its key hashes to
(`api.rollouts.assignment`). `update` swaps the rollout in one assignment: a request already
assigned finishes on its arm, the next one sees the new rollout.

A target's model is called through a `ServedModel` of its own (per model and role: the primary
arms share one per model, the shadow has its own, so its latency never feeds the primary's
deadline shedding), made once per worker by `make_served`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from fastapi import HTTPException

from api.config.rollouts import Rollout, Target
from api.inference.readiness import ModelReadiness, model_readiness
from api.inference.served_model import ServedModel
from api.model_routes import Signature
from api.rollouts.assignment import Arm, choose_arm, in_share
from api.rollouts.shadow import ShadowAnswer, ShadowCall, ShadowMirror
from api.serving_client import Deadline, PredictResponse, ServingError, ServingNotFound, Tensor

Role = Literal["primary", "shadow"]
#: (model name, role) -> the worker's `ServedModel` for it.
ServedFactory = Callable[[str, Role], ServedModel]


class PinningRefused(HTTPException):
    """A client asked for a version or label the route's rollout does not let it choose (403)."""

    def __init__(self, route: str, header: str) -> None:
        super().__init__(
            403,
            f"route '{route}' does not let clients choose a model version ({header}); its rollout "
            "sets allow_pinning false",
        )


class PinnedVersionNotFound(HTTPException):
    """A pinned version or label that no serving replica has AVAILABLE (404)."""

    def __init__(self, what: str, message: str) -> None:
        super().__init__(404, f"{what} is not AVAILABLE on serving: {message}")


@dataclass(frozen=True, slots=True)
class Assignment:
    """Where one request goes.

    Attributes:
        arm: `stable`, `canary` or `pinned`.
        model_name: the servable it calls.
        version / label: the target's `model_spec.version` / `version_label` (neither: latest).
        rollout: the rollout it was assigned under (its shadow, if any, mirrors it).
    """

    arm: Arm
    model_name: str
    version: int | None
    label: str | None
    rollout: Rollout

    def text(self) -> str:
        """`fraud:2`, `fraud:stable`, `fraud:latest`."""
        choice = str(self.version) if self.version is not None else self.label or "latest"
        return f"{self.model_name}:{choice}"


class RouteRollout:
    """One route's rollout in one worker (see module doc).

    Args:
        route: the route's name.
        signature: the route's configured signature (its model is the default target model).
        make_served: the worker's `ServedModel` per model and role.
        rollout: the rollout in force at start.
        mirror: the worker's shadow calls; None: shadow targets are ignored.
    """

    def __init__(
        self,
        route: str,
        signature: Signature,
        make_served: ServedFactory,
        rollout: Rollout,
        mirror: ShadowMirror | None = None,
    ) -> None:
        self.route = route
        self.signature = signature
        self._make = make_served
        self._served: dict[tuple[str, Role], ServedModel] = {}
        self._rollout = rollout
        self._mirror = mirror

    @property
    def rollout(self) -> Rollout:
        """The rollout in force now."""
        return self._rollout

    def update(self, rollout: Rollout) -> None:
        """Put `rollout` in force for the next request."""
        self._rollout = rollout

    def served(self, model_name: str, role: Role = "primary") -> ServedModel:
        """The worker's `ServedModel` for `model_name` in `role` (made on first use)."""
        key = (model_name, role)
        found = self._served.get(key)
        if found is None:
            found = self._served[key] = self._make(model_name, role)
        return found

    def assign(self, key: str, *, pin_version: int | None = None, pin_label: str | None = None) -> Assignment:
        """The arm and target of a request whose assignment key is `key`.

        Args:
            key: the route's rollout key of the request (default: its request id).
            pin_version / pin_label: the client's `X-Model-Version` / `X-Model-Label` (at most one).

        Raises:
            PinningRefused: a pin the rollout does not allow (403).
        """
        rollout = self._rollout
        default = self.signature.model_name
        if pin_version is not None or pin_label is not None:
            if not rollout.allow_pinning:
                raise PinningRefused(self.route, "X-Model-Version" if pin_version is not None else "X-Model-Label")
            return Assignment("pinned", rollout.stable.model(default), pin_version, pin_label, rollout)
        arm = choose_arm(key, rollout.canary_weight, route=self.route, seed=rollout.seed)
        target = rollout.canary if arm == "canary" and rollout.canary is not None else rollout.stable
        return Assignment(arm, target.model(default), target.version, target.label, rollout)

    async def predict(
        self, assignment: Assignment, inputs: Mapping[str, Tensor], deadline: Deadline, outputs: tuple[str, ...]
    ) -> PredictResponse:
        """Call the assignment's target (`ServedModel.predict`); its answer names the version.

        Raises:
            PinnedVersionNotFound: a pinned version or label no replica has (404).
            ServingError subclasses, DeadlineExceeded: as `ServedModel.predict`.
        """
        served = self.served(assignment.model_name)
        try:
            return await served.predict(
                inputs, deadline, outputs=outputs, version=assignment.version, label=assignment.label
            )
        except ServingNotFound as exc:
            if assignment.arm == "pinned":
                raise PinnedVersionNotFound(assignment.text(), exc.message) from exc
            raise
        except ServingError as exc:
            if self._mirror is not None:
                self._mirror.note(exc)
            raise

    def mirror(
        self,
        assignment: Assignment,
        *,
        inputs: Mapping[str, Tensor],
        outputs: tuple[str, ...],
        deadline: Deadline,
        answer: ShadowAnswer,
        primary: Any,
        primary_version: int,
        request_id: str,
        input_id: str | None,
    ) -> bool:
        """Mirror an answered request to the rollout's shadow when it is sampled (see
        `api.rollouts.shadow`); never waits. True when a shadow call was queued.

        Not mirrored: pinned requests, requests whose target is the shadow target itself, and
        those outside `shadow_rate` (by the request id's hash, so retries of one request agree).
        """
        rollout = assignment.rollout
        shadow = rollout.shadow
        if shadow is None or self._mirror is None or assignment.arm == "pinned" or rollout.shadow_rate <= 0:
            return False
        default = self.signature.model_name
        if (shadow.model(default), shadow.version, shadow.label) == (
            assignment.model_name,
            assignment.version,
            assignment.label,
        ):
            return False
        # Sampled by the request id under a seed of its own: independent of the arm's hash.
        if not in_share(request_id, rollout.shadow_rate, route=self.route, seed=f"shadow\x00{rollout.seed}"):
            return False
        return self._mirror.submit(
            ShadowCall(
                route=self.route,
                served=self.served(shadow.model(default), "shadow"),
                version=shadow.version,
                label=shadow.label,
                inputs=inputs,
                outputs=outputs,
                deadline=deadline,
                answer=answer,
                primary=primary,
                primary_model=assignment.model_name,
                primary_version=primary_version,
                primary_arm=assignment.arm,
                request_id=request_id,
                input_id=input_id,
            )
        )

    async def readiness(self, deadline: Deadline) -> tuple[ModelReadiness, dict[str, Any] | None]:
        """The route's readiness and, when its rollout is not the default one, each target's.

        Ready: the stable target is, and the canary too while its weight is above 0. A shadow
        that is not ready is reported but does not make the route unready (it never answers).

        Returns:
            (the route's `ModelReadiness`: the stable target's, with the canary's problems when
            it counts; `{"stable": {...}, "canary": {..., "weight"}, "shadow": {..., "rate"}}` or None).
        """
        rollout = self._rollout
        stable = await self._target_readiness(rollout.stable, deadline)
        if rollout == Rollout():
            return stable, None
        report: dict[str, Any] = {"stable": self._entry(rollout.stable, stable)}
        problems = list(stable.problems)
        if rollout.canary is not None:
            canary = await self._target_readiness(rollout.canary, deadline)
            report["canary"] = {**self._entry(rollout.canary, canary), "weight": rollout.canary_weight}
            if rollout.canary_weight > 0:
                problems += [f"canary {rollout.canary.text(self.signature.model_name)}: {p}" for p in canary.problems]
        if rollout.shadow is not None:
            shadow = await self._target_readiness(rollout.shadow, deadline)
            report["shadow"] = {**self._entry(rollout.shadow, shadow), "rate": rollout.shadow_rate}
        merged = ModelReadiness(stable.route, stable.model, stable.signature, stable.version, tuple(problems))
        return merged, report

    async def _target_readiness(self, target: Target, deadline: Deadline) -> ModelReadiness:
        model = target.model(self.signature.model_name)
        signature = self.signature if model == self.signature.model_name else _with_model(self.signature, model)
        client = self.served(model).client
        return await model_readiness(
            client, self.route, signature, deadline, version=target.version, label=target.label
        )

    def _entry(self, target: Target, state: ModelReadiness) -> dict[str, Any]:
        return {"target": target.text(self.signature.model_name), **state.as_json()}


def _with_model(signature: Signature, model: str) -> Signature:
    """`signature` called on another served model (an A/B target: the same tensors expected)."""
    return Signature(model, signature.inputs, signature.outputs, signature.signature_name)
