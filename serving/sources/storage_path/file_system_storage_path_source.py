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
:func:`list_versions` is the only filesystem access. :class:`FileSystemStoragePathSource` polls
every ``--file_system_poll_wait_seconds`` (TF Serving's default 1; 0 polls once, when the config
is applied) and hands each model's full aspired set -- version -> directory -- to
the manager, which loads and unloads by :mod:`serving.core.aspired_version_policy`.

**Trap: a version directory is picked up as soon as it appears.** Copying a SavedModel straight to
``base_path/2`` lets a poll see a half-written directory; its load then fails and the version stays
``END`` (with the error) until the directory disappears again. Copy it under a non-numeric name in
the same file system and rename it into place, which is atomic::

    cp -r export/ /models/foo/.2.incoming && mv /models/foo/.2.incoming /models/foo/2

and remove an old version only after the new one is in place (see
:mod:`serving.core.aspired_version_policy`).

Deliberate differences from TF Serving: a missing ``base_path`` only skips that model's update
(TF Serving's poll stops at the first such model, so the models after it get no updates either);
a changed config is polled at once rather than at the next tick (with
``--file_system_poll_wait_seconds=0`` TF Serving would never poll a model added by a config reload);
only directories count as versions (TF Serving also aspires a *file* named ``2``, which then fails
to load).
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import TypeAlias

from tensorflow_serving.config.file_system_storage_path_source_pb2 import (
    FileSystemStoragePathSourceConfig,
)
from tensorflow_serving.config.model_server_config_pb2 import ModelServerConfig

from serving.util.errors import Code, ServingError
from serving.util.periodic_function import PeriodicFunction

__all__ = [
    "AspiredVersionsCallback",
    "FileSystemStoragePathSource",
    "create_storage_path_source_config",
    "list_versions",
    "select_versions",
]

#: The type of ``ModelConfig.model_version_policy``.
ServableVersionPolicy: TypeAlias = FileSystemStoragePathSourceConfig.ServableVersionPolicy

#: ``Source::AspiredVersionsCallback``: (servable name, aspired version -> directory). An empty
#: mapping means "no version of this servable is aspired" (unload them all).
AspiredVersionsCallback: TypeAlias = Callable[[str, Mapping[int, str]], None]

_VERSION_DIR = re.compile(r"\d+", re.ASCII)
_log = logging.getLogger(__name__)


def list_versions(servable_name: str, base_path: str) -> Mapping[int, str]:
    """Version number -> directory, for every numeric child directory of ``base_path``.

    Raises ``NOT_FOUND`` ``Could not find base path <base_path> for servable <name>`` when
    ``base_path`` is not a directory (TF Serving's message). Two spellings of one number (``1``,
    ``01``): the one sorting last wins, with TF Serving's warning.
    """
    if not os.path.isdir(base_path):
        raise ServingError(
            Code.NOT_FOUND, f"Could not find base path {base_path} for servable {servable_name}"
        )
    versions: dict[int, str] = {}
    children = sorted(os.scandir(base_path), key=lambda entry: entry.name)
    for entry in children:
        if _VERSION_DIR.fullmatch(entry.name) and entry.is_dir():
            version = int(entry.name)
            if version in versions:
                _log.warning(
                    "Duplicate version directories detected. Version %d will be loaded from %s, "
                    "%s will be ignored.",
                    version,
                    entry.name,
                    os.path.basename(versions[version]),
                )
            versions[version] = entry.path
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


def create_storage_path_source_config(
    config: ModelServerConfig, file_system_poll_wait_seconds: int
) -> FileSystemStoragePathSourceConfig:
    """``ServerCore::CreateStoragePathSourceConfig``: one servable to monitor per model."""
    source_config = FileSystemStoragePathSourceConfig(
        file_system_poll_wait_seconds=file_system_poll_wait_seconds
    )
    for model in config.model_config_list.config:
        servable = source_config.servables.add()
        servable.servable_name = model.name
        servable.base_path = model.base_path
        servable.servable_version_policy.CopyFrom(model.model_version_policy)
    return source_config


class FileSystemStoragePathSource:
    """Polls the file system and emits each servable's aspired versions. Thread-safe.

    ``callback`` receives, per servable and per poll, the complete aspired set (TF Serving's
    ``SetAspiredVersions`` semantics: versions missing from it are no longer aspired). A servable
    whose base path cannot be read is skipped for that poll (its versions stay as they are). TF
    Serving's errors and warnings are logged when they change, not on every poll.
    """

    def __init__(self, callback: AspiredVersionsCallback) -> None:
        self._callback = callback
        self._config = FileSystemStoragePathSourceConfig()
        self._lock = threading.Lock()  # one poll or config change at a time
        self._last_problem: dict[str, str] = {}  # servable -> what its last poll logged
        self._polling: PeriodicFunction | None = None

    def update_config(self, config: FileSystemStoragePathSourceConfig) -> None:
        """``UpdateConfig``: servables no longer listed get an empty aspired set; then poll."""
        with self._lock:
            kept = {servable.servable_name for servable in config.servables}
            for servable in self._config.servables:
                if servable.servable_name not in kept:
                    self._callback(servable.servable_name, {})
            self._config = config
            self._poll_locked()

    def poll(self) -> None:
        """``PollFileSystemAndInvokeCallback``: list every servable's versions, emit them."""
        with self._lock:
            self._poll_locked()

    def _poll_locked(self) -> None:
        for servable in self._config.servables:
            name = servable.servable_name
            policy = servable.servable_version_policy
            try:
                on_disk = list_versions(name, servable.base_path)
            except (ServingError, OSError) as exc:
                message = exc.message if isinstance(exc, ServingError) else str(exc)
                self._warn_once(
                    name,
                    logging.ERROR,
                    f"FileSystemStoragePathSource encountered a filesystem access error: {message}",
                )
                continue
            aspired = select_versions(policy, on_disk)
            problems = []
            if not on_disk:
                problems.append(
                    f"No versions of servable {name} found under base path "
                    f"{servable.base_path}. Did you forget to name your leaf directory as a "
                    "number (eg. '/1/')?"
                )
            if policy.WhichOneof("policy_choice") == "specific":
                problems += [
                    f"Version {version} of servable {name}, which was requested to be served as "
                    "a 'specific' version in the servable's version policy, was not found in the "
                    "file system"
                    for version in sorted(set(policy.specific.versions) - set(on_disk))
                ]
            self._warn_once(name, logging.WARNING, "\n".join(problems))
            self._callback(name, {version: on_disk[version] for version in aspired})

    def _warn_once(self, servable_name: str, level: int, message: str) -> None:
        """Log ``message`` unless it is what this servable's last poll logged (TF Serving logs it
        on every poll, i.e. every second by default)."""
        if message and self._last_problem.get(servable_name) != message:
            for line in message.splitlines():
                _log.log(level, "%s", line)
        self._last_problem[servable_name] = message

    def start(self, poll_wait_seconds: int) -> None:
        """Poll every ``poll_wait_seconds`` from now on (:meth:`update_config` made the first).

        0 or negative: no further polls (TF Serving's one-shot poll; its negative "never poll,
        wait forever" testing mode is not reproduced).
        """
        if poll_wait_seconds > 0 and self._polling is None:
            self._polling = PeriodicFunction(
                self.poll,
                poll_wait_seconds,
                name="FileSystemStoragePathSource_filesystem_polling_thread",
                initial_delay_s=poll_wait_seconds,
            )
            self._polling.start()

    def stop(self) -> None:
        """Stop polling; a poll under way finishes first."""
        if self._polling is not None:
            self._polling.stop()
