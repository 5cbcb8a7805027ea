"""`python -m tools.import_graph`: its counts on a package made here, and its cycle finder."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import REPO
from tools.import_graph import report, strongly_connected


@pytest.mark.parametrize(
    ("graph", "cycles"),
    [
        ({"a": ["b"], "b": ["c"], "c": []}, []),
        ({"a": ["b"], "b": ["a"], "c": ["a"]}, [["a", "b"]]),
        ({"a": ["a"], "b": []}, [["a"]]),  # a module that imports itself
        ({"a": ["b"], "b": ["c"], "c": ["a"], "d": ["e"], "e": ["d"]}, [["a", "b", "c"], ["d", "e"]]),
        ({"a": ["b", "c"], "b": ["d"], "c": ["d"], "d": ["a"]}, [["a", "b", "c", "d"]]),
    ],
)
def test_strongly_connected(graph: dict[str, list[str]], cycles: list[list[str]]) -> None:
    assert strongly_connected(graph) == cycles


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_report_counts_function_local_imports_and_leaves_generated_code_out(tmp_path: Path) -> None:
    _write(
        tmp_path,
        {
            "graphprobe/__init__.py": "",
            "graphprobe/a.py": "from graphprobe import b\n",
            # The cycle a <-> b is closed by an import inside a function.
            "graphprobe/b.py": "def f():\n    from graphprobe import a\n    return a\n\n\n\n",
            "graphprobe/c.py": "import graphprobe.a\n",
            "graphprobe/protos/__init__.py": "",
            "graphprobe/protos/x_pb2.py": "import graphprobe.a\nimport graphprobe.c\n",
        },
    )
    text = report(tmp_path, ["graphprobe"], largest=2)
    lines = text.splitlines()
    # graphprobe, a, b, c; edges a->b, b->a, c->a; one cycle of two modules.
    assert ["graphprobe", "4", "3", "1", "2"] in [line.split() for line in lines]
    assert "  2 modules: graphprobe.a, graphprobe.b" in lines
    assert lines[-2:] == ["      6  graphprobe/b.py", "      1  graphprobe/a.py"]
    assert str(tmp_path) not in sys.path


def test_command_runs_on_this_checkout() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "tools.import_graph", "api", "serving"],
        cwd=REPO, capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    assert "imports between these packages: 0" in out
    table = {line.split()[0]: line.split()[1:] for line in out.splitlines() if line.startswith(("api ", "serving "))}
    assert set(table) == {"api", "serving"}
    assert all(int(modules) > 20 for modules, *_ in table.values())
