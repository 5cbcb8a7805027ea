"""The peers: what a user would pick instead of the split, each in its own virtual environment.

- `bentoml`: `bentoml serve` of `bench/peers/bentoml_service.py` (BentoML 1.4's service
  API), the model in-process, `@bentoml.api(batchable=True)`: BentoML's adaptive batching;
- `ray-serve`: `bench/peers/ray_serve_app.py`, a local Ray instance and one Serve deployment
  with a FastAPI ingress, the model in the replica, `@serve.batch`.

Both load the same SavedModel (`tf.saved_model.load`, its `serving_default` signature, one
intra- and one inter-op thread, as the tuned setup) and run the same feature code
(`examples.fraud.features` on `examples.fraud.schemas.Transaction`, imported from this
checkout through PYTHONPATH), pinned to the same server CPUs as every setup.

Each peer is installed from the package registry by pip into `.venv-peers/<name>/` (git-ignored)
with pinned versions (`PEERS`): the peer itself, TensorFlow at the version of this
environment (so the same SavedModel runs on the same kernels), and the few packages the
feature code's imports need, at this environment's versions. `ensure_installed` does nothing
when the venv's stamp already lists exactly those pins (`make bench` then starts at once);
it is also `make bench-peers`. Their pins differ from ours, hence a venv each.
"""

from __future__ import annotations

import importlib.metadata
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PEERS_DIR = REPO / ".venv-peers"
STAMP = ".bench-pins"
#: What the feature code (examples.fraud and the api.model_routes it declares with) imports
#: beyond what the peers bring: installed at this environment's versions.
FEATURE_CODE_PACKAGES = ("tenacity", "httptools", "orjson")
INSTALL_TIMEOUT_S = 1200.0


@dataclass(frozen=True)
class Peer:
    """One peer: its venv name, its pinned requirement and the command that starts it."""

    name: str
    requirement: str  # e.g. "bentoml==1.4.40"
    docs: str  # the documentation the service file follows

    @property
    def venv(self) -> Path:
        """The peer's virtual environment."""
        return PEERS_DIR / self.name

    @property
    def python(self) -> Path:
        """The venv's interpreter."""
        return self.venv / "bin" / "python"

    def pins(self) -> list[str]:
        """Every requirement installed, pinned: the peer, TensorFlow and the feature code's."""
        names = ("tensorflow", *FEATURE_CODE_PACKAGES)
        ours = [f"{name}=={importlib.metadata.version(name)}" for name in names]
        return [self.requirement, *ours]

    def installed(self) -> bool:
        """The venv exists and was installed with exactly `pins()`."""
        stamp = self.venv / STAMP
        return self.python.exists() and stamp.exists() and stamp.read_text().split() == self.pins()


BENTOML = Peer("bentoml", "bentoml==1.4.40", "BentoML 1.4's documentation: Services; Adaptive batching")
RAY_SERVE = Peer(
    "ray-serve", "ray[serve]==2.60.0",
    "Ray Serve's documentation: Set Up FastAPI and HTTP; Dynamic Request Batching",
)
PEERS = {p.name: p for p in (BENTOML, RAY_SERVE)}


class PeerInstallError(RuntimeError):
    """A peer's venv could not be created or its pins installed (the message says why)."""


def ensure_installed(peer: Peer, progress: Callable[[str], None] = print) -> float:
    """Create `peer`'s venv and install its pins unless already done; seconds it took.

    Raises:
        PeerInstallError: venv creation or pip failed (the end of pip's output is in the
            message, the registry's own words for a version it does not have).
    """
    if peer.installed():
        return 0.0
    started = time.monotonic()
    if peer.venv.exists():
        shutil.rmtree(peer.venv)
    peer.venv.parent.mkdir(parents=True, exist_ok=True)
    pins = peer.pins()
    progress(f"[bench] installing peer {peer.name} into {peer.venv.relative_to(REPO)}: {' '.join(pins)} "
             "(once; about a minute per peer, mostly TensorFlow's wheel)")
    steps = [
        [sys.executable, "-m", "venv", str(peer.venv)],
        [str(peer.python), "-m", "pip", "install", "--quiet", "--upgrade", "pip"],
        [str(peer.python), "-m", "pip", "install", "--quiet", *pins],
    ]
    for args in steps:
        try:
            done = subprocess.run(args, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired as exc:
            raise PeerInstallError(
                f"{peer.name}: {' '.join(args[:4])} ... took over {INSTALL_TIMEOUT_S:.0f} s"
            ) from exc
        if done.returncode != 0:
            # pip's notes about absent local index folders are noise; its errors are not.
            lines = [line for line in (done.stderr + done.stdout).splitlines()
                     if line.strip() and not line.startswith("WARNING: Location")]
            raise PeerInstallError(f"{peer.name}: {' '.join(args[:5])} ... exited {done.returncode}: "
                                   + " | ".join(lines[-6:]))
    (peer.venv / STAMP).write_text("\n".join(pins) + "\n")
    took = time.monotonic() - started
    progress(f"[bench] peer {peer.name} installed in {took:.0f} s")
    return took


def main() -> int:
    """`python -m bench.peers`: install every peer (`make bench-peers`); 1 if one failed."""
    failed = 0
    for peer in PEERS.values():
        try:
            ensure_installed(peer)
        except PeerInstallError as exc:
            print(f"[bench] {exc}", file=sys.stderr)
            failed += 1
        else:
            print(f"[bench] peer {peer.name}: {peer.venv.relative_to(REPO)} ({' '.join(peer.pins())})")
    return 1 if failed else 0
