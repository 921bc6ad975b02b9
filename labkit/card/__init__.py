"""The experiment card: its strict schema and the loader (YAML, `parent:` inheritance, one-line errors)."""
