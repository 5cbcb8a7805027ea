"""Where servable versions come from: numeric sub-directories of a model's ``base_path``.

Follows TF Serving's ``FileSystemStoragePathSource``
(``tensorflow_serving/sources/storage_path/file_system_storage_path_source.cc``): a version is a
child directory of ``base_path`` whose name is a non-negative integer (``/models/foo/1``,
``/models/foo/0002`` -> version 2), and the model's ``ServableVersionPolicy`` picks which of them
are aspired (should be loaded):

* ``latest { num_versions: N }`` (the default when no policy is set, with N = 1): the N highest.
* ``all {}``: every version on disk.
* ``specific { versions: [...] }``: the listed versions that exist on disk.

:func:`select_versions` is pure (policy + versions in, versions out) so it can be tested by table;
:func:`list_versions` is the only filesystem access. The source is read once at start-up for now;
polling (``--file_system_poll_wait_seconds``) comes with version reloading.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable, Mapping
from typing import TypeAlias

from tensorflow_serving.config.file_system_storage_path_source_pb2 import (
    FileSystemStoragePathSourceConfig,
)

from serving.errors import Code, ServingError

__all__ = ["list_versions", "select_versions"]

#: The type of ``ModelConfig.model_version_policy``.
ServableVersionPolicy: TypeAlias = FileSystemStoragePathSourceConfig.ServableVersionPolicy

_VERSION_DIR = re.compile(r"\d+", re.ASCII)
_log = logging.getLogger(__name__)


def list_versions(servable_name: str, base_path: str) -> Mapping[int, str]:
    """Version number -> directory, for every numeric child directory of ``base_path``.

    Raises ``NOT_FOUND`` ``Could not find base path <base_path> for servable <name>`` when
    ``base_path`` is not a directory (TF Serving's message). An empty result is logged with TF
    Serving's hint about numeric leaf directories.
    """
    if not os.path.isdir(base_path):
        raise ServingError(
            Code.NOT_FOUND, f"Could not find base path {base_path} for servable {servable_name}"
        )
    versions: dict[int, str] = {}
    for entry in os.scandir(base_path):
        if _VERSION_DIR.fullmatch(entry.name) and entry.is_dir():
            version = int(entry.name)
            # Two spellings of one number ("1", "01"): keep the first, as TF Serving keeps one.
            versions.setdefault(version, entry.path)
    if not versions:
        _log.warning(
            "No versions of servable %s found under base path %s. Did you forget to name your "
            "leaf directory as a number (eg. '/1/')?",
            servable_name,
            base_path,
        )
    return versions


def select_versions(policy: ServableVersionPolicy, versions: Iterable[int]) -> list[int]:
    """The aspired versions under ``policy``, highest first.

    ``latest`` with ``num_versions`` 0 (or no policy at all) means 1, as in TF Serving.
    ``specific`` versions missing on disk are simply not aspired.
    """
    available = sorted(set(versions), reverse=True)
    choice = policy.WhichOneof("policy_choice")
    if choice == "all":
        return available
    if choice == "specific":
        wanted = set(policy.specific.versions)
        return [v for v in available if v in wanted]
    num_versions = max(policy.latest.num_versions, 1) if choice == "latest" else 1
    return available[:num_versions]
