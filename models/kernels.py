"""Which kernels TensorFlow's numerics come from on this machine: oneDNN's instruction set.

TensorFlow's x86 wheels run matrix products and convolutions on oneDNN even with
`TF_ENABLE_ONEDNN_OPTS=0` (that flag turns off oneDNN's graph rewrites and custom ops, not
the oneDNN sgemm inside TensorFlow's Eigen contraction kernel), and oneDNN picks its code
by the CPU's instruction set when it first runs. The same seed, ops and thread count then
train other last bits on an AVX-512 host than on an AVX2-only one, and a few hundred
optimiser steps carry those bits into visibly different weights (measured on the digits
example: max |difference| of its probabilities 0.08 on an AMD EPYC without AVX-512, 0.32
under `ONEDNN_MAX_CPU_ISA=AVX2` on one with it; both 0.9889 accuracy, every digit
classified alike).

oneDNN honours `ONEDNN_MAX_CPU_ISA` (e.g. `AVX2`) in TensorFlow's build: a cap that makes an
AVX-512 host run the AVX2 kernels, so the other kind's numerics can be exercised on either
kind (`.ci/run` runs the numerics-sensitive tests a second time under it).

This module imports no TensorFlow: it asks a child process, so callers stay light.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Mapping

# What oneDNN prints first under ONEDNN_VERBOSE=1: "onednn_verbose,v1,info,cpu,isa:Intel AVX2".
_ISA_LINE = re.compile(r"^onednn_verbose,(?:v\d+,)?info,cpu,isa:(?P<isa>.+)$", re.MULTILINE)

_PROBE = "import tensorflow as tf; tf.linalg.matmul(tf.ones([8, 8]), tf.ones([8, 8]))"


def kernel_isa(env: Mapping[str, str] | None = None) -> str:
    """The instruction set oneDNN's kernels run on, as oneDNN itself names it.

    Runs one matrix product in a child Python with `ONEDNN_VERBOSE=1` and reads oneDNN's
    `info,cpu,isa:` line, e.g. "Intel AVX-512 with Intel DL Boost and bfloat16 support" on an
    AMD EPYC with AVX-512, "Intel AVX2" on one without (or under `ONEDNN_MAX_CPU_ISA=AVX2`).
    About 3 s (the child imports TensorFlow).

    Args:
        env: the child's environment (default: this process's); `ONEDNN_MAX_CPU_ISA` in it
            counts, as it does for training.

    Raises:
        RuntimeError: the child failed or oneDNN printed no such line.
    """
    child_env = dict(os.environ if env is None else env)
    child_env.update(ONEDNN_VERBOSE="1", TF_CPP_MIN_LOG_LEVEL="3", TF_ENABLE_ONEDNN_OPTS="0")
    out = subprocess.run(
        [sys.executable, "-c", _PROBE], capture_output=True, text=True, env=child_env, timeout=120, check=False
    )
    found = _ISA_LINE.search(out.stdout)
    if out.returncode != 0 or found is None:
        raise RuntimeError(f"could not read oneDNN's instruction set (exit {out.returncode}): {out.stderr[-500:]}")
    return found["isa"].strip()
