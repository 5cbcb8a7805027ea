"""The benchmark: throughput at a latency SLO of naive, tuned in-process, split and ceiling setups.

`python -m bench` (quick) or `python -m bench --full`; see `bench.__main__`. Modules:
`workload` (the models served and the request mix), `setups` (what is started and how),
`loadgen` (the open/closed-loop HTTP generator, its own process) and `load` (driving it),
`slo` (the pass rule and the SLO-RPS search), `stats` (the one percentile rule), `procfs`
and `memory` (CPU and PSS from /proc), `plan` (how long, how hard), `runner` (the order of
runs), `goals` (the targets), `results` (results.json), `report` (report.md and the
pictures), `profile` (py-spy), `apps` (the in-process comparison apps) and `serving_tier`
(the serving tier alone, `make bench-serving`).
"""
