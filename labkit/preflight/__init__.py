"""Checks before the long run: the memory estimate, measured steps and the step checks of stage 03."""
