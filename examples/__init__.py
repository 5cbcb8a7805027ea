"""Example model routes, each in its own package, each declared with `api.model_routes` only.

`fraud` (a JSON transaction, a score) and `digits` (an uploaded picture, a class): the
built-in routes `MODEL_ROUTES` names by default. A route of your own has the same shape,
anywhere on the import path (README, "Serve your own model").
"""
