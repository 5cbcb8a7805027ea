"""``--model_config_file_poll_wait_seconds``: re-read ``--model_config_file`` and apply it.

TF Serving's ``Server::PollFilesystemAndReloadConfig`` (``model_servers/server.cc``): every N
seconds (N > 0; 0 reads the file once, at start-up) the file is parsed again and handed to
:meth:`ServableManager.reload_config <serving.core.manager.ServableManager.reload_config>`, whether it
changed or not. Models added to the file are loaded, models removed are unloaded, changed version
policies and labels apply. A file that does not parse, or a config the manager refuses, is logged
and the running config stays in force:

    Failed to read ModelServerConfig file: Invalid protobuf file: '/models/models.config': ...
    PollFilesystemAndReloadConfig failed to ReloadConfig: Request to assign label to version 2 ...

Traps kept from TF Serving: a reload blocks until the models it adds are loaded (the next poll
waits); and since every poll re-validates the labels, a label whose version was since unloaded
makes every later reload fail, until the file moves or drops that label.
"""

from __future__ import annotations

import logging

from serving.config.model_server_config import read_config_file
from serving.core.manager import ServableManager
from serving.util.errors import ServingError
from serving.util.periodic_function import PeriodicFunction

__all__ = ["ModelConfigFilePoller", "poll_filesystem_and_reload_config"]

_log = logging.getLogger(__name__)


def poll_filesystem_and_reload_config(config_file: str, manager: ServableManager) -> bool:
    """Read ``config_file`` and reload the manager with it; ``False`` (logged) on any error."""
    try:
        config = read_config_file(config_file)
    except ServingError as exc:
        _log.error("Failed to read ModelServerConfig file: %s", exc.message)
        return False
    try:
        manager.reload_config(config)
    except ServingError as exc:
        _log.error("PollFilesystemAndReloadConfig failed to ReloadConfig: %s", exc.message)
        return False
    return True


class ModelConfigFilePoller:
    """Calls :func:`poll_filesystem_and_reload_config` every ``poll_wait_seconds`` on a thread.

    The first call comes one interval after :meth:`start` (the file was just read at start-up).
    """

    def __init__(
        self, config_file: str, manager: ServableManager, poll_wait_seconds: int
    ) -> None:
        self._function = PeriodicFunction(
            lambda: poll_filesystem_and_reload_config(config_file, manager),
            poll_wait_seconds,
            name="fs_config_polling_thread",
            initial_delay_s=poll_wait_seconds,
        )

    def start(self) -> None:
        """Start polling."""
        self._function.start()

    def stop(self, timeout_s: float | None = None) -> None:
        """Stop polling; wait up to ``timeout_s`` for a reload under way (stop the manager's
        loading first, so that a reload waiting for loads returns at once)."""
        self._function.stop(timeout_s)
