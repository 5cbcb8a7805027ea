"""Admission: whether a request is taken on, and how much of it.

`rules` (`Limits`: requests in flight, the time budget and `X-Request-Timeout-Ms`, the body
size, the multipart framing, in the order the middleware applies them), `in_flight`
(`InFlightBoard`: the count of requests in flight shared by every worker of one master), and
`shedding` (`LatencyEstimate`: a model's recent latency, against which a request's remaining
budget is refused before serving is called).
"""
