"""`python -m services.console`: the same as `awooop serve console`."""

from services.console.app import serve

serve()
