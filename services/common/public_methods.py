"""The gRPC methods every server answers as the library serves them: health and reflection. The
service interceptor leaves them alone (no key, no metrics, no access log) and tracing gives them
no span (a probe every few seconds would otherwise be much of the trace volume)."""

PUBLIC_PREFIXES = ("/grpc.health.v1.", "/grpc.reflection.")


def is_public(method: str) -> bool:
    """Whether method (a full name, /package.Service/Method) is health's or reflection's."""
    return method.startswith(PUBLIC_PREFIXES)
