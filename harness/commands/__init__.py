"""Subcommands that live in their own modules; each exposes ``register(subparsers)``
(``harness.cli._extra_commands`` imports them)."""
