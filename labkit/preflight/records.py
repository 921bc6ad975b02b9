"""The typed records of the pre-run checks: what the estimate, the measurement, the fit verdict, the time plan and
the step checks return, and what stage 03 writes to disk (the same dicts, serialised as JSON).

The memory estimate's terms are keyed by identifiers (`BREAKDOWN`, `PHASES`, the alternatives' keys); their display
labels live in `labkit.show.memory_labels`.
"""

from __future__ import annotations

from typing import Any, TypedDict

# the memory estimate's terms, by identifier (labkit.show.memory_labels.LABELS says how each one is shown)
BREAKDOWN = ("weights_frozen", "weights_4bit", "trainable_parameters", "gradients", "optimizer_states", "activations",
             "loss_head_buffers")
PHASES = ("end_of_forward", "start_of_backward", "optimizer_update", "reference_forward", "recomputed_layer_backward")
# what a phase holds above the weights and optimiser states (`phase_terms`; the layouts add GATHERED_LAYER)
PHASE_TERMS = ("activations", "loss_head_forward", "loss_head_backward", "layer_transient", "gradients",
               "reference_layer", "recomputed_layer", "head_gradients")
ACTIVATIONS_PLAIN = "activations_plain"  # alternatives: activations without checkpointing
ACTIVATIONS_CHECKPOINTED = "activations_checkpointed"  # with checkpointing (+ one recomputed layer)
OPTIMIZER_STATES_PREFIX = "optimizer_states_"  # alternatives: optimizer_states_<train.optimizer>
UPCAST_PREFIX = "weights_frozen_upcast_"  # alternatives (qlora): weights_frozen_upcast_<all | norms>
# the GPU margins outside the estimate (labkit.preflight.sizing.overheads)
OVERHEADS = ("fragmentation", "cuda_context", "nccl_buffers", "ddp_buckets")
# the processes' layouts (labkit.preflight.layouts): "single" (one process) and the strategies, by identifier
LAYOUTS = ("single", "ddp", "fsdp", "zero2", "zero3", "zero2_offload", "zero3_offload")
GATHERED_LAYER = "gathered_layer"  # per-GPU term under fsdp / zero3: one decoder layer's weights, gathered whole


class MemoryEstimate(TypedDict):
    """`labkit.preflight.memory.estimate_step`: one training step's memory, in bytes, before anything is allocated."""

    architecture: str
    modelled: bool
    note: str | None
    seq_len: int
    micro_batch: int
    checkpointing: bool
    attention: str  # the attn_implementation counted (eager keeps heads × length scores per token)
    optimizer: str
    device: str
    loss_fraction: float
    alternatives: dict[str, float]
    dtype: str
    shape: dict[str, int]
    trainable: int
    adapted: list[str]
    activation_units_per_token_layer: dict[str, float]
    activations_per_layer_bytes: float
    breakdown: dict[str, float]
    phases: dict[str, float]
    phase_terms: dict[str, dict[str, float]]  # phase id -> {PHASE_TERMS id: bytes}, summing to the phase
    weights_bytes: float
    step_bytes: float
    peak_bytes: float
    trainer: str
    rows: int
    unfused_logits_bytes: int
    experts: dict[str, Any]  # a mixture of experts' frozen fused experts: {"parameters", "bytes", "adapted" (LoRA)}


class FitOption(TypedDict):
    """A smaller step that fits: micro-batch and checkpointing, and its estimated peak."""

    micro_batch: int
    checkpointing: bool
    peak_bytes: float


class FitVerdict(TypedDict):
    """`labkit.preflight.sizing.fit_verdict`: does the step fit, with the GPU's margins (`OVERHEADS`)?"""

    needed_bytes: float
    overheads: dict[str, float]
    paged_bytes: float
    peak_bytes: float
    fits: bool
    spare_bytes: float
    options: list[FitOption]
    message: str


class MethodCheck(TypedDict):
    """`labkit.preflight.sizing.check_method`: the card's method applied to its model's config on the meta device."""

    architecture: str  # the config's model_type
    kind: str  # method.kind
    trainable: int  # parameters the step updates
    parameters: int  # every parameter of the (wrapped) model
    adapted: list[str]  # the text decoder's adapted (LoRA) or fully trained linears, by module name
    experts_adapted: bool  # LoRA reaches a mixture of experts' fused expert weights


class Layout(TypedDict):
    """How the training processes share the model (`labkit.preflight.layouts.layout_of`)."""

    id: str  # one of LAYOUTS
    processes: int  # in all, over every machine
    machines: int
    per_machine: int


class GpuEstimate(TypedDict):
    """`labkit.preflight.layouts.per_gpu`: one step's memory on each GPU under a layout (bytes).

    `breakdown` holds `BREAKDOWN` and `GATHERED_LAYER`; `host_breakdown` what CPU offload moves to host memory, per
    process; `host_bytes_per_machine` that times the processes of one machine.
    """

    layout: Layout
    breakdown: dict[str, float]
    phases: dict[str, float]
    phase_terms: dict[str, dict[str, float]]
    weights_bytes: float
    step_bytes: float
    peak_bytes: float
    optimizer: str
    host_breakdown: dict[str, float]
    host_bytes_per_machine: float


class LayoutFit(TypedDict):
    """A layout that fits a GPU (`labkit.preflight.layouts.fitting_layout`): the fewest GPUs, the lightest strategy."""

    layout: Layout
    needed_bytes: float


class RejectedAnswersPlan(TypedDict):
    """`labkit.preflight.timeplan.rejected_answers_plan`: what the base model's rejected answers cost the run."""

    rows: int
    train_rows: int
    train_rows_in_split: int
    generated_rows: int
    seconds: float
    cached_seconds: float
    status: str


class TimePlan(TypedDict):
    """`labkit.preflight.timeplan.time_plan`: the training time predicted from the measured steps."""

    steps: int
    rows_per_epoch: int
    examples_per_step: float
    seconds_per_step: float
    train_seconds: float
    evaluations: int
    evaluation_seconds: float
    hours: float
    cost: float
    within_budget: bool
    train_tokens: int
    packed: bool
    rejected_answers: RejectedAnswersPlan | None
    processes: int  # data-parallel processes (distributed.num_processes)
    scaling_efficiency: float  # assumed (labkit.preflight.scaling); 1.0 for one process
    total_seconds: float


class StepRun(TypedDict):
    """One optimiser step of a check (`labkit.preflight.arms.StepRecord`): taken, or skipped by the fp16 loss scaler."""

    step: int
    skipped: bool
    loss: float | None
    scale: float | None  # the fp16 loss scaler's scale at this step (None: no scaler)
    nonfinite_gradients: int  # tensors whose (unscaled) gradients hold inf/NaN
    first_nonfinite: str | None


class UpdateCheck(TypedDict):
    """`labkit.preflight.stepchecks.update_check`: which tensors real optimiser steps changed."""

    ok: bool
    problems: list[str]
    nonfinite: list[str]  # non-finite losses / gradients of steps taken, one line each (also in problems)
    steps: int  # optimiser steps really taken
    skipped_steps: list[int]  # trainer steps the fp16 loss scaler skipped (inf/NaN gradients at its scale)
    trainer_steps: int  # trainer steps run, skipped ones included
    step_log: list[StepRun]
    expected: int
    trainable: int
    changed: int
    changed_step_1: int
    first_step_movers: int
    unchanged_expected: list[str]
    changed_frozen: list[str]
    tensors: list[dict[str, Any]]
    seconds: float
    seconds_per_step: float


class AccumulationCheck(TypedDict):
    """`labkit.preflight.comparisons.accumulation_check`: micro-batch m × accumulation k against one batch of m·k.

    `skipped`: why the check was not measured ("not measurable on this device: needs X GiB of Y GiB (…)", an
    out-of-memory error, or a result that would be ignored); a skipped check is `ok` and fails nothing.
    """

    ok: bool
    skipped: str | None
    problems: list[str]
    nonfinite: list[str]
    needed_bytes: dict[str, float | None]  # each arm's estimated memory ("whole", "accumulated"); None: not costed
    free_bytes: float | None
    skipped_steps: dict[str, list[int]]  # per arm, the steps the fp16 loss scaler skipped
    relative_difference: float | None
    tolerance: float
    worst_tensor: str
    note: str | None
    trainer: str
    loss_normalisation: str
    micro_batch: int
    accum: int
    tokens_per_micro_batch: list[int]
    load_balancing: str | None  # why a mixture of experts' router aux loss is off in both arms (None: not one)
    loss_whole: float | None
    loss_accumulated: float | None


class CheckpointingCheck(TypedDict):
    """`labkit.preflight.comparisons.checkpointing_check`: the same loss and gradients with checkpointing, less memory.

    `skipped`: as for `AccumulationCheck` (arms "plain", "checkpointed").
    """

    ok: bool
    skipped: str | None
    problems: list[str]
    nonfinite: list[str]
    needed_bytes: dict[str, float | None]
    free_bytes: float | None
    skipped_steps: dict[str, list[int]]
    seq_len: int
    micro_batch: int
    memory_saving_expected_bytes: float | None
    memory_judged: bool
    loss_plain: float | None
    loss_checkpointed: float | None
    relative_difference: float | None
    worst_tensor: str
    tolerance: float
    memory_plain_bytes: int | None
    memory_checkpointed_bytes: int | None
    memory_method: str
