"""`canonical_codes.Code`, the one enum of status codes both tiers use, against the generated
descriptors it stands for: the API's `error_codes_pb2` (`make protos`), TensorFlow's own and
gRPC's `StatusCode`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import grpc

import api.serving_client
import serving.util.errors
from api.protos.xla.tsl.protobuf import error_codes_pb2
from canonical_codes import Code

REPO = Path(__file__).resolve().parent.parent


def members() -> dict[str, int]:
    return {code.name: code.value for code in Code}


def test_the_codes_are_the_api_protos_enum() -> None:
    assert members() == dict(error_codes_pb2.Code.items())


def test_the_codes_are_tensorflows_enum() -> None:
    # TensorFlow's generated module (it imports TensorFlow: a test may, the API may not).
    from tensorflow.core.protobuf import error_codes_pb2 as tensorflow_error_codes

    # Less its sentinel (20, `DO_NOT_USE_RESERVED_FOR_FUTURE_EXPANSION_...`): not a status anyone sends.
    codes = {name: value for name, value in tensorflow_error_codes.Code.items() if not name.startswith("DO_NOT_USE")}
    assert members() == codes


def test_the_codes_are_grpcs_status_codes() -> None:
    assert members() == {status.name: status.value[0] for status in grpc.StatusCode}


def test_both_tiers_use_this_one_enum() -> None:
    assert api.serving_client.Code is Code
    assert serving.util.errors.Code is Code


def test_the_shared_module_is_stdlib_only() -> None:
    """Both tiers import it, and neither may import the other: it pulls in only the standard library."""
    code = (
        "import sys; before = set(sys.modules); import canonical_codes; "
        "print(sorted({m.split('.')[0] for m in set(sys.modules) - before} - set(sys.stdlib_module_names)))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.strip() == "['canonical_codes']"
