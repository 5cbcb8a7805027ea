"""Example model routes, each declared with the API's extension point (`api.model_routes`) only.

`fraud` (a JSON transaction in, a score out) and `digits` (an uploaded picture in, the digit
out) are enabled like a route of one's own, by the import path of their declarations:
`MODEL_ROUTES=examples.fraud.route:route,examples.digits.route:route`, which `make run`,
`run-server.sh`, docker-compose.yml and deploy/k8s set. They are not part of the API package
nor of its image; their own dependencies are the `examples` extra. `own_model/` is docs/own-model.md's
walk-through of a route of one's own (an iris classifier), enabled from its own folder.
"""
