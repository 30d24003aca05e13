"""The one error the descriptions raise."""


class ConfigError(ValueError):
    """An impossible or inconsistent layer description (one line, names the valid choices)."""
