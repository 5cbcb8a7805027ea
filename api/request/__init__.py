"""One HTTP request through the API: its context, its admission, its timing and its error answer.

`middleware` (`RequestMiddleware`, the one middleware around every request), `context`
(`RequestContext`: the request's id, `Deadline`, stage timings and served version; the seam
routes and the serving client read), `errors` (the one error shape and the table from
exception to status and code), and `admission/` (what a request must pass before it costs
more: the worker's limits, the requests in flight across workers, deadline-aware shedding).
"""
