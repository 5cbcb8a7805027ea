"""The benchmark: naive, tuned in-process, split and ceiling setups, side by side.

`python -m bench` (quick) or `python -m bench --full`; see `bench.__main__`. Modules:
`setups` (what is started and how), `load` (wrk), `procfs` and `memory` (CPU and PSS
from /proc), `runner` (the order of runs), `goals` (the target ratios), `report`
(report.md, plots, results.json), `apps` (the in-process comparison apps).
"""
