"""Across runs: the comparison of an experiment's variants, its HTML report, the locked test split, the rental plan."""
