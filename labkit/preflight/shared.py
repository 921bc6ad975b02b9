"""One loaded model shared by stage 03's checks, each check starting from the same initial weights.

Stage 03 used to load a fresh model (method applied) for every check and every arm of a check: seven loads on the
quickstart. The checks only need each arm to start from the same weights with nothing left over from the previous
arm, so the trainable tensors (every tensor for method full) are copied once, to host memory, and written back
before each arm; what an arm leaves behind (gradients, activation checkpointing, the input-gradient hook a
checkpointed PEFT model gets, the trainer and its optimiser states) is undone or freed. Memory measured above the
weights does not depend on their values, and `labkit.preflight.measure.PeakMemory` takes its baseline after the
previous arm's memory is freed (gc and malloc_trim), so the measurements are those of a fresh model.
"""

from __future__ import annotations

import gc
from typing import Any

import torch



class SharedModel:
    """Callable: the shared model, restored to its initial weights (a drop-in for a fresh-model factory).

    Args:
        model: the loaded model with the card's method applied, before any training step.
    """

    def __init__(self, model: Any) -> None:
        self.model = model
        self.restores = 0
        # host copies: a second copy of a fully trained model on the GPU would take the memory the step needs
        self._initial = {n: p.detach().to("cpu", copy=True) for n, p in model.named_parameters() if p.requires_grad}

    def __call__(self) -> Any:
        """The model with its initial trainable weights, no gradients, no checkpointing, memory of past arms freed."""
        self.restore()
        return self.model

    def restore(self) -> None:
        """Write the initial weights back and undo what a trainer left on the model."""
        model = self.model
        if getattr(model, "is_activation_checkpointing", False):
            model.activation_checkpointing_disable()
        if getattr(model, "_require_grads_hooks", None) or getattr(model, "_require_grads_hook", None) is not None:
            model.disable_input_require_grads()
        with torch.no_grad():
            for name, param in model.named_parameters():
                param.grad = None
                if name in self._initial:
                    param.copy_(self._initial[name])
        self.restores += 1
        gc.collect()  # the last arm's trainer (a measurement trims the heap itself; a timed step must not)

    def changed(self) -> list[str]:
        """Trainable tensors that differ from their initial weights (none right after `restore`)."""
        return [n for n, p in self.model.named_parameters()
                if n in self._initial and not torch.equal(p.detach().cpu(), self._initial[n])]
