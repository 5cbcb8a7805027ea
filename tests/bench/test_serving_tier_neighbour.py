"""The hostile-neighbour row of the serving benchmark: its largest request and its printout."""

from __future__ import annotations

import numpy as np
import orjson

from bench.serving_tier.neighbour import NeighbourRun, largest_request, neighbour_lines


def test_largest_request_fits_both_limits() -> None:
    rows = np.arange(5 * 11, dtype=np.float32).reshape(5, 11) / 7
    body, count = largest_request(rows, max_body_bytes=100_000, max_elements=None)
    assert len(body) <= 100_000 and count > 100
    assert len(orjson.loads(body)["instances"]) == count
    # One more row would not fit.
    bigger = orjson.dumps({"instances": np.take(rows, range(count + 1), axis=0, mode="wrap").tolist()})
    assert len(bigger) > 100_000 * 0.99
    body, count = largest_request(rows, max_body_bytes=100_000, max_elements=11 * 20)
    assert count == 20 and len(orjson.loads(body)["instances"]) == 20


def test_neighbour_lines_say_held_or_not() -> None:
    run = NeighbourRun(500.0, 5.0, 12_000_000, 140_000, 500.0, 2.0, 8.0, 400.0, 30.0, 310.0)
    run.neighbour_answers = {"200": 14}
    run.ratio, run.held = 310.0 / 8.0, False
    run.server = "2 cores, batching off, --rest_api_num_json_processes=1"
    text = "\n".join(neighbour_lines(run))
    assert "serving under a hostile neighbour" in text
    assert "server: 2 cores, batching off, --rest_api_num_json_processes=1" in text
    assert "38.8x (goal <= 2x) -- NOT held" in text and "200: 14" in text
