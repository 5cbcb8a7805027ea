"""``--monitoring_config_file``: TF Serving's ``MonitoringConfig`` text proto.

``tensorflow_serving/config/monitoring_config.proto``::

    prometheus_config { enable: true path: "/monitoring/prometheus/metrics" }

With ``enable: true`` the REST port answers ``GET <path>`` (default :data:`PROMETHEUS_PATH`,
``PrometheusExporter::kPrometheusPath``) with the metrics of :mod:`serving.util.metrics`; metrics
are recorded either way (as in TF Serving), the config only decides whether they are served.
"""

from __future__ import annotations

from serving.protos.tensorflow_serving.config import monitoring_config_pb2
from serving.util.errors import Code, ServingError
from serving.util.proto_util import read_text_proto_file

__all__ = ["PROMETHEUS_PATH", "prometheus_path"]

#: ``PrometheusExporter::kPrometheusPath``: where metrics are served when the config names none.
PROMETHEUS_PATH = "/monitoring/prometheus/metrics"


def prometheus_path(monitoring_config_file: str) -> str | None:
    """The path to serve metrics at, from ``--monitoring_config_file``; ``None``: not served.

    ``None`` when the flag is empty or ``prometheus_config.enable`` is false; the config's
    ``path``, or :data:`PROMETHEUS_PATH` when it is empty. Raises ``INVALID_ARGUMENT`` for an
    unreadable or malformed file (TF Serving's ``Invalid protobuf file: '<path>'``), and for a
    path that does not start with ``/``.
    """
    if not monitoring_config_file:
        return None
    config = read_text_proto_file(
        monitoring_config_file, monitoring_config_pb2.MonitoringConfig(), "monitoring config"
    )
    if not config.prometheus_config.enable:
        return None
    path = config.prometheus_config.path or PROMETHEUS_PATH
    if not path.startswith("/"):
        raise ServingError(
            Code.INVALID_ARGUMENT, f"prometheus_config.path must start with '/'; got {path!r}"
        )
    return path
