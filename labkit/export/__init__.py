"""Delivery: the export of a run tied to its base revision, the reload check and the model card."""
