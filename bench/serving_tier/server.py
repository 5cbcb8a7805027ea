"""One start of ``python -m serving`` for the serving-tier benchmark: which CPUs, which batching.

The benchmark's one model-server starter (the split setups of ``python -m bench`` start serving
through ``run-server.sh`` instead, as the product does).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from bench.processes import taskset
from bench.serving_tier.workload import MODEL_DIR, MODEL_NAME
from tools.processes import FlagValue, Process, start_serving

READY_TIMEOUT_S = 120.0
#: ``--batching_parameters_file`` of the ``tuned`` runs (BatchingParameters text proto).
TUNED_BATCHING = (
    "max_batch_size { value: 512 }\n"
    "batch_timeout_micros { value: 2000 }\n"
    "max_enqueued_batches { value: 100 }\n"
)


@dataclass(frozen=True)
class Config:
    """One server start: which CPUs, batching ``off``, ``default`` or ``tuned``, and any other
    ``python -m serving`` flags (``--name=value``)."""

    cpus: tuple[int, ...]
    batching: str
    flags: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        label = f"{len(self.cpus)} core{'s' if len(self.cpus) > 1 else ''}, batching {self.batching}"
        return ", ".join([label, *self.flags])


@contextlib.contextmanager
def serving(config: Config, workdir: Path) -> Iterator[tuple[Process, str, str]]:
    """``python -m serving`` on ``config.cpus`` with the fraud model; yields (process, REST base
    URL, gRPC target) once the model is AVAILABLE, and stops it (SIGTERM) afterwards. Its
    Prometheus page is on (``--monitoring_config_file``): the runs read its counters."""
    models_config = workdir / "models.config"
    models_config.write_text(
        f'model_config_list {{ config {{ name: "{MODEL_NAME}" base_path: "{MODEL_DIR}" '
        'model_platform: "tensorflow" } }\n'
    )
    monitoring = workdir / "monitoring.config"
    monitoring.write_text("prometheus_config { enable: true }\n")
    flags: dict[str, FlagValue] = {
        "model_config_file": models_config,
        "monitoring_config_file": monitoring,
        "file_system_poll_wait_seconds": 0,
    }
    if config.batching != "off":
        flags["enable_batching"] = True
    if config.batching == "tuned":
        parameters = workdir / "batching.config"
        parameters.write_text(TUNED_BATCHING)
        flags["batching_parameters_file"] = parameters
    name = f"serving-{len(config.cpus)}cpu-batching-{config.batching}"
    name += "".join("-" + flag.lstrip("-").replace("=", "-") for flag in config.flags)
    server = start_serving(workdir / f"{name}.log", prefix=taskset(config.cpus), extra=config.flags, **flags)
    try:
        server.wait_available(MODEL_NAME, timeout_s=READY_TIMEOUT_S)
        yield server.process, server.rest_url, server.grpc_target
    finally:
        server.process.stop()
