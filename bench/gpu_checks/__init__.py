"""The parts of bench/gpu_check.py (a bench helper package, not part of labkit)."""
