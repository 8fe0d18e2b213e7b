"""The server package's `awooop` commands (serve, up, migrate, config, admin). The client package's
command finds them through the `awooop.cli_commands` entry points (pyproject.toml): each entry
point is a register(subparsers) function, as the client's own command modules have."""
