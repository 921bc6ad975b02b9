"""Evaluation: batched greedy generation, the evaluation procedure and one run's verdict on its hypothesis."""
