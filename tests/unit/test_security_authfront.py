"""The authenticating front's parts without a broker: users file, ApiVersions rewrite, PLAIN and SCRAM checks."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from aip.authfront import (
    SASL_VERSIONS,
    AuthFailed,
    AuthFront,
    UsersFileError,
    _ScramServer,
    check_plain,
    load_users,
    rewrite_api_versions,
)
from config import Settings
from transport.probe import sasl_client

SECRET = "s3cr3t-Pa55-do-not-print"


def test_users_file_lines_and_json(tmp_path: Path) -> None:
    lines = tmp_path / "users.txt"
    lines.write_text(f"# comment\n\nalice:{SECRET}\nbob: with:colons and spaces \n")
    assert load_users(lines) == {"alice": SECRET, "bob": " with:colons and spaces "}
    js = tmp_path / "users.json"
    js.write_text(f'{{"alice": "{SECRET}"}}')
    assert load_users(js) == {"alice": SECRET}


@pytest.mark.parametrize(
    "text",
    [f"alice {SECRET}\n", f":{SECRET}\n", "alice:\n", "", "# nobody\n", f'{{"alice": ["{SECRET}"]}}', f'{{"alice": "{SECRET}"'],
)
def test_bad_users_files_say_where_but_never_the_password(tmp_path: Path, text: str) -> None:
    path = tmp_path / "users"
    path.write_text(text)
    with pytest.raises(UsersFileError) as info:
        load_users(path)
    assert str(path) in str(info.value)
    assert SECRET not in str(info.value)


def test_missing_users_file(tmp_path: Path) -> None:
    with pytest.raises(UsersFileError, match="No such file"):
        load_users(tmp_path / "absent")


def _api_versions_v0(entries: list[tuple[int, int, int]]) -> bytes:
    return struct.pack(">hi", 0, len(entries)) + b"".join(struct.pack(">hhh", *e) for e in entries)


def _parse_v0(body: bytes) -> dict[int, tuple[int, int]]:
    _error, n = struct.unpack(">hi", body[:6])
    return {k: (lo, hi) for k, lo, hi in (struct.unpack(">hhh", body[6 + 6 * i : 12 + 6 * i]) for i in range(n))}


def test_api_versions_v0_rewrite_offers_the_fronts_sasl_versions() -> None:
    body = _api_versions_v0([(0, 0, 11), (17, 0, 1), (36, 0, 2), (18, 0, 4)])
    out = _parse_v0(rewrite_api_versions(0, body))
    assert out[17] == SASL_VERSIONS[17] == (1, 1)
    assert out[36] == SASL_VERSIONS[36] == (0, 1)
    assert out[0] == (0, 11) and out[18] == (0, 4)
    # a broker without SASL entries gets them added
    assert _parse_v0(rewrite_api_versions(0, _api_versions_v0([(3, 0, 12)])))[36] == (0, 1)


def test_api_versions_v3_rewrite_keeps_flexible_framing() -> None:
    def entry(k: int, lo: int, hi: int) -> bytes:
        return struct.pack(">hhh", k, lo, hi) + b"\x00"

    body = struct.pack(">h", 0) + bytes([3 + 1]) + entry(0, 0, 11) + entry(36, 0, 2) + entry(17, 0, 1)
    body += struct.pack(">i", 0) + b"\x00"  # throttle time, tagged fields
    out = rewrite_api_versions(3, body)
    assert out[:2] == b"\x00\x00" and out[2] == 3 + 1
    entries = {struct.unpack(">h", out[3 + 7 * i : 5 + 7 * i])[0]: out[3 + 7 * i : 10 + 7 * i] for i in range(3)}
    assert entries[36] == entry(36, 0, 1) and entries[17] == entry(17, 1, 1) and entries[0] == entry(0, 0, 11)
    assert out.endswith(struct.pack(">i", 0) + b"\x00")
    # an error answer (unsupported version) is passed on as it is
    error = struct.pack(">hi", 35, 0)
    assert rewrite_api_versions(3, error) == error


def test_plain_accepts_only_the_right_password() -> None:
    users = {"alice": SECRET}
    assert check_plain(users, b"\0alice\0" + SECRET.encode()) == "alice"
    for token in (
        b"\0alice\0wrong",
        b"\0bob\0" + SECRET.encode(),
        b"alice" + SECRET.encode(),
        b"\0alice\0" + SECRET.encode() + b"x",
    ):
        with pytest.raises(AuthFailed) as info:
            check_plain(users, token)
        assert SECRET not in str(info.value)


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
@pytest.mark.parametrize(
    ("user", "password", "ok"), [("alice", SECRET, True), ("alice", "wrong", False), ("mallory", SECRET, False)]
)
def test_scram_server_against_the_probes_client(mechanism: str, user: str, password: str, ok: bool) -> None:
    server = _ScramServer(mechanism, {"alice": SECRET}, {})
    client = sasl_client(
        Settings(security_protocol="SASL_PLAINTEXT", sasl_mechanism=mechanism, sasl_username=user, sasl_password=password)
    )
    server_first, done = server.respond(client.auth_bytes())
    assert not done and b"i=4096" in server_first
    client.receive(server_first)
    final = client.auth_bytes()
    if ok:
        verifier, done = server.respond(final)
        assert done and verifier.startswith(b"v=")
        assert server.user == "alice"
        client.receive(verifier)  # the client checks the server's signature: it knew the password too
        assert client.is_done()
    else:
        with pytest.raises(AuthFailed):
            server.respond(final)


def test_scram_server_rejects_a_replayed_nonce() -> None:
    server = _ScramServer("SCRAM-SHA-256", {"alice": SECRET}, {})
    server.respond(b"n,,n=alice,r=abc")
    with pytest.raises(AuthFailed):
        server.respond(b"c=biws,r=abc-not-the-servers-nonce,p=AAAA")


def test_scram_server_rejects_a_malformed_first_message() -> None:
    server = _ScramServer("SCRAM-SHA-256", {"alice": SECRET}, {})
    with pytest.raises(AuthFailed, match="client-first"):
        server.respond(b"x,,n=alice")


def test_api_versions_newer_than_the_protocol_classes_is_answered_unsupported() -> None:
    import asyncio

    from aip.authfront import _api_versions
    from transport import wire

    class Writer:
        data = b""

        def write(self, data: bytes) -> None:
            self.data += bytes(data)

        async def drain(self) -> None:
            pass

    writer = Writer()
    newest = wire.ApiVersionsResponse.max_version
    asyncio.run(_api_versions(writer, None, newest + 1, 7, b""))  # type: ignore[arg-type]  # never reaches the broker
    answer = wire.ApiVersionsResponse[0].decode(writer.data[4:], header=True)
    assert answer.header.correlation_id == 7 and answer.error_code == wire.UNSUPPORTED_VERSION
    assert [(e.api_key, e.min_version, e.max_version) for e in answer.api_keys] == [(18, 0, newest)]


def test_reprs_never_show_passwords() -> None:
    from aip.broker import EmbeddedBroker

    assert SECRET not in repr(AuthFront("127.0.0.1", 1, "127.0.0.1", 2, {"alice": SECRET}))
    assert SECRET not in repr(EmbeddedBroker(port=1, users={"alice": SECRET}))
