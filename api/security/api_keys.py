"""API keys: the file of hashed keys, its reload, the lookup of a presented key, and the tool
that makes keys.

The file (`AUTH__API_KEYS_FILE`, e.g. a Kubernetes Secret mounted as a volume) has one key a
line, `#` comments and blank lines ignored:

    # <key id> sha256:<hex digest of the key> [scope ...]
    ci-smoke   sha256:3f0c...e1  fraud:score
    batch-job  sha256:9a41...07  fraud:score digits:classify

The key id names the client in the access log and is its rate-limit bucket; the key itself is
never stored, logged or echoed. Revoking a key is deleting its line: the file is re-read when it
changes (`api.security.file_watch`), within `AUTH__RELOAD_INTERVAL_S`, and the other keys are
untouched. A file that cannot be read or parsed on reload is logged and the keys loaded before
are kept (a broken edit must not lock every client out); at start it stops the app.

Why SHA-256, unkeyed and fast: a key made here is 256 random bits (`new_key`, `secrets`), so
its digest cannot be reversed or brute-forced, and a slow password hash (bcrypt, scrypt,
Argon2: tens of milliseconds on purpose) would only add that to every request; it protects
guessable secrets, which these are not. A keyed hash (HMAC with a server-side pepper) would
likewise add only for low-entropy keys, at the price of a second secret to keep and rotate.
So the file holds SHA-256 digests, like a list of public keys it reveals nothing usable, and
presented keys shorter than `MIN_KEY_CHARS` are refused before they are hashed.

Constant time: the presented key is hashed first, and the digest is what is looked up (a dict
by digest, then `hmac.compare_digest` against the entry). A timing difference can therefore
only depend on the digest of what the caller sent, never on the bytes of a stored key, and
learning a stored digest would still need a SHA-256 preimage to become a key.

    python -m api.security.api_keys new --id ci-smoke --scope fraud:score --file api-keys
    python -m api.security.api_keys revoke --id ci-smoke --file api-keys
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import logging
import re
import secrets
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from api.security.file_watch import FileWatch

logger = logging.getLogger("api.security")

HASH_PREFIX: Final = "sha256:"
# Shorter keys are refused unhashed (`new_key` makes 47 characters: 43 of base64url, 256 bits).
MIN_KEY_CHARS: Final = 32
MAX_KEY_CHARS: Final = 512
KEY_PREFIX: Final = "tfs_"  # marks keys for secret scanners; base64url has no '.', so a key never looks like a JWT
_KEY_ID: Final = re.compile(r"[A-Za-z0-9._:@-]{1,64}")
_SCOPE: Final = re.compile(r"[\x21\x23-\x5b\x5d-\x7e]+")
_DIGEST_HEX: Final = re.compile(r"[0-9a-f]{64}")


class KeyFileError(ValueError):
    """The API key file cannot be used; the message names the file and the line, never a key."""


@dataclass(frozen=True, slots=True)
class ApiKey:
    """One line of the key file.

    Attributes:
        key_id: the client's name (1-64 of `[A-Za-z0-9._:@-]`).
        digest: SHA-256 of the key, 32 bytes.
        scopes: what the key may call (`AUTH__SCOPES`).
    """

    key_id: str
    digest: bytes
    scopes: frozenset[str]


def key_digest(key: str) -> bytes:
    """SHA-256 of `key`'s UTF-8 bytes (32 bytes)."""
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()


def new_key() -> str:
    """A fresh API key: `tfs_` and 256 random bits in base64url (47 characters)."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


def key_line(key_id: str, key: str, scopes: Sequence[str] = ()) -> str:
    """The key file's line for `key` (without a newline).

    Raises:
        KeyFileError: a bad id or scope, or a key shorter than `MIN_KEY_CHARS`.
    """
    if not _KEY_ID.fullmatch(key_id):
        raise KeyFileError(f"key id {key_id!r}: 1-64 of letters, digits and ._:@-")
    if not MIN_KEY_CHARS <= len(key) <= MAX_KEY_CHARS:
        raise KeyFileError(f"a key has {MIN_KEY_CHARS}-{MAX_KEY_CHARS} characters")
    for scope in scopes:
        if not _SCOPE.fullmatch(scope):
            raise KeyFileError(f"scope {scope!r}: printable ASCII without spaces, quotes or backslashes")
    return " ".join([key_id, HASH_PREFIX + key_digest(key).hex(), *scopes])


def parse_key_file(text: str, source: str = "API key file") -> dict[bytes, ApiKey]:
    """The keys of a key file's text, by digest (see module doc for the format).

    Raises:
        KeyFileError: a malformed line, a repeated id or digest; the message names `source`
            and the line number.
    """
    keys: dict[bytes, ApiKey] = {}
    ids: set[str] = set()
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        fields = line.split()
        where = f"{source}, line {number}"
        if len(fields) < 2:
            raise KeyFileError(f"{where}: expected '<key id> {HASH_PREFIX}<hex> [scope ...]'")
        key_id, hashed, *scopes = fields
        if not _KEY_ID.fullmatch(key_id):
            raise KeyFileError(f"{where}: the key id must be 1-64 of letters, digits and ._:@-")
        if not hashed.startswith(HASH_PREFIX) or not _DIGEST_HEX.fullmatch(hashed[len(HASH_PREFIX) :]):
            raise KeyFileError(f"{where}: the second field must be {HASH_PREFIX} and 64 lower-case hex digits")
        bad = [s for s in scopes if not _SCOPE.fullmatch(s)]
        if bad:
            raise KeyFileError(f"{where}: invalid scope {bad[0]!r}")
        digest = bytes.fromhex(hashed[len(HASH_PREFIX) :])
        if key_id in ids:
            raise KeyFileError(f"{where}: key id {key_id!r} appears twice")
        if digest in keys:
            raise KeyFileError(f"{where}: the same key is listed twice (as {keys[digest].key_id!r} too)")
        ids.add(key_id)
        keys[digest] = ApiKey(key_id, digest, frozenset(scopes))
    return keys


class ApiKeys:
    """The keys of the key file, re-read when it changes (see module doc).

    Args:
        path: the key file.
        reload_interval_s: how often it is checked for changes, seconds.
        clock: monotonic seconds (tests pass their own).

    Raises:
        KeyFileError: at construction, the file cannot be read or parsed.
    """

    def __init__(self, path: Path, reload_interval_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._watch = FileWatch(path, reload_interval_s, clock)
        try:
            self._keys = parse_key_file(self._watch.read().decode("utf-8"), str(path))
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise KeyFileError(f"AUTH__API_KEYS_FILE {path}: {_reason(exc)}") from None

    @property
    def keys(self) -> Mapping[bytes, ApiKey]:
        """The keys loaded now, by digest."""
        return self._keys

    def lookup(self, key: str) -> ApiKey | None:
        """The entry of a presented key, or None when it is not (or no longer) in the file."""
        if self._watch.changed():
            self._reload()
        if not MIN_KEY_CHARS <= len(key) <= MAX_KEY_CHARS:
            return None
        digest = key_digest(key)
        entry = self._keys.get(digest)
        if entry is None or not hmac.compare_digest(entry.digest, digest):
            return None
        return entry

    def _reload(self) -> None:
        path = self._watch.path
        try:
            keys = parse_key_file(self._watch.read().decode("utf-8"), str(path))
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            logger.error(
                "API key file not reloaded, keeping the %d keys loaded before: %s", len(self._keys), _reason(exc)
            )
            return
        if keys != self._keys:
            before = {k.key_id for k in self._keys.values()}
            after = {k.key_id for k in keys.values()}
            logger.info(
                "API key file reloaded: %d keys (added: %s; removed: %s)",
                len(keys), sorted(after - before) or "-", sorted(before - after) or "-",
            )  # fmt: skip
        self._keys = keys


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError):
        return exc.strerror or type(exc).__name__
    if isinstance(exc, UnicodeDecodeError):
        return "not UTF-8 text"
    return str(exc)


# --- the tool -----------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m api.security.api_keys new|revoke ...`: make a key and add its line to a key
    file (the key is printed once, on stdout; only its digest is written), or remove a key's line."""
    parser = argparse.ArgumentParser(prog="python -m api.security.api_keys", description=main.__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    new = commands.add_parser("new", help="make a key, print it, add its hashed line to --file (or print the line)")
    new.add_argument("--id", required=True, help="the key id (names the client in logs and rate limits)")
    new.add_argument("--scope", action="append", default=[], help="a scope the key holds (repeatable)")
    new.add_argument("--file", type=Path, help="the key file to append the line to (made if missing)")
    revoke = commands.add_parser("revoke", help="remove the line of a key id from --file")
    revoke.add_argument("--id", required=True)
    revoke.add_argument("--file", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        if args.command == "new":
            return _new(args.id, args.scope, args.file)
        return _revoke(args.id, args.file)
    except (KeyFileError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _new(key_id: str, scopes: Sequence[str], file: Path | None) -> int:
    key = new_key()
    line = key_line(key_id, key, scopes)
    if file is None:
        print(line, file=sys.stderr)
    else:
        existing = file.read_text() if file.exists() else ""
        keys = parse_key_file(existing, str(file))
        if any(k.key_id == key_id for k in keys.values()):
            raise KeyFileError(f"{file}: key id {key_id!r} is already there (revoke it first)")
        separator = "" if not existing or existing.endswith("\n") else "\n"
        _write_atomically(file, existing + separator + line + "\n")
        print(f"added key {key_id!r} to {file}", file=sys.stderr)
    print(key)
    return 0


def _revoke(key_id: str, file: Path) -> int:
    lines = file.read_text().splitlines(keepends=True)
    kept = [line for line in lines if line.split("#", 1)[0].split()[:1] != [key_id]]
    if len(kept) == len(lines):
        raise KeyFileError(f"{file}: no key id {key_id!r}")
    parse_key_file("".join(kept), str(file))
    _write_atomically(file, "".join(kept))
    print(f"revoked key {key_id!r} in {file}", file=sys.stderr)
    return 0


def _write_atomically(file: Path, text: str) -> None:
    """Replace `file` with `text` in one rename, so an API reloading it never reads half a file.
    A new file is readable by all (0644): it holds digests only, and a container's user other than
    the file's owner must read it (a compose secret is a bind mount)."""
    mode = file.stat().st_mode & 0o777 if file.exists() else 0o644
    temp = file.with_name(f".{file.name}.{secrets.token_hex(4)}.tmp")
    try:
        temp.write_text(text)
        temp.chmod(mode)
        temp.replace(file)
    finally:
        temp.unlink(missing_ok=True)


if __name__ == "__main__":
    sys.exit(main())
