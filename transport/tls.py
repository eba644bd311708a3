"""TLS for every Kafka client of the project: one client context, and what a failed handshake means.

kafka-python (producers, tools, the scheduler client) and faust/aiokafka (the worker) get the
same :class:`ssl.SSLContext` from :func:`client_context`, so a setting means the same thing
everywhere: TLS 1.2 or newer; the CA in ``AIP_SSL_CAFILE`` (else the system's CAs); the
broker's host name checked unless ``AIP_SSL_CHECK_HOSTNAME=false`` (the certificate chain is
verified either way); a client certificate from ``AIP_SSL_CERTFILE``/``AIP_SSL_KEYFILE``.
"""

from __future__ import annotations

import ssl

from config import Settings

# OpenSSL's X509_V_ERR_* codes that have their own advice
_EXPIRED, _NOT_YET_VALID = 10, 9
_HOSTNAME_MISMATCH, _IP_MISMATCH = 62, 64
_UNTRUSTED = {18, 19, 20, 21}  # self-signed leaf, self-signed in chain, issuer unknown, cannot verify leaf


class TlsSettingsError(ValueError):
    """A TLS file in the settings cannot be used; the message names the setting and the file."""


def tls_reason(exc: BaseException) -> str:
    """What went wrong with a TLS file or handshake, in a word or two: OpenSSL's reason where it gives one.

    The front (a client's handshake it refused) and the clients (a broker's handshake, a file) say it alike.

    >>> tls_reason(TimeoutError()), tls_reason(FileNotFoundError(2, "No such file or directory"))
    ('no answer in time', 'No such file or directory')
    """
    if isinstance(exc, ssl.SSLError) and exc.reason:
        return str(exc.reason)
    if isinstance(exc, TimeoutError | ConnectionAbortedError):  # asyncio's handshake timeout is the latter
        return "no answer in time"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__


def client_context(settings: Settings) -> ssl.SSLContext:
    """The client side of TLS for ``settings``; raises :class:`TlsSettingsError` for unusable files.

    >>> ctx = client_context(Settings(security_protocol="SSL", ssl_check_hostname=False))
    >>> ctx.minimum_version >= ssl.TLSVersion.TLSv1_2, ctx.check_hostname, ctx.verify_mode == ssl.CERT_REQUIRED
    (True, False, True)
    """
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.check_hostname = settings.ssl_check_hostname  # the chain is verified even without it
    try:
        if settings.ssl_cafile:
            context.load_verify_locations(cafile=settings.ssl_cafile)
        else:
            context.load_default_certs()
    except (OSError, ValueError) as exc:
        raise TlsSettingsError(f"AIP_SSL_CAFILE {settings.ssl_cafile}: {tls_reason(exc)}") from None
    if settings.ssl_certfile:
        try:
            context.load_cert_chain(settings.ssl_certfile, settings.ssl_keyfile or None)
        except (OSError, ValueError) as exc:
            files = settings.ssl_certfile + (f", AIP_SSL_KEYFILE {settings.ssl_keyfile}" if settings.ssl_keyfile else "")
            raise TlsSettingsError(f"AIP_SSL_CERTFILE {files}: {tls_reason(exc)}") from None
    elif settings.ssl_keyfile:
        raise TlsSettingsError("AIP_SSL_KEYFILE is set without AIP_SSL_CERTFILE")
    return context


def handshake_error(exc: BaseException, server: str, settings: Settings) -> str:
    """One line for a failed TLS handshake with ``server``: what failed and which setting to look at."""
    where = f"the broker at {server}"
    if isinstance(exc, ssl.SSLCertVerificationError):
        code, detail = exc.verify_code, exc.verify_message or tls_reason(exc)
        if code == _EXPIRED:
            return f"TLS: the certificate of {where} has expired ({detail}): the broker needs a renewed certificate"
        if code == _NOT_YET_VALID:
            return f"TLS: the certificate of {where} is not valid yet ({detail}): check the clocks and the certificate"
        if code in (_HOSTNAME_MISMATCH, _IP_MISMATCH):
            host = server.rpartition(":")[0].strip("[]")
            return (
                f"TLS: the certificate of {where} is not valid for {host!r} ({detail}): connect by a name the certificate "
                "holds (AIP_BROKER), or set AIP_SSL_CHECK_HOSTNAME=false"
            )
        if code in _UNTRUSTED:
            ca = (
                f"AIP_SSL_CAFILE={settings.ssl_cafile}" if settings.ssl_cafile else "the system's CAs (AIP_SSL_CAFILE is not set)"
            )
            return (
                f"TLS: the certificate of {where} is not signed by a trusted CA ({detail}; trusted: {ca}): check AIP_SSL_CAFILE"
            )
        return f"TLS: the certificate of {where} was not accepted ({detail}): check AIP_SSL_CAFILE"
    reason = tls_reason(exc)
    if "ALERT" in reason.upper():  # the broker refused us, for example our client certificate
        return (
            f"TLS: {where} refused the connection ({reason}): check AIP_SSL_CERTFILE/AIP_SSL_KEYFILE "
            "(the client certificate) and AIP_SECURITY_PROTOCOL"
        )
    return f"TLS: the handshake with {where} failed ({reason})"
