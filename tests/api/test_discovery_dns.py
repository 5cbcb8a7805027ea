"""Replica discovery end to end: the API, a real DNS server, replicas on distinct loopback addresses.

The scenario (`tests.api.discovery_netns`) runs in a private network and mount namespace
(`unshare`: as root, or in an unprivileged user namespace), so its DNS server can own
127.0.0.1:53 and /etc/resolv.conf there without touching the host's.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.discovery_netns_support import NAMESPACE_HINT, unshare_command
from tests.support import REPO

pytestmark = pytest.mark.skipif(shutil.which("unshare") is None or shutil.which("ip") is None, reason=NAMESPACE_HINT)


def run_scenario(protocol: str, tmp_path: Path) -> dict[str, Any]:
    command = unshare_command(
        [sys.executable, "-m", "tests.api.discovery_netns", f"--protocol={protocol}", f"--tmp={tmp_path}"]
    )
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=240, env=dict(os.environ))
    if done.returncode != 0 and "unshare failed" in done.stderr:
        pytest.skip(f"{NAMESPACE_HINT}: {done.stderr.strip()}")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("protocol", ["rest", "grpc"])
def test_replicas_follow_dns_without_failing_a_request(protocol: str, tmp_path: Path) -> None:
    result = run_scenario(protocol, tmp_path)
    print(json.dumps(result, indent=1))
    assert result["failed"] == 0, result["failures"]
    assert result["ok"] > 100
    # Both listed replicas get calls; the unlisted one none.
    two = result["two_replicas"]
    assert two["127.0.0.2"] > 0 and two["127.0.0.3"] > 0 and two["127.0.0.4"] == 0, two
    # A replica added to DNS gets calls within a few seconds (lookups every 0.5 s + a probe).
    assert result["added_after_s"] < 3.0, result
    assert all(count > 0 for count in result["three_replicas"].values()), result["three_replicas"]
    # A replica removed from DNS stops getting calls by the next lookups, then stops unnoticed.
    assert result["removed_last_call_after_s"] < 3.0, result
    assert "127.0.0.2" not in result["after_removal"], result
    assert result["after_removal"]["127.0.0.3"] > 0 and result["after_removal"]["127.0.0.4"] > 0
