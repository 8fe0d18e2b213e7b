"""Channels from one awooop service to another (scheduler -> saga, saga -> tool gateway)."""

from __future__ import annotations

import grpc

from services.common import tracing


def peer_channel(addr: str, tls_cert_file: str) -> grpc.aio.Channel:
    """A channel to another awooop service, in the caller's trace while tracing is on. When this
    process serves TLS (AWOOOP_TLS_CERT_FILE) so do its peers: the services share one
    certificate, trusted here as the root."""
    traced = tracing.client_interceptors() or None
    if not tls_cert_file:
        return grpc.aio.insecure_channel(addr, interceptors=traced)
    with open(tls_cert_file, "rb") as f:
        creds = grpc.ssl_channel_credentials(root_certificates=f.read())
    return grpc.aio.secure_channel(addr, creds, interceptors=traced)
