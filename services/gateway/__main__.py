"""python -m services.gateway: serves the gateway service with settings from AWOOOP_* variables."""

from services.common.runtime import serve

if __name__ == "__main__":
    serve(["gateway"])
