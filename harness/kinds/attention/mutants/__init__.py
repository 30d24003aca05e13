"""The attention kind's mutants, by the issue that brought their decorations."""
