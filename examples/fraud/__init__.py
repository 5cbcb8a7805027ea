"""The fraud example: one raw card transaction in, a fraud score out (`POST /v1/fraud/score`).

`route` (the declaration: `MODEL_ROUTES=examples.fraud.route:route`), `schemas` (the request
and response bodies, also the raw format `models/transactions.py` generates for training),
`features` (the feature definition, shared with `models/train_fraud.py`).
"""
