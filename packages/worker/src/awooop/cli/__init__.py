import os

# grpc's C core logs handshake failures at INFO on stderr; the CLI says what went wrong itself
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
