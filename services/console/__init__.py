"""The operator console: server-rendered HTML over the services' gRPC contracts, called with
the signed-in operator's own API key (so every authorization decision stays in the services)."""
