"""`python -m bench.front_door`: CPU time per request of the front door (authentication and
rate limits), each case measured with `time.process_time()` over many calls in this process, so
the figure is CPU spent, not wall time, and holds on a busy machine (other processes' load makes
it noisier, not larger, apart from cache effects).

    python -m bench.front_door                 # every case, 20,000 calls each (make bench-front-door)
    python -m bench.front_door --calls 2000    # quicker
    python -m bench.front_door --json          # one JSON object per case

Cases (each a `FrontDoor.check` as the request middleware calls it, with a realistic set of 8
request headers, unless it says otherwise):

- `buckets.take`: one token bucket update alone (the shared table, its `fcntl` lock);
- `rate limit, auth off`: the check keyed by client address (what rate limiting costs a request);
- `rate limit, refused`: the same, over the limit (429);
- `rate limit, 2 processes`: the first case in two forked processes at once on one bucket
  table (contention on the lock), CPU per call in each;
- `api key`, `api key + rate limit`: an API key looked up, then also rate-limited;
- `jwt cached + rate limit`: a token verified before (the cache hit every later request of a
  client makes), then rate-limited;
- `jwt verify (RS256)`: a token never seen before (cache miss: the signature check).

Prints one line per case: microseconds of CPU per call. The budget for rate limiting is 20
microseconds per request (docs/security.md).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from api.config.security import AuthSettings, RateLimitSettings
from api.security.api_keys import key_line, new_key
from api.security.front_door import FrontDoor, Principal, Refusal
from api.security.rate_limit import SharedBuckets

PATH = "/v1/fraud/score"
ISSUER, AUDIENCE = "https://idp.bench/", "bench"


def headers(**extra: str) -> list[tuple[bytes, bytes]]:
    """Eight headers as a client sends them, then `extra`."""
    base = [
        (b"host", b"127.0.0.1:8000"),
        (b"user-agent", b"python-httpx/0.28.1"),
        (b"accept", b"*/*"),
        (b"accept-encoding", b"gzip, deflate"),
        (b"connection", b"keep-alive"),
        (b"content-type", b"application/json"),
        (b"content-length", b"231"),
        (b"x-request-id", b"9b237142e866473086777dd1f069daa3"),
    ]
    return base + [(k.replace("_", "-").encode(), v.encode()) for k, v in extra.items()]


def cpu_per_call_us(call: Callable[[int], object], calls: int) -> float:
    """Microseconds of this process's CPU per `call(i)`, over `calls` calls (after 200 to warm up)."""
    for i in range(200):
        call(i)
    started = time.process_time()
    for i in range(calls):
        call(i)
    return (time.process_time() - started) / calls * 1e6


def _contended(calls: int, queue: multiprocessing.Queue, buckets: SharedBuckets) -> None:
    queue.put(cpu_per_call_us(lambda i: buckets.take(f"addr:10.0.{i % 256}.1".encode(), 1e6, 10**6), calls))


def run(calls: int) -> dict[str, float]:
    """Each case's CPU microseconds per call (see module doc)."""
    folder = Path(tempfile.mkdtemp(prefix="bench-front-door-"))
    key = new_key()
    (folder / "api-keys").write_text(key_line("bench", key, ["fraud:score"]) + "\n")
    private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    (folder / "public.pem").write_bytes(
        private.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )

    def token(sub: str) -> str:
        claims = {"iss": ISSUER, "aud": AUDIENCE, "sub": sub, "exp": int(time.time()) + 3600, "scope": "fraud:score"}
        return jwt.encode(claims, private, algorithm="RS256")

    generous = RateLimitSettings.model_validate({"routes": {PATH: {"rate": 1e6, "burst": 10**6}}})
    stingy = RateLimitSettings.model_validate({"routes": {PATH: {"rate": 1e-6, "burst": 1}}})
    no_limit = RateLimitSettings()
    auth = AuthSettings.model_validate({
        "enabled": True,
        "api_keys_file": folder / "api-keys",
        "jwt": {"public_key_file": folder / "public.pem", "issuer": ISSUER, "audience": AUDIENCE},
        "scopes": {PATH: "fraud:score"},
    })  # fmt: skip
    off = AuthSettings()

    def door(a: AuthSettings, r: RateLimitSettings) -> FrontDoor:
        made = FrontDoor.from_settings(a, r)
        assert made is not None
        return made

    anonymous, refused, keys_only = door(off, generous), door(off, stingy), door(auth, no_limit)
    full = door(auth, generous)
    plain = headers()
    with_key = headers(x_api_key=key)
    bearer = token("svc-cached")
    with_jwt = headers(authorization=f"Bearer {bearer}")
    fresh_tokens = [headers(authorization=f"Bearer {token(f'svc-{i}')}") for i in range(min(calls, 2000) + 200)]
    addresses = [f"10.0.{i // 256 % 256}.{i % 256}" for i in range(4096)]

    checks: dict[str, tuple[Callable[[int], object], type | None]] = {
        "buckets.take": (lambda i: anonymous.rate_limiter.buckets.take(b"addr:10.0.0.1", 1e6, 10**6), None),  # type: ignore[union-attr]
        "rate limit, auth off": (lambda i: anonymous.check(PATH, plain, addresses[i % 4096]), type(None)),
        "rate limit, refused": (lambda i: refused.check(PATH, plain, "10.0.0.1"), Refusal),
        "api key": (lambda i: keys_only.check(PATH, with_key, "10.0.0.1"), Principal),
        "api key + rate limit": (lambda i: full.check(PATH, with_key, "10.0.0.1"), Principal),
        "jwt cached + rate limit": (lambda i: full.check(PATH, with_jwt, "10.0.0.1"), Principal),
    }
    results: dict[str, float] = {}
    for name, (check, expected) in checks.items():
        results[name] = cpu_per_call_us(check, calls)
        outcome = check(0)
        assert expected is None or isinstance(outcome, expected), (name, outcome)  # it measured what it says
    results["jwt verify (RS256)"] = cpu_per_call_us(
        lambda i: keys_only.check(PATH, fresh_tokens[i % len(fresh_tokens)], "10.0.0.1"), min(calls, 2000)
    )
    fork = multiprocessing.get_context("fork")
    queue = fork.Queue()
    shared = SharedBuckets(65536)
    procs = [fork.Process(target=_contended, args=(calls, queue, shared)) for _ in range(2)]
    for p in procs:
        p.start()
    per_process = [queue.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(60)
    results["rate limit, 2 processes"] = max(per_process)
    return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.front_door", description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20_000, help="calls per case")
    parser.add_argument("--json", action="store_true", help="one JSON object per case")
    args = parser.parse_args(argv)
    load1, _, _ = os.getloadavg()
    results = run(args.calls)
    if args.json:
        for name, us in results.items():
            print(json.dumps({"case": name, "cpu_us_per_call": round(us, 3), "calls": args.calls}))
        return 0
    print(f"front door, CPU per call ({args.calls} calls each; load average {load1:.1f} on {os.cpu_count()} CPUs):")
    for name, us in results.items():
        print(f"  {name:<26} {us:8.2f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
