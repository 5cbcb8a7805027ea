"""Running a test scenario inside private network + mount namespaces (`unshare`)."""

from __future__ import annotations

import os
from collections.abc import Sequence

NAMESPACE_HINT = "needs util-linux unshare and iproute2 ip, and root or unprivileged user namespaces"


def unshare_command(argv: Sequence[str]) -> list[str]:
    """`argv` under new network and mount namespaces (a user namespace too when not root)."""
    user = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
    return ["unshare", *user, "--net", "--mount", "--fork", "--", *argv]
