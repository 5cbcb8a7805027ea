"""Version labels: ``ModelConfig.version_labels`` -> the label map requests are resolved with.

``ServerCore::UpdateModelVersionLabelMap`` (``model_servers/server_core.cc``), pure: the config,
the versions that are AVAILABLE right now and the label map in force go in, the new label map comes
out -- or ``FAILED_PRECONDITION``, and then the whole config change is refused:

    Request to assign label to version 2 of model m, which is not currently available for inference

TF Serving runs this check at the *start* of every config load, before any version of that config
is loaded. Two well-known traps follow, kept here because they are TF Serving's contract (see
``serving_config.md``, "Assigning String Labels to Model Versions"):

* **At start-up every label fails**, since nothing is loaded yet -- even a label on version 1. Start
  with ``--allow_version_labels_for_unavailable_models`` to accept labels on versions that are not
  loaded yet. A request with such a label gets ``Servable not found for request: Specific(m, 2)``
  until that version is AVAILABLE.
* **A version cannot be loaded and labelled in the same config change.** Add the version first
  (its directory, or a ``specific`` policy), wait for AVAILABLE in the model status, then move the
  label. The flag does not help here: it only allows labels that are *new*, never moving an
  existing label to a version that is not AVAILABLE (so a swap never points traffic at a version
  that is still loading).

Labels only change on a config (re)load: a label keeps naming its version when that version is
later unloaded (requests with it then get ``Servable not found``).
"""

from __future__ import annotations

from collections.abc import Mapping, Set

from tensorflow_serving.config.model_server_config_pb2 import ModelServerConfig

from serving.util.errors import Code, ServingError

__all__ = ["LabelMap", "update_model_version_label_map"]

#: Model name -> label -> version.
LabelMap = Mapping[str, Mapping[str, int]]


def update_model_version_label_map(
    config: ModelServerConfig,
    available: Mapping[str, Set[int]],
    current: LabelMap,
    *,
    allow_version_labels_for_unavailable_models: bool = False,
) -> dict[str, dict[str, int]]:
    """The label map of ``config``, or ``FAILED_PRECONDITION`` (see the module docstring).

    ``available`` maps each model name to its AVAILABLE versions; ``current`` is the label map in
    force (empty before the first config). With ``allow_version_labels_for_unavailable_models`` a
    label may name a version that is not AVAILABLE, unless ``current`` already maps that label to a
    different version.
    """
    labels: dict[str, dict[str, int]] = {}
    for model in config.model_config_list.config:
        for label, version in sorted(model.version_labels.items()):
            existing = current.get(model.name, {}).get(label)
            allow_unavailable = allow_version_labels_for_unavailable_models and (
                existing is None or existing == version
            )
            if not allow_unavailable and version not in available.get(model.name, ()):
                raise ServingError(
                    Code.FAILED_PRECONDITION,
                    f"Request to assign label to version {version} of model {model.name}, "
                    "which is not currently available for inference",
                )
            labels.setdefault(model.name, {})[label] = version
    return labels
