"""Rollouts over real processes: the API (under gunicorn with two workers for the canary and its
rollback, one uvicorn process otherwise) in front of serving replicas.

- a canary's split over 10,000 users is within 1.5 points of its weight, and a user never
  switches arm while the weight holds;
- a rollback to 0 % through the rollout file is in force on every worker within 1 s, under
  load, with no failed request;
- a shadow that is missing, failing or hung never changes a primary answer or its status;
- a replica that does not have the target version AVAILABLE (still loading it, or unloaded
  it) is never sent it, over REST and gRPC;
- labels against our TF-Serving-compatible server (`version_labels` in models.config): the
  rollout's targets by label over REST (`/labels/L`) and gRPC (`version_label`), pinning a
  label, the arm in the access log and each target in `/readyz`.

Serving here is `tests.api.fake_serving` (TF Serving's REST and gRPC APIs, with versions and
states it can be told to change, and per-version counts), except for the labels, which run on
`python -m serving` with two versions of the fraud export.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from examples.fraud.features import extract_features
from examples.fraud.schemas import Transaction
from tests.api.fake_serving import fake_score
from tests.api.stack import FakeServing, launch_fake, start_api_process, transactions, wait_ready
from tests.support import REPO, Process, free_port, http_ok, start_gunicorn, wait_until
from tools.processes import Serving, start_serving
from tools.rollout_demo import Connection

FRAUD_ROUTE = "examples.fraud.route:route"
SCORE = "/v1/fraud/score"


@dataclass
class Answer:
    """One request: when it was sent (wall clock), how it was answered."""

    sent_at: float
    status: int
    arm: str | None
    version: int | None
    user: str
    score: float | None
    elapsed_s: float


def send(
    url: str,
    bodies: Sequence[dict[str, Any]],
    *,
    concurrency: int = 16,
    stop: threading.Event | None = None,
    headers: dict[str, str] | None = None,
    max_seconds: float = 300.0,
    into: list[Answer] | None = None,
) -> list[Answer]:
    """POST each body (cycling through them until `stop` is set, when given), on `concurrency`
    connections; every answer with its arm and version, appended to `into` (when given) as it
    comes. Bounded in count (the bodies, or until `stop`) and time (`max_seconds`; each request
    10 s), loopback only."""
    answers: list[Answer] = into if into is not None else []
    limit = time.monotonic() + max_seconds
    encoded = [(b["user_id"], json.dumps(b).encode()) for b in bodies]

    async def caller(queue: list[tuple[str, bytes]]) -> None:
        connection = await Connection.open(url)
        i = 0
        try:
            while time.monotonic() < limit:
                if stop is None:
                    if not queue:
                        return
                    user, body = queue.pop()
                else:
                    if stop.is_set():
                        return
                    user, body = encoded[i % len(encoded)]
                    i += 1
                sent, began = time.time(), time.monotonic()
                async with asyncio.timeout(10):
                    status, answer, raw = await connection.post(SCORE, body, headers or {})
                payload = json.loads(raw) if status == 200 else {}
                answers.append(
                    Answer(
                        sent, status, answer.get("x-model-arm"), payload.get("model", {}).get("version"),
                        user, payload.get("fraud_score"), time.monotonic() - began,
                    )
                )  # fmt: skip
        finally:
            connection.close()

    async def main() -> None:
        queue = list(reversed(encoded))
        await asyncio.gather(*(caller(queue) for _ in range(concurrency)))

    asyncio.run(main())
    return answers


def distinct_users(n: int, seed: int = 11) -> list[dict[str, Any]]:
    """n transactions, each from its own user."""
    bodies = transactions(n, seed=seed)
    for i, body in enumerate(bodies):
        body["user_id"] = f"user-{seed}-{i}"
    return bodies


def write_rollouts(path: Path, rollouts: dict[str, Any]) -> float:
    """Replace the rollout file atomically (write, then rename over it); the time it was done."""
    staged = path.with_suffix(".staged")
    staged.write_text(json.dumps(rollouts))
    staged.replace(path)
    return time.time()


def applied(proc: Process, text: str) -> dict[int, float]:
    """Worker pid -> when it logged putting a rollout containing `text` in force (wall clock)."""
    found: dict[int, float] = {}
    for line in proc.log(None).splitlines():
        if line.startswith("{") and '"rollout of route' in line and text in line:
            record = json.loads(line)
            found[record["worker_pid"]] = datetime.fromisoformat(record["ts"].replace("Z", "+00:00")).timestamp()
    return found


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[FakeServing]:
    versions = '--versions={"fraud": {"1": "AVAILABLE", "2": "AVAILABLE"}}'
    serving = launch_fake(tmp_path, "serving", None, 0, "--models=fraud", versions)
    wait_ready(serving)
    yield serving
    serving.proc.stop()


def gunicorn_api(tmp_path: Path, name: str, workers: int, **env: str) -> tuple[Process, str]:
    port = free_port()
    proc = start_gunicorn(
        tmp_path / f"{name}.log",
        API_BIND=f"127.0.0.1:{port}",
        WEB_CONCURRENCY=str(workers),
        MODEL_ROUTES=FRAUD_ROUTE,
        EVENTS_JSONL_PATH=str(tmp_path / f"{name}-events.jsonl"),
        ACCESS_LOG="false",
        **env,
    )
    url = f"http://127.0.0.1:{port}"
    proc.wait_ready(lambda: http_ok(url + "/readyz"), 90, "/readyz")
    return proc, url


def test_a_canary_splits_by_user_sticks_and_rolls_back_within_a_second_on_every_worker(
    tmp_path: Path, fake: FakeServing
) -> None:
    rollouts = tmp_path / "rollouts.json"
    write_rollouts(rollouts, {"fraud": {"stable": 1, "canary": 2, "canary_weight": 10}})
    api, url = gunicorn_api(tmp_path, "api", 2, SERVING_URL=fake.url, ROLLOUTS__FILE=str(rollouts))
    try:
        users = distinct_users(10_000)
        answers = send(url, users)
        assert Counter(a.status for a in answers) == {200: 10_000}
        arms = {a.user: (a.arm, a.version) for a in answers}
        assert set(arms.values()) == {("stable", 1), ("canary", 2)}
        share = 100 * sum(arm == "canary" for arm, _ in arms.values()) / len(arms)
        assert abs(share - 10) <= 1.5, share
        # The version's answer, not only its label: fake serving's score shifts with the version.
        by_user = {u["user_id"]: u for u in users}
        for a in answers[:200]:
            assert a.score == pytest.approx(expected(by_user[a.user], a.version), rel=1e-6)

        # Sticky: the same users again, on both workers, with the weight unchanged.
        again = send(url, users[:2_000] * 2)
        assert all(a.status == 200 and (a.arm, a.version) == arms[a.user] for a in again)

        # Rollback under load: every worker has it within 1 s; nothing fails meanwhile.
        stop = threading.Event()
        during: list[Answer] = []
        load = threading.Thread(target=send, args=(url, users), kwargs={"concurrency": 8, "stop": stop, "into": during})
        load.start()
        try:
            # Under way, with the canary serving some of it (10 % of users): then roll back.
            wait_until(lambda: any(a.arm == "canary" for a in during) or not load.is_alive(), 30, "canary answers")
            rolled_back = write_rollouts(rollouts, {"fraud": {"stable": 1, "canary": 2, "canary_weight": 0}})
            wait_until(lambda: len(applied(api, "at 0%")) == 2, 30, "both workers to apply the rollback")
            done = applied(api, "at 0%")
            wait_until(lambda: any(a.sent_at > rolled_back + 1.5 for a in during), 30, "load after the rollback")
        finally:
            stop.set()
            load.join(30)
        assert all(ts - rolled_back <= 1.0 for ts in done.values()), (done, rolled_back)
        assert Counter(a.status for a in during) == {200: len(during)}
        late = [a for a in during if a.sent_at > rolled_back + 1.0]
        assert late and {(a.arm, a.version) for a in late} == {("stable", 1)}
        assert any(a.arm == "canary" for a in during if a.sent_at < rolled_back)
    finally:
        api.stop()


def expected(body: dict[str, Any], version: int | None) -> float:
    """What fake serving answers for `body` at `version` (the features as REST sends them)."""
    return fake_score(extract_features(Transaction.model_validate(body)), version or 1)


def access_lines(proc: Process) -> list[dict[str, Any]]:
    """The `api.access` lines of an API process's log (JSON)."""
    lines = [json.loads(line) for line in proc.log(None).splitlines() if line.startswith("{")]
    return [line for line in lines if line.get("logger") == "api.access"]


def metric(url: str, name: str, **labels: str) -> float:
    """The sum of the API's `name` samples whose labels include `labels` (0 when none)."""
    text = httpx.get(url + "/metrics", timeout=5).text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())
    )


def test_a_missing_failing_or_hung_shadow_never_changes_a_primary_answer_or_its_status(tmp_path: Path) -> None:
    models = "--models=fraud,fraud_twin,fraud_failing,fraud_hung"
    serving = launch_fake(tmp_path, "serving", None, 0, models, "--error-models=fraud_failing")
    wait_ready(serving)
    rollouts = tmp_path / "rollouts.json"
    write_rollouts(rollouts, {"fraud": {"stable": 1}})
    api = start_api_process(tmp_path, "api", serving.url, MODEL_ROUTES=FRAUD_ROUTE, ROLLOUTS__FILE=str(rollouts))
    users = distinct_users(300, seed=5)
    try:
        baseline = {a.user: (a.status, a.arm, a.version, a.score) for a in send(api.url, users)}
        assert {status for status, *_ in baseline.values()} == {200}

        httpx.post(serving.url + "/_fake/hold", params={"model": "fraud_hung"}, timeout=5).raise_for_status()
        for shadow, outcomes in (
            ("fraud_twin:latest", ("compared",)),  # a working shadow, so the others are not vacuous
            ("fraud_missing:latest", ("failed",)),
            ("fraud_failing:latest", ("failed",)),
            ("fraud_hung:latest", ("failed", "dropped_deadline", "dropped_queue_full", "dropped_saturated")),
        ):

            def counted(outcomes: tuple[str, ...] = outcomes) -> float:
                return sum(metric(api.url, "api_shadow_requests_total", route="fraud", outcome=o) for o in outcomes)

            before = counted()
            text = f"shadow {shadow}"
            write_rollouts(rollouts, {"fraud": {"stable": 1, "shadow": shadow, "shadow_rate": 100}})
            wait_until(lambda text=text: bool(applied(api.proc, text)), 30, f"{text} applied")
            answers = send(api.url, users)
            got = {a.user: (a.status, a.arm, a.version, a.score) for a in answers}
            assert got == baseline, shadow
            wait_until(lambda counted=counted, before=before: counted() > before, 30, f"{text}: {outcomes} counted")
        assert metric(api.url, "api_shadow_difference_count", route="fraud", primary="fraud:1", shadow="fraud_twin:1")
        assert serving.stats()["ran"].get("fraud_hung:1", 0) == 0  # held: it never answered
    finally:
        api.proc.stop()
        serving.proc.stop()


@pytest.mark.parametrize("protocol", ["rest", "grpc"])
def test_a_replica_is_never_sent_a_version_it_does_not_have_available(tmp_path: Path, protocol: str) -> None:
    """Two replicas, one still loading v2, then the other way round (v2 AVAILABLE, v1 gone)."""
    both = '--versions={"fraud": {"1": "AVAILABLE", "2": "AVAILABLE"}}'
    loading = '--versions={"fraud": {"1": "AVAILABLE", "2": "LOADING"}}'
    grpc_ports = (free_port(), free_port()) if protocol == "grpc" else (0, 0)
    ready = launch_fake(tmp_path, "ready", None, grpc_ports[0], "--models=fraud", both)
    late = launch_fake(tmp_path, "late", None, grpc_ports[1], "--models=fraud", loading)
    wait_ready(ready, late)
    replicas = {"SERVING_URLS": f"{ready.url},{late.url}"}
    if protocol == "grpc":
        replicas = {"SERVING_GRPC_TARGETS": ",".join(f"127.0.0.1:{p}" for p in grpc_ports)}
    api = start_api_process(
        tmp_path,
        "api",
        ready.url,
        MODEL_ROUTES=FRAUD_ROUTE,
        SERVING_PROTOCOL=protocol,
        MODEL_VERSION_TTL_S="0.25",
        MODELS__FRAUD__ROLLOUT__STABLE="1",
        MODELS__FRAUD__ROLLOUT__CANARY="2",
        MODELS__FRAUD__ROLLOUT__CANARY_WEIGHT="50",
        **replicas,
    )
    users = distinct_users(400, seed=3)
    try:
        answers = send(api.url, users)
        assert Counter(a.status for a in answers) == {200: 400}
        assert {(a.arm, a.version) for a in answers} == {("stable", 1), ("canary", 2)}
        assert late.stats()["ran"].get("fraud:2", 0) == 0  # still loading: never sent v2
        assert late.stats()["ran"].get("fraud:1", 0) > 0  # but it does serve v1
        assert ready.stats()["ran"].get("fraud:2", 0) > 0  # predicts (coalesced), not rows: all v2 went here

        # The late replica finishes v2 and unloads v1: it gets v2, and is never sent v1 again.
        gone = {"fraud": {"2": "AVAILABLE", "1": "END"}}
        httpx.post(late.url + "/_fake/versions", json=gone, timeout=5).raise_for_status()

        def late_serves_v2() -> bool:
            answers = send(api.url, users[:20])  # load, so the tracker's news reaches calls
            assert Counter(a.status for a in answers) == {200: 20}
            return bool(late.stats()["ran"].get("fraud:2", 0) > 0)

        wait_until(late_serves_v2, 30, "the late replica to be sent v2")
        v1_before = late.stats()["ran"].get("fraud:1", 0)
        answers = send(api.url, users)
        assert Counter(a.status for a in answers) == {200: 400}
        assert {(a.arm, a.version) for a in answers} == {("stable", 1), ("canary", 2)}
        assert late.stats()["ran"].get("fraud:1", 0) == v1_before
    finally:
        api.proc.stop()
        ready.proc.stop()
        late.proc.stop()


def two_version_fraud_serving(tmp_path: Path) -> Serving:
    """`python -m serving` with fraud versions 1 and 2 (2: a copy of the committed export) and
    TF Serving's `version_labels` stable -> 1, canary -> 2, both versions served."""
    models = tmp_path / "models"
    for version in ("1", "2"):
        shutil.copytree(REPO / "models" / "fraud" / "1", models / "fraud" / version)
    config = tmp_path / "models.config"
    config.write_text(
        'model_config_list { config { name: "fraud" base_path: "%s" model_platform: "tensorflow"\n'
        "  model_version_policy { all {} }\n"
        '  version_labels { key: "stable" value: 1 } version_labels { key: "canary" value: 2 } } }\n'
        % (models / "fraud")
    )
    # The labels name versions that are not loaded yet at start-up: TF Serving refuses such a
    # config unless told to allow it (server_core.cc), and so does ours.
    serving = start_serving(
        tmp_path / "serving.log", model_config_file=config, allow_version_labels_for_unavailable_models=True
    )
    serving.wait_for_states("fraud", {1: "AVAILABLE", 2: "AVAILABLE"})
    return serving


def test_labels_route_a_canary_on_our_tf_serving_compatible_server_over_rest_and_grpc(tmp_path: Path) -> None:
    serving = two_version_fraud_serving(tmp_path)
    users = distinct_users(300, seed=9)
    try:
        for protocol in ("rest", "grpc"):
            api = start_api_process(
                tmp_path,
                f"api-{protocol}",
                serving.rest_url,
                MODEL_ROUTES=FRAUD_ROUTE,
                SERVING_PROTOCOL=protocol,
                SERVING_GRPC_TARGETS=serving.grpc_target,
                MODELS__FRAUD__ROLLOUT__STABLE="stable",
                MODELS__FRAUD__ROLLOUT__CANARY="canary",
                MODELS__FRAUD__ROLLOUT__CANARY_WEIGHT="30",
                MODELS__FRAUD__ROLLOUT__ALLOW_PINNING="true",
                ACCESS_LOG="true",
            )
            try:
                targets = httpx.get(api.url + "/readyz", timeout=5).json()["models"]["fraud"]["rollout"]
                assert {arm: (t["target"], t["version"]) for arm, t in targets.items()} == {
                    "stable": ("fraud:stable", 1),
                    "canary": ("fraud:canary", 2),
                }, targets
                answers = send(api.url, users)
                assert Counter(a.status for a in answers) == {200: 300}, protocol
                assert {(a.arm, a.version) for a in answers} == {("stable", 1), ("canary", 2)}, protocol
                # A client may pin a label (the rollout allows it); an unknown one is refused, 4xx.
                pinned = send(api.url, users[:5], headers={"X-Model-Label": "canary"})
                assert {(a.status, a.arm, a.version) for a in pinned} == {(200, "pinned", 2)}, protocol
                unknown = send(api.url, users[:2], headers={"X-Model-Label": "nope"})
                assert all(400 <= a.status < 500 for a in unknown), (protocol, unknown)
                # The access log names the arm and the version of each answer.
                logged = Counter(
                    (line["arm"], line["model_version"])
                    for line in access_lines(api.proc)
                    if line.get("path") == SCORE and line.get("status") == 200
                )
                assert logged == Counter((a.arm, a.version) for a in answers + pinned), protocol
            finally:
                api.proc.stop()
    finally:
        serving.process.stop()
