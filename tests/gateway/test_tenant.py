"""The tenant a call's API key binds it to (gateway/tenant.py), and that a client's own tenant
header never travels upstream."""

from __future__ import annotations

from dpgate.tenant import TENANT_KEY, tenant_from_metadata
from gateway.forwarding import CallHeaders
from gateway.http2.header_codec import encode_literal
from gateway.tenant import tenant_fields, tenant_for_key


def test_a_keys_tenant_is_stable_one_way_and_distinct():
    assert tenant_for_key("secret-a") == tenant_for_key("secret-a")
    assert tenant_for_key("secret-a") != tenant_for_key("secret-b")
    assert "secret" not in tenant_for_key("secret-a") and len(tenant_for_key("secret-a")) == 36


def test_isolated_sends_each_keys_tenant_and_shared_sends_none():
    fields = tenant_fields(("a", "b"), "isolated")
    assert fields[b"Bearer a"] == encode_literal(TENANT_KEY.encode(), tenant_for_key("a").encode())
    assert fields[b"Bearer a"] != fields[b"Bearer b"]
    assert tenant_fields(("a", "b"), "shared") == {}


def test_a_clients_tenant_header_is_not_passed_upstream():
    headers = CallHeaders([(b":path", b"/dpgate.v1.InferenceService/Generate"), (TENANT_KEY.encode(), b"forged"),
                           (b"grpc-encoding", b"identity")])  # fmt: skip
    assert b"forged" not in headers.passed and headers.tenant_field == b""


def test_the_engine_reads_the_first_string_value_only():
    assert tenant_from_metadata(((TENANT_KEY, "t1"), ("other", "x"))) == "t1"
    assert tenant_from_metadata((("other", "x"),)) == "" and tenant_from_metadata(None) == ""
