"""Data: sources, the built-in generators, cleaning and splits, leakage, prompting and pair encoding, token lengths,
preparation."""
