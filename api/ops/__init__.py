"""The operator's tools beside the app, run before or around it; stdlib only.

`cpu_budget` (how many CPUs the container may use, and how they are split between API
workers and serving's threads: `gunicorn.conf.py`, `python -m api.ops.cpu_budget` in
`run-server.sh`), `doctor` (`make doctor`: the CPU budget of both tiers, blocking calls in
`async def` endpoints, gunicorn's preload), and `readiness_wait` (`run-server.sh` waits on
`/readyz`, saying why it is not ready yet).
"""
