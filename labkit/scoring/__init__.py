"""Metrics on generated answers and their paired bootstrap intervals (imports nothing else of labkit)."""
