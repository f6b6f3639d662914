"""Secrets from the environment: DPGATE_API_KEYS and DPGATE_TLS_KEY_PASSWORD.

The API keys are tested end to end: a real gateway process, configured by a `--config` file and
given its keys only in its environment, refuses a call without a key and never logs the key.
The TLS key password is tested where it is used: the config check at start and the TLS context.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import grpc
import pytest

from gateway.config import ConfigError, GatewayConfig, api_keys_from_environment, validate_config
from gateway.forwarding import UNAUTHENTICATED_MESSAGE
from gateway.front_door import tls_context
from tests.gateway.tls_files import make_ca, make_signed
from tests.support.gateway_processes import (
    FAST_HEALTH,
    GatewayProcess,
    generate_request,
    inference_stub,
    running_synthetic_engine,
)
from tests.support.health import poll_until_serving

KEY = "env-key-7f3a"


@pytest.mark.e2e
def test_api_keys_from_the_environment_end_to_end(tmp_path: Path, log_dir: Path, monkeypatch) -> None:
    config = tmp_path / "gateway.toml"
    config.write_text("max-message-bytes = 2048\nlog-json = true\n")
    monkeypatch.setenv("DPGATE_API_KEYS", f"other-key\n{KEY}")
    with running_synthetic_engine(log_dir) as engine:
        gateway = GatewayProcess(
            [engine.address], *FAST_HEALTH, "--config", str(config), log_dir=log_dir, name="gateway-env-keys"
        )
        try:
            assert KEY not in " ".join(gateway.process.args)
            with grpc.insecure_channel(gateway.address) as channel:
                poll_until_serving(channel)  # health needs no key
                stub = inference_stub(channel)
                with pytest.raises(grpc.RpcError) as refused:
                    stub.Generate(generate_request(1), timeout=5, wait_for_ready=True)
                assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
                assert refused.value.details() == UNAUTHENTICATED_MESSAGE
                authorized = [("authorization", f"Bearer {KEY}")]
                assert stub.Generate(generate_request(1), metadata=authorized, timeout=10, wait_for_ready=True).text
                # The file's limit is in force in the same process.
                with pytest.raises(grpc.RpcError) as too_big:
                    stub.Generate(generate_request(1, text="x" * 4096), metadata=authorized, timeout=5)
                assert too_big.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        finally:
            gateway.stop()
    assert KEY not in gateway.log_path.read_text()


def test_api_keys_are_whitespace_separated_and_an_empty_value_is_refused() -> None:
    assert api_keys_from_environment({}) == ()
    assert api_keys_from_environment({"DPGATE_API_KEYS": " a,b \n c\td "}) == ("a,b", "c", "d")
    with pytest.raises(ConfigError, match=r"^DPGATE_API_KEYS is set but holds no key\.$"):
        api_keys_from_environment({"DPGATE_API_KEYS": ""})
    with pytest.raises(ConfigError, match=r"^DPGATE_API_KEYS must hold printable ASCII keys"):
        api_keys_from_environment({"DPGATE_API_KEYS": "k\u00e9y"})


def test_secrets_stay_out_of_the_config_repr() -> None:
    config = GatewayConfig(engines=("127.0.0.1:1",), api_keys=(KEY,), tls_key_password="hunter2")
    assert KEY not in repr(config) and "hunter2" not in repr(config)


@pytest.fixture(scope="module")
def encrypted_pair(tmp_path_factory: pytest.TempPathFactory):
    directory = tmp_path_factory.mktemp("tls-password")
    pair = make_signed(directory, "server", make_ca(directory, "ca"), "serverAuth")
    encrypted = directory / "server-encrypted.key"
    subprocess.run(
        ["openssl", "pkey", "-in", str(pair.key), "-out", str(encrypted), "-aes256", "-passout", "pass:s3cret"],
        check=True,
        capture_output=True,
        timeout=60,
    )
    assert b"ENCRYPTED" in encrypted.read_bytes()
    return pair.cert, encrypted


def tls_config(cert: Path, key: Path, password: str | None) -> GatewayConfig:
    return GatewayConfig(
        engines=("127.0.0.1:50061",), tls_cert_file=str(cert), tls_key_file=str(key), tls_key_password=password
    )


@pytest.mark.e2e
def test_an_encrypted_tls_key_loads_with_its_password(encrypted_pair) -> None:
    cert, key = encrypted_pair
    assert tls_context(validate_config(tls_config(cert, key, "s3cret"))) is not None


@pytest.mark.parametrize(
    ("password", "sentence"),
    [
        (None, "--tls-key {key!r} is encrypted: give its password in DPGATE_TLS_KEY_PASSWORD."),
        (
            "wrong",
            "--tls-key {key!r} does not load with --tls-cert {cert!r}: a wrong DPGATE_TLS_KEY_PASSWORD, "
            "or a key of another certificate.",
        ),
    ],
)
@pytest.mark.e2e  # makes its keys with openssl
def test_an_encrypted_tls_key_without_its_password_is_refused_at_start(encrypted_pair, password, sentence) -> None:
    cert, key = encrypted_pair
    with pytest.raises(ConfigError) as error:
        validate_config(tls_config(cert, key, password))
    assert str(error.value) == sentence.format(key=str(key), cert=str(cert))
