"""api.security.api_keys: the key file's format, the lookup, the reload on change, the tool."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from api.security.api_keys import (
    MIN_KEY_CHARS,
    ApiKeys,
    KeyFileError,
    key_digest,
    key_line,
    main,
    new_key,
    parse_key_file,
)
from tests.api.tokens import Clock, KeyFile


def test_new_keys_are_long_random_and_never_jwt_shaped() -> None:
    keys = {new_key() for _ in range(100)}
    assert len(keys) == 100
    for key in keys:
        assert key.startswith("tfs_") and len(key) == 47 and "." not in key


def test_a_line_holds_the_digest_not_the_key() -> None:
    key = new_key()
    line = key_line("ci", key, ["fraud:score", "digits:classify"])
    assert key not in line
    assert line == f"ci sha256:{key_digest(key).hex()} fraud:score digits:classify"
    (entry,) = parse_key_file(line).values()
    assert entry.key_id == "ci" and entry.scopes == {"fraud:score", "digits:classify"}


def test_the_file_format_comments_blank_lines_and_scopes() -> None:
    a, b = new_key(), new_key()
    text = f"# keys\n\n{key_line('a', a)}   # trailing comment\n  {key_line('b', b, ['s1'])}\n"
    keys = parse_key_file(text)
    assert {k.key_id: k.scopes for k in keys.values()} == {"a": frozenset(), "b": {"s1"}}


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("only-an-id", "line 1: expected"),
        ("bad/id sha256:" + "0" * 64, "key id"),
        ("ok md5:" + "0" * 32, "second field"),
        ("ok sha256:" + "0" * 63, "second field"),
        ("ok sha256:" + "A" * 64, "second field"),
        ("ok sha256:" + "0" * 64 + ' "quoted"', "invalid scope"),
    ],
)
def test_malformed_lines_are_refused_by_line_number(line: str, message: str) -> None:
    with pytest.raises(KeyFileError, match=message):
        parse_key_file(line, "keys")


def test_repeated_ids_and_keys_are_refused() -> None:
    key = new_key()
    with pytest.raises(KeyFileError, match="appears twice"):
        parse_key_file(f"{key_line('a', key)}\n{key_line('a', new_key())}")
    with pytest.raises(KeyFileError, match="listed twice"):
        parse_key_file(f"{key_line('a', key)}\n{key_line('b', key)}")


def test_lookup_finds_a_listed_key_only(tmp_path: Path) -> None:
    file = KeyFile(tmp_path / "keys")
    key = file.add("ci", "fraud:score")
    keys = ApiKeys(file.path, 5.0)
    entry = keys.lookup(key)
    assert entry is not None and entry.key_id == "ci"
    assert keys.lookup(key[:-1] + ("A" if key[-1] != "A" else "B")) is None
    assert keys.lookup("x" * (MIN_KEY_CHARS - 1)) is None  # short: refused unhashed


def test_a_revoked_key_is_refused_once_the_interval_is_over_the_others_kept(tmp_path: Path) -> None:
    clock = Clock()
    file = KeyFile(tmp_path / "keys")
    revoked, kept = file.add("old"), file.add("new")
    keys = ApiKeys(file.path, 5.0, clock)
    file.revoke("old")
    clock.now += 4.9
    assert keys.lookup(revoked) is not None  # within the interval: not looked at yet
    clock.now += 0.1
    assert keys.lookup(revoked) is None
    assert keys.lookup(kept) is not None
    added = file.add("newer")
    clock.now += 5
    assert keys.lookup(added) is not None


def test_a_broken_file_on_reload_keeps_the_keys_and_logs_without_keys(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock()
    file = KeyFile(tmp_path / "keys")
    key = file.add("ci")
    keys = ApiKeys(file.path, 1.0, clock)
    file.path.write_text("garbage line\n")
    clock.now += 1
    with caplog.at_level(logging.ERROR, "api.security"):
        assert keys.lookup(key) is not None
    assert "not reloaded" in caplog.text and "line 1" in caplog.text and key not in caplog.text
    file.path.unlink()
    clock.now += 1
    assert keys.lookup(key) is not None
    file.write()
    clock.now += 1
    assert keys.lookup(key) is not None


def test_a_missing_or_broken_file_at_start_names_the_setting(tmp_path: Path) -> None:
    with pytest.raises(KeyFileError, match="AUTH__API_KEYS_FILE .*missing"):
        ApiKeys(tmp_path / "missing", 1.0)
    (tmp_path / "bad").write_bytes(b"\xff\xfe")
    with pytest.raises(KeyFileError, match="not UTF-8"):
        ApiKeys(tmp_path / "bad", 1.0)


def test_the_tool_makes_appends_and_revokes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "api-keys"
    assert main(["new", "--id", "ci", "--scope", "fraud:score", "--file", str(path)]) == 0
    key = capsys.readouterr().out.strip()
    assert main(["new", "--id", "batch", "--file", str(path)]) == 0
    other = capsys.readouterr().out.strip()
    text = path.read_text()
    assert key not in text and other not in text
    assert path.stat().st_mode & 0o777 == 0o644
    keys = ApiKeys(path, 1.0)
    assert keys.lookup(key).key_id == "ci" and keys.lookup(key).scopes == {"fraud:score"}  # type: ignore[union-attr]
    assert main(["new", "--id", "ci", "--file", str(path)]) == 2  # already there
    assert "already there" in capsys.readouterr().err
    assert main(["revoke", "--id", "ci", "--file", str(path)]) == 0
    keys = ApiKeys(path, 1.0)
    assert keys.lookup(key) is None and keys.lookup(other) is not None
    assert main(["revoke", "--id", "ci", "--file", str(path)]) == 2


def test_the_tool_without_a_file_prints_the_line_apart_from_the_key(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["new", "--id", "ci"]) == 0
    out, err = capsys.readouterr()
    key, line = out.strip(), err.strip()
    assert parse_key_file(line)[key_digest(key)].key_id == "ci"
