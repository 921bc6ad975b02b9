"""Models: sources resolved to an exact revision, tiny offline models, loading on the device, the method (full, LoRA,
QLoRA), a run's trained model loaded back."""
