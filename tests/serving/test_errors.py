"""Unit tests for serving.util.errors: the one code -> HTTP table and the one translation table."""

from __future__ import annotations

import pytest

from serving.util.errors import HTTP_STATUS, Code, ServingError, from_exception


def test_http_table_is_tf_servings() -> None:
    assert dict(HTTP_STATUS) == {
        Code.OK: 200,
        Code.CANCELLED: 499,
        Code.UNKNOWN: 500,
        Code.INVALID_ARGUMENT: 400,
        Code.DEADLINE_EXCEEDED: 504,
        Code.NOT_FOUND: 404,
        Code.ALREADY_EXISTS: 409,
        Code.PERMISSION_DENIED: 403,
        Code.RESOURCE_EXHAUSTED: 429,
        Code.FAILED_PRECONDITION: 400,
        Code.ABORTED: 409,
        Code.OUT_OF_RANGE: 400,
        Code.UNIMPLEMENTED: 501,
        Code.INTERNAL: 500,
        Code.UNAVAILABLE: 503,
        Code.DATA_LOSS: 500,
        Code.UNAUTHENTICATED: 401,
    }


def test_codes_are_grpc_canonical_codes() -> None:
    grpc = pytest.importorskip("grpc")
    for code in Code:
        assert grpc.StatusCode[code.name].value[0] == code.value


def test_status_string() -> None:
    error = ServingError(Code.INVALID_ARGUMENT, "bad")
    assert error.status_string() == "INVALID_ARGUMENT: bad"
    assert error.http_status == 400


class _FakeOpError(Exception):
    """Looks like tf.errors.OpError: an int error_code and a message."""

    def __init__(self, error_code: int, message: str) -> None:
        super().__init__(message)
        self.error_code = error_code
        self.message = message


@pytest.mark.parametrize(
    ("exc", "code", "message"),
    [
        (ServingError(Code.NOT_FOUND, "x"), Code.NOT_FOUND, "x"),
        (_FakeOpError(3, "In[0] is not a matrix"), Code.INVALID_ARGUMENT, "In[0] is not a matrix"),
        (_FakeOpError(4, "Timed out"), Code.DEADLINE_EXCEEDED, "Timed out"),
        (_FakeOpError(99, "odd"), Code.UNKNOWN, "odd"),
        (FileNotFoundError("no file"), Code.NOT_FOUND, "no file"),
        (ValueError("boom"), Code.UNKNOWN, "boom"),
    ],
)
def test_from_exception(exc: BaseException, code: Code, message: str) -> None:
    error = from_exception(exc)
    assert (error.code, error.message) == (code, message)
