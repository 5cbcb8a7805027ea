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


def test_folders_are_listed_with_the_layer_the_contract_gives_them(tmp_path: Path) -> None:
    _write(
        tmp_path,
        {
            "pyproject.toml": (
                "[[tool.importlinter.contracts]]\n"
                'id = "probe-layers"\ntype = "layers"\ncontainers = ["layered"]\n'
                'layers = ["app | web", "core"]\n'
            ),
            "layered/__init__.py": "",
            "layered/app.py": "from layered.core import x\n",
            "layered/web/__init__.py": "",
            "layered/web/handlers.py": "from layered.core import x\n\n",
            "layered/core/__init__.py": "x = 1\n",
            "layered/core/deep/__init__.py": "",
            "layered/core/deep/more.py": "",
            "layered/gen/__init__.py": "",
            "layered/gen/y_pb2.py": "",
        },
    )
    lines = report(tmp_path, ["layered"]).splitlines()
    rows = {line.split()[0]: line.split(None, 3)[1:] for line in lines if line.startswith("  layered/")}
    assert rows == {
        "layered/": ["2", "1", "holds the layers of probe-layers; app 1 of 2 (app | web)"],
        "layered/core/": ["1", "1", "2 of 2 (core)"],
        "layered/core/deep/": ["2", "0", "2 of 2 (core)"],
        "layered/web/": ["2", "2", "1 of 2 (app | web)"],
    }  # generated code only (gen/) is left out
