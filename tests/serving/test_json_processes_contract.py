"""Large REST bodies get the same answers and errors whether the JSON worker processes decode them
or the request threads do: ``python -m serving`` with ``--rest_api_num_json_processes=1`` and
``=0``, each request sent to both and the answers compared byte for byte.

Every body here is at least :data:`~serving.model_servers.http_rest_api_handler.CODEC_OFFLOAD_BODY_BYTES`
(so it is offloaded where workers run), and the valid ones have answers of at least
:data:`~serving.model_servers.http_rest_api_handler.CODEC_OFFLOAD_OUTPUT_ELEMENTS` elements (encoded
there too). Each case also states the status and a piece of the message it must get, so that two
servers agreeing on a wrong answer fail too. Small bodies on the event loop against the same
codec on another executor are compared in ``tests/serving/test_rest.py``.

Two real servers on 127.0.0.1 for the module; about 20 requests each, none over 1 MiB.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass

import orjson
import pytest

from serving.model_servers import flags, http_server
from serving.model_servers.http_rest_api_handler import CODEC_OFFLOAD_BODY_BYTES, CODEC_OFFLOAD_OUTPUT_ELEMENTS
from tests.serving.example_server import DIGIT_IMAGE, FRAUD_ROW, ExampleServer, running_example_server
from tests.support import children_running

MAX_BODY_BYTES = 1 << 20
MAX_ELEMENTS = 11 * 6_000  # 6,000 fraud rows
ROWS = 5_000  # answers of 5,000 fraud scores: encoded in the worker too
IMAGES = 500  # answers of 500 x 10 digit probabilities
TIMEOUT_S = 60.0
FRAUD = "/v1/models/fraud"
DIGITS = "/v1/models/digits"


@dataclass(frozen=True)
class Servers:
    in_workers: ExampleServer  # --rest_api_num_json_processes=1
    in_threads: ExampleServer  # --rest_api_num_json_processes=0


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    limits = {"rest_api_max_body_bytes": MAX_BODY_BYTES, "max_request_elements": MAX_ELEMENTS}
    with (
        running_example_server(tmp_path_factory.mktemp("workers"), **limits, rest_api_num_json_processes=1) as one,
        running_example_server(tmp_path_factory.mktemp("threads"), **limits, rest_api_num_json_processes=0) as zero,
    ):
        assert len(json_workers(one)) == 1 and json_workers(zero) == set()
        yield Servers(in_workers=one, in_threads=zero)


def json_workers(server: ExampleServer) -> set[int]:
    """The server's child processes that run the JSON worker module."""
    return children_running(server.pid, "serving.util.process_executor")


def rows(count: int) -> list[list[float]]:
    """``count`` fraud rows, each a little different (so that no two answers are alike)."""
    return [[value + index / 1000 for value in FRAUD_ROW] for index in range(count)]


def body(doc: object, *, tail: bytes = b"") -> bytes:
    """``doc`` as JSON, ``tail`` spliced in before its closing brace (for what JSON cannot say)."""
    data = orjson.dumps(doc)
    if tail:
        data = data[:-1] + tail + b"}"
    return data


def deep(depth: int) -> bytes:
    """A JSON array nested ``depth`` deep around one number."""
    return b"[" * depth + b"1" + b"]" * depth


@dataclass(frozen=True)
class Case:
    path: str
    body: bytes
    status: int
    says: str  # a piece of the answer: the response key, or the error's message

    def __repr__(self) -> str:  # the test id
        return f"{self.path} {len(self.body)} bytes -> {self.status}"


CASES = {
    "row format": Case(f"{FRAUD}:predict", body({"instances": rows(ROWS)}), 200, '{"predictions":[['),
    "columnar format": Case(f"{FRAUD}:predict", body({"inputs": rows(ROWS)}), 200, '{"outputs":[['),
    "columnar, named input": Case(
        f"{FRAUD}:predict", body({"inputs": {"features": rows(ROWS)}}), 200, '{"outputs":[['
    ),
    "rank-4 input, 10 outputs per row": Case(
        f"{DIGITS}:predict", body({"instances": [DIGIT_IMAGE] * IMAGES}), 200, '{"predictions":[['
    ),
    "named signature, version in the path": Case(
        f"{FRAUD}/versions/1:predict",
        body({"signature_name": "serving_default", "instances": rows(ROWS)}),
        200,
        '{"predictions":[[',
    ),
    "deep nesting under a key nobody reads": Case(
        f"{FRAUD}:predict", body({"instances": rows(ROWS)}, tail=b', "x": ' + deep(100_000)), 200, '{"predictions":'
    ),
    "bad dtype in the last row": Case(
        f"{FRAUD}:predict",
        body({"instances": [*rows(2_000), [*FRAUD_ROW[:-1], "a"]]}),
        400,
        'JSON Value: "a" Type: String is not of expected type: float',
    ),
    "ragged rows": Case(
        f"{FRAUD}:predict",
        body({"instances": [*rows(2_000), FRAUD_ROW[:-1]]}),
        400,
        "Expecting tensor size: 11 but got: 10",
    ),
    "missing named input": Case(
        f"{FRAUD}:predict", body({"inputs": {"wrong": rows(ROWS)}}), 400, "Missing named input: features"
    ),
    "unknown input in a row object": Case(
        f"{FRAUD}:predict",
        body({"instances": [{"wrong": row} for row in rows(2_000)]}),
        400,
        "does not have named input: wrong",
    ),
    "both instances and inputs": Case(
        f"{FRAUD}:predict",
        body({"instances": rows(2_000), "inputs": rows(1)}),
        400,
        "expecting only one of 'inputs' or 'instances'",
    ),
    "unknown signature": Case(
        f"{FRAUD}:predict",
        body({"signature_name": "nope", "instances": rows(2_000)}),
        400,
        'Serving signature name: "nope" not found in signature def',
    ),
    "signature name not a string": Case(
        f"{FRAUD}:predict", body({"signature_name": 7, "instances": rows(2_000)}), 400, "must be a string value"
    ),
    "unknown model (the body is parsed first)": Case(
        "/v1/models/nope:predict", body({"instances": rows(2_000)}), 404, "Servable not found for request"
    ),
    "unknown version": Case(
        f"{FRAUD}/versions/9:predict", body({"instances": rows(2_000)}), 404, "Servable not found for request"
    ),
    "too deep for a tensor": Case(
        f"{FRAUD}:predict", b'{"instances": ' + deep(100_000) + b"}", 400, "Too many dimensions in tensor",
    ),
    "malformed JSON": Case(f"{FRAUD}:predict", body({"instances": rows(2_000)})[:-3], 400, "JSON Parse error"),
    "not UTF-8 in a string": Case(
        f"{FRAUD}:predict",
        body({"instances": rows(2_000)}).replace(b"[120.0,", b'["\xff\xfe",', 1),
        400,
        "is not of expected type: float",
    ),
    "not UTF-8 in the signature name": Case(
        f"{FRAUD}:predict",
        body({"signature_name": "X", "instances": rows(2_000)}).replace(b'"X"', b'"\xff\xfe"'),
        400,
        "not found in signature def",
    ),
    "not UTF-8 outside a string": Case(
        f"{FRAUD}:predict", body({"instances": rows(2_000)}).replace(b"[120.0,", b"[\xff,", 1), 400, "JSON Parse error"
    ),
    "more elements than --max_request_elements": Case(
        f"{FRAUD}:predict", body({"instances": rows(MAX_ELEMENTS // 11 + 1)}), 413, "elements"
    ),
    "body over --rest_api_max_body_bytes": Case(
        f"{FRAUD}:predict", body({"instances": rows(20_000)}), 413, "body"
    ),
    "classify without a classify signature": Case(
        f"{FRAUD}:classify",
        body({"examples": [{"features": row} for row in rows(1_000)]}),
        400,
        "No classification inputs found in SignatureDef",
    ),
    "regress, an example that is not an object": Case(
        f"{FRAUD}:regress", body({"examples": [*({"x": 1.0} for _ in range(8_000)), [1]]}), 400,
        "Example must be JSON object but got JSON Array",
    ),
}


def test_the_bodies_are_large_and_the_answers_too() -> None:
    for name, case in CASES.items():
        assert len(case.body) >= CODEC_OFFLOAD_BODY_BYTES, name
    assert ROWS >= CODEC_OFFLOAD_OUTPUT_ELEMENTS and IMAGES * 10 >= CODEC_OFFLOAD_OUTPUT_ELEMENTS
    assert len(CASES["body over --rest_api_max_body_bytes"].body) > MAX_BODY_BYTES


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_a_large_body_gets_the_same_answer_from_the_workers_and_the_threads(servers: Servers, case: Case) -> None:
    answers = [
        server.rest.post(case.path, content=case.body, headers={"content-type": "application/json"}, timeout=TIMEOUT_S)
        for server in (servers.in_workers, servers.in_threads)
    ]
    in_workers, in_threads = answers
    assert (in_workers.status_code, in_workers.content) == (in_threads.status_code, in_threads.content)
    assert in_workers.status_code == case.status, in_workers.text[:500]
    if case.status == 200:
        assert in_workers.text.startswith(case.says), in_workers.text[:500]
    else:
        error = json.loads(in_workers.content)
        assert set(error) == {"error"} and case.says in error["error"], error  # TF Serving's error body


def test_a_chunked_body_over_the_limit_is_refused_alike(servers: Servers) -> None:
    # No Content-Length: the limit is hit while the body arrives.
    chunk = b" " * (64 << 10)
    answers = []
    for server in (servers.in_workers, servers.in_threads):
        chunks = iter([b'{"instances": [' + orjson.dumps(FRAUD_ROW) + b"]"] + [chunk] * 20 + [b"}"])
        answers.append(server.rest.post(f"{FRAUD}:predict", content=chunks, timeout=TIMEOUT_S))
    in_workers, in_threads = answers
    assert (in_workers.status_code, in_workers.content) == (in_threads.status_code, in_threads.content)
    assert in_workers.status_code == 413, in_workers.text


def test_help_states_what_the_server_does() -> None:
    text = " ".join(flags._build_parser().format_help().split())
    described = text[text.index("--rest_api_num_json_processes REST_API_NUM_JSON_PROCESSES") :]
    assert f"request bodies of {CODEC_OFFLOAD_BODY_BYTES >> 10} KiB and more" in described
    assert f"answers of {CODEC_OFFLOAD_OUTPUT_ELEMENTS:,} output elements and more" in described
    assert f"{http_server.JSON_QUEUE} more such requests may wait, then 503" in described
    with pytest.raises(flags.FlagError, match="--rest_api_num_json_processes must be >= 0"):
        flags.parse_flags(["--model_base_path=/m", "--rest_api_num_json_processes=-1"])
