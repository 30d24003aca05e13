"""pytest plugin (filled in by the matrix runner)."""
