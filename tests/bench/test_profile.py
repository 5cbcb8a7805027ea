"""py-spy collapsed-stack parsing and grouping, on stacks captured from the tuned app."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.profile import (
    Stack,
    frame_location,
    leaf_packages,
    package_of,
    parse_collapsed,
    profile_markdown,
    self_functions,
    summarize,
    total_functions,
)

DATA = Path(__file__).parent / "data"


def stacks() -> list[Stack]:
    return parse_collapsed((DATA / "pyspy_raw_tuned.txt").read_text())


def test_parse_captured_stacks() -> None:
    parsed = stacks()
    assert len(parsed) == 25
    assert parsed[0].count == 648  # the heaviest stack of the capture
    assert parsed[0].frames[0].startswith("process ")
    assert all(s.count > 0 for s in parsed)


def test_parse_rejects_lines_without_a_count() -> None:
    with pytest.raises(ValueError):
        parse_collapsed("main (app.py:1);run (app.py:2)\n")


def test_a_sample_without_python_frames_counts_under_no_function() -> None:
    # py-spy writes " 8" for samples of a thread with no Python frame on its stack.
    stacks = parse_collapsed("main (app.py:1);run (app.py:2) 3\n 8\n")
    assert [s.frames for s in stacks] == [("main (app.py:1)", "run (app.py:2)"), ()]
    summary = summarize(stacks)
    assert summary["samples"] == 11
    assert summary["self"] == [("run (app)", round(3 / 11, 4))]


@pytest.mark.parametrize(
    ("frame", "expected"),
    [
        ("Runner.run (asyncio/runners.py:118)", ("Runner.run", "asyncio/runners.py")),
        ("_run_code (<frozen runpy>:88)", ("_run_code", "<frozen runpy>")),
        ("f (<string>:5)", ("f", "<string>")),
        ("wrap_app.<locals>.wrapped (starlette/_exception_handler.py:42)",
         ("wrap_app.<locals>.wrapped", "starlette/_exception_handler.py")),
    ],
)
def test_frame_location(frame: str, expected: tuple[str, str]) -> None:
    assert frame_location(frame) == expected


@pytest.mark.parametrize(
    ("path", "package"),
    [
        ("tensorflow/python/client/session.py", "tensorflow"),
        ("threading.py", "threading"),
        ("asyncio/runners.py", "asyncio"),
        ("bench/apps/tuned.py", "bench/apps/tuned.py"),
        ("api/inference/served_model.py", "api/inference/served_model.py"),
        ("/work/main/.venv/lib/python3.11/site-packages/uvicorn/main.py", "uvicorn"),
        ("/usr/lib/python3.11/json/decoder.py", "json"),
        ("", "?"),
    ],
)
def test_package_of(path: str, package: str) -> None:
    assert package_of(path) == package


def test_groupings_are_consistent() -> None:
    parsed = stacks()
    total = sum(s.count for s in parsed)
    assert sum(leaf_packages(parsed).values()) == total
    assert sum(self_functions(parsed).values()) == total
    # a function's total time is at least its self time
    totals = total_functions(parsed)
    for func, count in self_functions(parsed).items():
        assert totals[func] >= count
    # the worker runs the Session in FastAPI's threadpool: TensorFlow is on those stacks
    assert leaf_packages(parsed)["tensorflow"] > 0
    assert not any(key.startswith(("process ", "thread ")) for key in totals)
    own = total_functions(parsed, project_only=True)
    assert own and all("(bench/" in key for key in own)
    assert own["SessionModel.__call__ (bench/apps/tuned.py)"] <= own["score (bench/apps/tuned.py)"]


def test_summary_and_markdown() -> None:
    summary = summarize(stacks(), top=5)
    assert summary["samples"] == sum(s.count for s in stacks())
    assert len(summary["self"]) == 5
    shares = [share for _, share in summary["leaf_packages"]]
    assert shares == sorted(shares, reverse=True) and sum(shares) <= 1.0
    text = profile_markdown(
        {"setup": "tuned", "workers": 1, "gunicorn": {"raw": "x.txt", **summary}}
    )
    assert "## gunicorn" in text and "| `tensorflow` |" in text
