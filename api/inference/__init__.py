"""The model a route calls, on the serving tier: the call, its tensors, its readiness.

`served_model` (`ServedModel`: one servable through one signature, pinned to its latest
AVAILABLE version, with deadline-aware shedding), `tensors` (one example's values as the
[1, *shape] tensors serving takes, and the answer's outputs checked against the declared
`TensorSpec`s), `readiness` (whether serving has each route's model, version, signature and
tensors: `/readyz`, and the start-up check).
"""
