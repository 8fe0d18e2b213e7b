"""python -m services.scheduler: serves the scheduler service with settings from AWOOOP_* variables."""

from services.common.runtime import serve

if __name__ == "__main__":
    serve(["scheduler"])
