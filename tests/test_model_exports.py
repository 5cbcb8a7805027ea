"""`make model` reproduces the committed example exports: the same outputs to the last float32 bit.

Retrains the digits example (the quicker of the two, ~15 s) over a copy of the committed
export; the script keeps the copy only when the new model answers every probe row bit for
bit alike (`models.export.publish`). Training pins what would change the bits on another
machine: the kernels (oneDNN off: its code depends on the CPU's instruction set) and the
thread count.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tests.support import REPO


def test_retraining_digits_reproduces_the_committed_export(tmp_path: Path) -> None:
    committed = REPO / "models" / "digits" / "1"
    shutil.copytree(committed, tmp_path / "digits" / "1")
    out = subprocess.run(
        [sys.executable, "-m", "models.train_digits", "--output", str(tmp_path / "digits"), "--version", "1"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        env={"PATH": "/usr/bin:/bin", "TF_ENABLE_ONEDNN_OPTS": "1"},  # the script overrides it
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "held-out accuracy: 0.9889 as the API preprocesses them" in out.stdout  # the README's figure
    assert "the new export's outputs are identical to the bit on 900 probe rows" in out.stdout, out.stdout
    assert not (tmp_path / "digits" / ".1.incoming").exists()
