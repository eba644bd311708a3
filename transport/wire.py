"""The few Kafka requests the project speaks itself, by kafka-python's declarations.

Two places talk Kafka below the clients: the authenticating front of the embedded broker
(aip/authfront.py answers SaslHandshake and SaslAuthenticate and rewrites ApiVersions) and the
broker probe (:mod:`transport.probe` asks ApiVersions, SaslHandshake, SaslAuthenticate and
Metadata before a client starts).  Neither writes a frame by hand: kafka-python declares the
messages (``kafka.protocol``) and encodes and decodes them, scramp does SCRAM on the front and
kafka-python's own SASL mechanisms on the probe.  This module holds what both sides share
around those: the mechanisms, the error codes, and a frame's size and header.
"""

from __future__ import annotations

import io
from typing import Any

from kafka import errors
from kafka.protocol.api_header import RequestHeader
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse, MetadataRequest
from kafka.protocol.sasl import (
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
    SaslHandshakeResponse,
)

__all__ = [
    "ApiVersionsRequest",
    "ApiVersionsResponse",
    "MetadataRequest",
    "SaslAuthenticateRequest",
    "SaslAuthenticateResponse",
    "SaslHandshakeRequest",
    "SaslHandshakeResponse",
]

MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")

NONE = 0
UNSUPPORTED_SASL_MECHANISM = errors.UnsupportedSaslMechanismError.errno
ILLEGAL_SASL_STATE = errors.IllegalSaslStateError.errno
UNSUPPORTED_VERSION = errors.UnsupportedVersionError.errno
SASL_AUTHENTICATION_FAILED = errors.SaslAuthenticationFailedError.errno


class FrameError(ValueError):
    """A frame's size prefix is out of bounds (not Kafka, or more than this side accepts)."""


def frame_size(prefix: bytes, most: int, least: int = 4) -> int:
    """The size a frame's 4-byte prefix announces; :class:`FrameError` outside ``least``..``most``.

    >>> frame_size(b"\\x00\\x00\\x00\\x0c", most=1024)
    12
    """
    size = int.from_bytes(prefix, "big", signed=True)
    if not least <= size <= most:
        raise FrameError(f"a frame of {size} bytes")
    return size


def framed(message: Any, correlation_id: int, client_id: str = "") -> bytes:
    """A request or response, with its header, as the bytes of one frame."""
    if message.is_request():
        message.with_header(correlation_id=correlation_id, client_id=client_id)
    else:
        message.with_header(correlation_id=correlation_id)
    data: bytes = message.encode(framed=True, header=True)
    return data


def request_header(frame: bytes) -> Any:
    """The api key, version, correlation id and client id of any request (a frame without its size).

    Every request header starts alike; a flexible one only adds tagged fields after the client id.
    """
    return RequestHeader.decode(io.BytesIO(frame), flexible=False)
