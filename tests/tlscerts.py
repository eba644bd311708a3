"""Test certificates, made per test session with the ``cryptography`` package (nothing is committed).

:func:`make_pki` writes a CA and, signed by it, a server certificate for 127.0.0.1 and
localhost, an expired one, one for another name and a client certificate; plus a second CA
that signed nothing the brokers use (the "wrong CA" of the tests).  The extensions satisfy
OpenSSL's strict verification (Python 3.13's default) too.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Pair:
    cert: str
    key: str


@dataclass(frozen=True)
class Pki:
    ca: str  # the CA every certificate below is signed by
    other_ca: str  # a CA that signed none of them
    server: Pair  # CN localhost, SAN localhost and 127.0.0.1, valid now
    expired: Pair  # the same names, expired yesterday
    other_name: Pair  # valid now, for broker.other.example only
    client: Pair  # a client certificate (mutual TLS)
    other_client: Pair  # a client certificate from the other CA


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _write(path: Path, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> Pair:
    cert_path, key_path = path.with_suffix(".pem"), path.with_suffix(".key")
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    key_path.chmod(0o600)
    return Pair(str(cert_path), str(key_path))


def _ca(cn: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(_name(cn))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(days=1))
        .not_valid_after(now + dt.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )  # key_cert_sign, crl_sign
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return cert, key


def _leaf(
    ca: tuple[x509.Certificate, ec.EllipticCurvePrivateKey],
    cn: str,
    names: list[x509.GeneralName],
    *,
    client: bool = False,
    expired: bool = False,
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    start, end = (now - dt.timedelta(days=10), now - dt.timedelta(days=1)) if expired else (now - dt.timedelta(hours=1), now + dt.timedelta(days=30))
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(ca[0].subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca[1].public_key()), critical=False)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH]),
            critical=False,
        )
    )
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return builder.sign(ca[1], hashes.SHA256()), key


def make_pki(directory: Path) -> Pki:
    directory.mkdir(parents=True, exist_ok=True)
    ca, other = _ca("aip test CA"), _ca("another test CA")
    local = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    ca_path, other_path = directory / "ca.pem", directory / "other-ca.pem"
    ca_path.write_bytes(ca[0].public_bytes(serialization.Encoding.PEM))
    other_path.write_bytes(other[0].public_bytes(serialization.Encoding.PEM))
    return Pki(
        ca=str(ca_path),
        other_ca=str(other_path),
        server=_write(directory / "server", *_leaf(ca, "localhost", local)),
        expired=_write(directory / "expired", *_leaf(ca, "localhost", local, expired=True)),
        other_name=_write(
            directory / "other-name", *_leaf(ca, "broker.other.example", [x509.DNSName("broker.other.example")])
        ),
        client=_write(directory / "client", *_leaf(ca, "aip-client", [], client=True)),
        other_client=_write(directory / "other-client", *_leaf(other, "stranger", [], client=True)),
    )
