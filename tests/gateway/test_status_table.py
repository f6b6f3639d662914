import grpc
import pytest

from gateway.errors import EngineFailed, InvalidArgument, NotFound, ResourceExhausted, Unauthenticated, Unavailable
from gateway.status_table import INTERNAL_ERROR_MESSAGE, status_for


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (InvalidArgument("m"), grpc.StatusCode.INVALID_ARGUMENT),
        (NotFound("m"), grpc.StatusCode.NOT_FOUND),
        (Unavailable("m"), grpc.StatusCode.UNAVAILABLE),
        (ResourceExhausted("m"), grpc.StatusCode.RESOURCE_EXHAUSTED),
        (Unauthenticated("m"), grpc.StatusCode.UNAUTHENTICATED),
        (EngineFailed("DEADLINE_EXCEEDED", "m"), grpc.StatusCode.DEADLINE_EXCEEDED),
    ],
)
def test_each_error_has_one_code_and_keeps_its_message(error, code):
    assert status_for(error) == (code, "m")


def test_anything_else_is_internal_without_details():
    assert status_for(KeyError("secret internals")) == (grpc.StatusCode.INTERNAL, INTERNAL_ERROR_MESSAGE)
