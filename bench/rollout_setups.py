"""The rollouts' benchmark row: the split with shadow traffic at 100 %, beside the split without.

    python -m bench --workload fraud --setups split,split-shadow

`split-shadow` is the headline split with every answered request mirrored to a shadow
(`MODELS__FRAUD__ROLLOUT__SHADOW=latest`: the route's own model at its latest version, the one
model the benchmark's serving tier has; docs/rollouts.md). Run with `split` in the same command,
both are driven by the same open-loop timetable at the same offered rates, so the report's SLO
curves give the primary's p50/p99 with the shadow on and off at the same load; the shadow doubles
serving's predicts, so the difference is what mirroring costs the primary on shared cores.
"""

from __future__ import annotations

from bench.setups import Setup

SPLIT_SHADOW = Setup(
    name="split-shadow",
    column="split",
    description="the split with a shadow at 100 % (MODELS__FRAUD__ROLLOUT__SHADOW=latest): every "
    "answered request mirrored to serving after its answer, compared, never answered",
    kind="split",
    env={"MODELS__FRAUD__ROLLOUT__SHADOW": "latest", "MODELS__FRAUD__ROLLOUT__SHADOW_RATE": "100"},
)

#: The rollout rows, registered in `bench.setups.all_setups`.
ROLLOUT_SETUPS = (SPLIT_SHADOW,)
