"""TLS parts without a broker: the clients' context, the front's context, the one-line messages."""

from __future__ import annotations

import os
import ssl
import subprocess
import sys
from pathlib import Path

import pytest
from tlscerts import Pki, make_pki

from aip.authfront import AuthFront, TlsFileError, server_context
from aip.broker import BrokerError, EmbeddedBroker, free_port
from config import Settings
from transport import BrokerUnavailable, kafka_config
from transport.tls import TlsSettingsError, client_context, handshake_error

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def tls(**kw: object) -> Settings:
    return Settings(security_protocol="SSL", **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("check", [True, False])
def test_the_client_context_verifies_the_chain_with_or_without_the_host_name_check(pki: Pki, check: bool) -> None:
    context = client_context(tls(ssl_cafile=pki.ca, ssl_check_hostname=check))
    assert context.check_hostname is check
    assert context.verify_mode == ssl.CERT_REQUIRED  # unlike a probe that turned verification off with the check
    assert context.minimum_version >= ssl.TLSVersion.TLSv1_2
    assert context.cert_store_stats()["x509_ca"] == 1


def test_bad_tls_files_name_the_setting(pki: Pki, tmp_path: Path) -> None:
    with pytest.raises(TlsSettingsError, match=r"^AIP_SSL_CAFILE .*no-such\.pem: No such file"):
        client_context(tls(ssl_cafile=str(tmp_path / "no-such.pem")))
    not_pem = tmp_path / "not.pem"
    not_pem.write_text("hello")
    with pytest.raises(TlsSettingsError, match=r"^AIP_SSL_CAFILE"):
        client_context(tls(ssl_cafile=str(not_pem)))
    with pytest.raises(TlsSettingsError, match=r"^AIP_SSL_CERTFILE .*KEY_VALUES_MISMATCH"):
        client_context(tls(ssl_cafile=pki.ca, ssl_certfile=pki.client.cert, ssl_keyfile=pki.server.key))
    with pytest.raises(TlsSettingsError, match="AIP_SSL_KEYFILE is set without AIP_SSL_CERTFILE"):
        client_context(tls(ssl_cafile=pki.ca, ssl_keyfile=pki.client.key))
    with pytest.raises(BrokerUnavailable, match=r"^AIP_SSL_CAFILE"):
        kafka_config(tls(ssl_cafile=str(tmp_path / "no-such.pem")))


def test_kafka_python_and_faust_get_the_same_context(pki: Pki) -> None:
    from streams.app import broker_credentials

    settings = tls(ssl_cafile=pki.ca, ssl_check_hostname=False, ssl_certfile=pki.client.cert, ssl_keyfile=pki.client.key)
    cfg = kafka_config(settings)
    assert isinstance(cfg["ssl_context"], ssl.SSLContext) and cfg["ssl_context"].check_hostname is False
    assert cfg["security_protocol"] == "SSL"
    assert "ssl_context" not in kafka_config(Settings())
    creds = broker_credentials(settings)
    assert creds.context.check_hostname is False and creds.context.verify_mode == ssl.CERT_REQUIRED
    sasl = broker_credentials(
        settings.replace(security_protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-512", sasl_username="a", sasl_password="b")
    )
    assert sasl.mechanism.name == "SCRAM_SHA_512" and sasl.ssl_context.cert_store_stats()["x509_ca"] == 1


def _verify_error(code: int, message: str) -> ssl.SSLCertVerificationError:
    exc = ssl.SSLCertVerificationError(1, f"[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: {message}")
    exc.verify_code, exc.verify_message = code, message
    return exc


@pytest.mark.parametrize(
    ("code", "message", "says"),
    [
        (10, "certificate has expired", "has expired"),
        (20, "unable to get local issuer certificate", "is not signed by a trusted CA"),
        (19, "self-signed certificate in certificate chain", "is not signed by a trusted CA"),
        (62, "Hostname mismatch, certificate is not valid for 'kafka-1'.", "is not valid for 'kafka-1'"),
        (64, "IP address mismatch, certificate is not valid for '10.0.0.1'.", "AIP_SSL_CHECK_HOSTNAME=false"),
    ],
)
def test_handshake_errors_say_what_and_where_in_one_line(code: int, message: str, says: str) -> None:
    server = "kafka-1:9094" if code != 64 else "10.0.0.1:9094"
    line = handshake_error(_verify_error(code, message), server, Settings(security_protocol="SASL_SSL", ssl_cafile="/etc/ca.pem"))
    assert says in line and f"the broker at {server}" in line and "\n" not in line


def test_the_front_context_is_tls_12_or_newer_and_can_require_client_certificates(pki: Pki, tmp_path: Path) -> None:
    context = server_context(pki.server.cert, pki.server.key)
    assert context.minimum_version >= ssl.TLSVersion.TLSv1_2 and context.verify_mode == ssl.CERT_NONE
    assert server_context(pki.server.cert, pki.server.key, pki.ca).verify_mode == ssl.CERT_REQUIRED
    with pytest.raises(TlsFileError, match=r"^TLS certificate .*missing\.pem"):
        server_context(tmp_path / "missing.pem")
    with pytest.raises(TlsFileError, match="KEY_VALUES_MISMATCH"):
        server_context(pki.server.cert, pki.client.key)
    with pytest.raises(TlsFileError, match=r"^TLS client CA"):
        server_context(pki.server.cert, pki.server.key, tmp_path / "missing-ca.pem")


def test_the_front_needs_users_or_tls() -> None:
    with pytest.raises(ValueError, match="users"):
        AuthFront("127.0.0.1", 0, "127.0.0.1", 1, None)
    with pytest.raises(BrokerError, match="--tls-cert"):
        EmbeddedBroker(port=free_port(), tls_key="server.key")
    assert EmbeddedBroker(port=1, tls_cert="c.pem", users={"a": "b"}).security_protocol == "SASL_SSL"
    assert EmbeddedBroker(port=1, tls_cert="c.pem").security_protocol == "SSL"
    assert EmbeddedBroker(port=1, users={"a": "b"}).security_protocol == "SASL_PLAINTEXT"


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--tls-key", "server.key"], "a TLS key or client CA needs the TLS certificate (--tls-cert)"),
        (["--tls-cert", "no-such.pem"], "TLS certificate no-such.pem: No such file or directory"),
    ],
)
def test_aip_broker_with_unusable_tls_files_fails_in_one_line(tmp_path: Path, args: list[str], says: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIP_")}
    result = subprocess.run(
        [sys.executable, "-m", "aip.cli", "broker", "--port", str(free_port()), *args],
        cwd=tmp_path,
        env=env | {"PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert lines[0] == f"aip broker: error: {says}"
