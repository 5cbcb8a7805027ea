"""`--rest_api_socket_path`: the REST API's Unix-domain socket is bound at start-up (no server
started here; `test_server` serves requests on it)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from serving.model_servers.flags import FlagError, parse_flags
from serving.model_servers.http_server import bind_unix
from serving.util.errors import ServingError


def test_a_socket_left_by_an_earlier_run_is_replaced(tmp_path: Path) -> None:
    path = tmp_path / "rest.sock"
    first = bind_unix(str(path))
    first.close()  # the file stays, as after a killed server
    assert path.is_socket()
    second = bind_unix(str(path))
    try:
        second.listen()
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.connect(str(path))
    finally:
        second.close()


def test_any_other_file_there_fails_start_up_with_one_line(tmp_path: Path) -> None:
    path = tmp_path / "rest.sock"
    path.write_text("not a socket")
    with pytest.raises(ServingError, match=r"Failed to start HTTP Server at unix:"):
        bind_unix(str(path))
    assert path.read_text() == "not a socket"


def test_the_flags_default_off() -> None:
    options = parse_flags(["--model_config_file=x"])
    assert options.rest_api_socket_path == "" and options.session_run_inline_below_us == 0
    with pytest.raises(FlagError):
        parse_flags(["--model_config_file=x", "--session_run_inline_below_us=-1"])
