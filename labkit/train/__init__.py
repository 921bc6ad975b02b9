"""Training through TRL: the trainer, the CPU loss head, packing, DPO/ORPO, early stopping, resilience, accelerate."""
