"""python -m services.ingest: serves the ingest service with settings from AWOOOP_* variables."""

from services.common.runtime import serve

if __name__ == "__main__":
    serve(["ingest"])
