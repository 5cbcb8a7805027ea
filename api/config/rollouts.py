"""Model rollouts as data: which versions of which models a model route calls, and how much of its
traffic each gets. Read by one router (`api.rollouts`); nothing here calls serving.

A route's rollout (`Rollout`), in its settings or in the rollout file:

    MODELS__FRAUD__ROLLOUT__STABLE=1             # the version most requests get
    MODELS__FRAUD__ROLLOUT__CANARY=2             # optional: a second target ...
    MODELS__FRAUD__ROLLOUT__CANARY_WEIGHT=10     # ... for 10 % of the route's keys
    MODELS__FRAUD__ROLLOUT__SHADOW=fraud_transformer:latest  # optional: mirrored, never answered
    MODELS__FRAUD__ROLLOUT__SHADOW_RATE=25       # ... for 25 % of the answered requests
    MODELS__FRAUD__ROLLOUT__ALLOW_PINNING=true   # clients may ask X-Model-Version / X-Model-Label

A target (`Target`) is written `[model:]version | [model:]label | [model:]latest`: `2` is version 2
of the route's model (TF Serving's `model_spec.version`), `stable` the version serving's
`version_labels` give that label (`model_spec.version_label`), `latest` the latest AVAILABLE
version, and `fraud_transformer:latest` another served model (A/B between two models; the route
checks it has the same signature, `/readyz`). Or as an object: `{"model_name": ..., "version": 2}`
/ `{"label": "stable"}`. Setting the canary weight to 0 is the rollback.

The rollout file (`ROLLOUTS__FILE`, JSON: route name -> rollout) overrides the settings of the
routes it names and is watched: each API worker reads it again when it changes (`ROLLOUTS__POLL_INTERVAL_S`),
so a change reaches every worker without a restart. `read_rollout_file` is the one reader.
"""

from __future__ import annotations

import os
import re
from collections.abc import Collection
from pathlib import Path
from typing import Annotated, Any

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_settings import NoDecode

# A model name or a label as TF Serving's REST paths take them (http_rest_api_util.cc matches
# `[^/:]+`; its serving_config.md documents labels as word characters): word characters, '.' and
# '-', so a label is also safe in a header and a metric label.
_NAME = r"[A-Za-z0-9_.\-]{1,128}"
NAME_PATTERN = re.compile(_NAME)
_TARGET_TEXT = re.compile(rf"(?:(?P<model>{_NAME}):)?(?P<choice>{_NAME})")

#: The most a rollout file may hold, bytes: it is read by every worker on each change.
MAX_FILE_BYTES = 1024 * 1024


class RolloutFileError(ValueError):
    """The rollout file cannot be used (unreadable, not JSON, or a rollout it holds is invalid)."""


class Target(BaseModel):
    """What a rollout arm calls: a served model at a version, a version label, or its latest.

    Attributes:
        model_name: servable name (models.config `name`); None: the route's model.
        version: `model_spec.version`, REST `/versions/N`.
        label: `model_spec.version_label`, REST `/labels/L` (models.config `version_labels`).
    Neither version nor label: the latest AVAILABLE version.

    Raises:
        ValueError (pydantic ValidationError): both a version and a label; a name or label that
            is not 1-128 of `[A-Za-z0-9_.-]`; text that is not `[model:]choice`.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", protected_namespaces=())

    model_name: str | None = Field(default=None, pattern=f"^{_NAME}$")
    version: int | None = Field(default=None, ge=0)
    label: str | None = Field(default=None, pattern=f"^{_NAME}$")

    @model_validator(mode="before")
    @classmethod
    def _from_text(cls, value: Any) -> Any:
        """`2`, `"2"`, `"stable"`, `"latest"`, `"fraud_transformer:3"` -> the fields."""
        if isinstance(value, bool):
            return value  # refused below, not read as version 0/1
        if isinstance(value, int):
            return {"version": value}
        if not isinstance(value, str):
            return value
        if value.lstrip().startswith("{"):  # an object, as an environment variable's JSON text
            try:
                return orjson.loads(value)
            except orjson.JSONDecodeError as exc:
                raise ValueError(f"{value!r} is not a JSON object: {exc}") from None
        match = _TARGET_TEXT.fullmatch(value.strip())
        if match is None:
            raise ValueError(f"{value!r} is not a target: [model:]version, [model:]label or [model:]latest")
        fields: dict[str, Any] = {"model_name": match["model"]}
        choice = match["choice"]
        if choice.isdigit():
            fields["version"] = int(choice)
        elif choice != "latest":
            fields["label"] = choice
        return fields

    @model_validator(mode="after")
    def _one_choice(self) -> Target:
        if self.version is not None and self.label is not None:
            raise ValueError("a target has a version or a label, not both")
        return self

    def model(self, default: str) -> str:
        """The servable this target calls (`default`: the route's model)."""
        return self.model_name or default

    def text(self, default_model: str) -> str:
        """`fraud:2`, `fraud:stable`, `fraud:latest`: the target as written, with its model."""
        choice = str(self.version) if self.version is not None else self.label or "latest"
        return f"{self.model(default_model)}:{choice}"


# A target as an environment variable is its text (`2`, `stable`, `fraud:latest`), which is not
# JSON: NoDecode keeps pydantic-settings from parsing it as JSON first (Target reads the text).
TargetSetting = Annotated[Target, NoDecode]


class Rollout(BaseModel):
    """One model route's rollout (see module doc): a stable target, an optional canary with its
    weight, an optional shadow with its sample rate, and whether clients may pin a version.

    Attributes:
        stable: what requests not on the canary get (default: the route's model, latest).
        canary: the second target; None: none.
        canary_weight: percent of the route's keys (0-100) that get the canary: a key's arm is a
            stable hash of it (`api.rollouts.assignment`), so one user stays on one arm while the
            weight holds, and a key on the canary at 10 % is on it at 50 % too. 0 is the rollback.
        shadow: a target each sampled request is mirrored to after its answer is ready; its
            answer is compared with the primary's and never returned. None: no shadow.
        shadow_rate: percent of answered (stable and canary) requests mirrored, 0-100.
        allow_pinning: clients may choose a version (`X-Model-Version`) or label
            (`X-Model-Label`) of the stable target's model; otherwise such a request is refused (403).
        seed: mixed into the arm hash: another seed deals the keys out anew (so the same users
            are not every rollout's canaries).

    Raises:
        ValueError (pydantic ValidationError): a canary weight above 0 without a canary.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    stable: TargetSetting = Field(default_factory=Target)
    canary: TargetSetting | None = None
    canary_weight: float = Field(default=0.0, ge=0.0, le=100.0)
    shadow: TargetSetting | None = None
    shadow_rate: float = Field(default=100.0, ge=0.0, le=100.0)
    allow_pinning: bool = False
    seed: str = Field(default="", max_length=128)

    @model_validator(mode="after")
    def _canary_needs_a_target(self) -> Rollout:
        if self.canary_weight > 0 and self.canary is None:
            raise ValueError("canary_weight is above 0 but there is no canary target")
        return self


class RolloutsSettings(BaseModel):
    """Settings of every route's rollout machinery (`ROLLOUTS__<SETTING>`).

    Attributes:
        file: the rollout file (JSON, route name -> `Rollout`), watched; None: only the routes'
            settings (`MODELS__<ROUTE>__ROLLOUT__...`).
        poll_interval_s: how often each worker checks the file for a change, seconds.
        shadow_max_queue: shadow calls waiting per worker at most; more are dropped and counted.
        shadow_concurrency: shadow calls in flight per worker at most.
    """

    file: Path | None = Field(
        default=None,
        description="JSON file of rollouts by route name, watched; it overrides MODELS__<ROUTE>__ROLLOUT "
        "for the routes it names (docs/rollouts.md).",
    )
    poll_interval_s: float = Field(
        default=0.25,
        gt=0.0,
        le=1.0,
        description="How often each API worker checks the rollout file for a change, seconds: a change "
        "reaches every worker within this plus the time to read it (a stat every 0.25 s costs nothing "
        "measurable; inotify would not see Kubernetes' ConfigMap symlink swaps).",
    )
    shadow_max_queue: int = Field(
        default=256, ge=1, description="Shadow calls waiting per API worker at most; more are dropped and counted."
    )
    shadow_concurrency: int = Field(
        default=8, ge=1, description="Shadow calls in flight per API worker at most."
    )


def read_rollout_file(path: Path, routes: Collection[str]) -> dict[str, Rollout]:
    """The rollouts in `path`: `{"<route>": {<Rollout fields>}, ...}`.

    Args:
        path: the file.
        routes: the routes this app serves; the file may name only these.

    Raises:
        RolloutFileError: the file cannot be read, is larger than `MAX_FILE_BYTES`, is not a
            JSON object of objects, names a route not served, or holds an invalid rollout
            (the message names the route and field).
    """
    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise RolloutFileError(f"cannot read {path}: {exc.strerror or exc}") from None
    if len(data) > MAX_FILE_BYTES:
        raise RolloutFileError(f"{path} is larger than {MAX_FILE_BYTES} bytes")
    try:
        raw = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise RolloutFileError(f"{path} is not JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise RolloutFileError(f"{path} must hold a JSON object of rollouts by route name")
    rollouts: dict[str, Rollout] = {}
    for route, value in raw.items():
        if route not in routes:
            raise RolloutFileError(
                f"{path}: no route is named {route!r} (this API serves {', '.join(sorted(routes)) or 'none'})"
            )
        try:
            rollouts[route] = Rollout.model_validate(value)
        except ValidationError as exc:
            raise RolloutFileError(f"{path}: route {route!r}: {_errors(exc)}") from None
    return rollouts


def file_signature(path: Path) -> tuple[int, int, int, int] | None:
    """What tells one version of the file from the next without reading it: (device, inode,
    size, mtime in ns) of what `path` names now (a symlink followed, so a ConfigMap's swapped
    `..data` link counts); None when it does not exist."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _errors(exc: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(part) for part in error['loc']) or 'rollout'}: {error['msg']}" for error in exc.errors()
    )

