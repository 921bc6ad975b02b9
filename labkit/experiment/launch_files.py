"""`labkit launch`: the files that start a card's run where GPUs are rented — a SkyPilot task, a Slurm batch
script and one shell script per machine (torchrun / accelerate variables) — with a README, in one folder.

The GPU is chosen by `labkit estimate`'s verdict (`labkit.preflight.sizing.fit_verdict`) over the catalog
below: a GPU given with --gpu must fit, else the smallest that fits is named; without --gpu the smallest that fits
is taken. The texts are in `labkit.experiment.launch_scripts`; docs/launch.md says how to start each.
"""

from __future__ import annotations

import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from labkit import __version__
from labkit.card.load import LoadedCard
from labkit.core import runs as R
from labkit.errors import CardError, UsageError
from labkit.experiment.launch_scripts import (LaunchSpec, node_commands, node_script, skypilot_task,
                                              slurm_minutes, slurm_script)
from labkit.preflight.gpus import GPUS as CATALOGUE
from labkit.preflight.memory import GIB
from labkit.preflight.sizing import estimate_config, fit_verdict, gpu_profile

# SkyPilot accelerator names are the catalogue's (`sky show-gpus` lists what each cloud rents under them):
# name -> (memory in GiB, CUDA compute capability), one source with `labkit estimate --gpu`.
GPUS: dict[str, tuple[float, str]] = {name: (gpu.memory_gib, gpu.capability) for name, gpu in CATALOGUE.items()}
TARGETS = ("skypilot", "slurm", "torchrun")
PLACEHOLDER_BUCKET = "labkit-runs-change-me"
SKYPILOT_RUNS = "/labkit-runs"  # where the task mounts the runs bucket on every machine


def _by_memory() -> list[str]:
    return sorted(GPUS, key=lambda name: (GPUS[name][0], GPUS[name][1], name))


class Sizer:
    """`labkit estimate`'s verdict for one card on the catalog's GPUs (offline: the model's config, no weights).

    `verdict(gpu)` is `labkit.preflight.sizing.fit_verdict` on the GPU's memory and capability — what `labkit
    estimate --gpu-memory M --capability C` prints. `fits(gpu)` applies the same rule (the step, with the GPU's
    margins, fits; or fits once paged optimiser states page out) to the bytes that verdict counts, read once per
    compute capability (the count depends on the capability, not the memory), so that trying the catalog does
    not search micro-batches on every GPU that is too small.
    """

    def __init__(self, loaded: LoadedCard) -> None:
        self.loaded = loaded
        self.config = estimate_config(loaded.card, loaded.path, None)
        self._needs: dict[str, tuple[float, float]] = {}

    def _machine(self, memory: float, capability: str) -> Any:
        """One rented machine: as many of the GPU as the card runs processes per machine (as `labkit estimate`)."""
        d = self.loaded.card.distributed
        return gpu_profile(memory, capability, count=max(1, d.num_processes // d.num_machines))

    def verdict(self, gpu: str) -> dict[str, Any]:
        """The estimate's verdict on `gpu` ("fits", "needed_bytes", "message", …)."""
        memory, capability = GPUS[gpu]
        card = self.loaded.card
        return fit_verdict(self.config, card, card.data.max_length, memory * GIB, self._machine(memory, capability),
                           free_is_total=True)

    def needs(self, gpu: str) -> tuple[float, float]:
        """(bytes the step needs on `gpu`, bytes with paged optimiser states paged out)."""
        memory, capability = GPUS[gpu]
        if capability not in self._needs:
            card = self.loaded.card
            got = fit_verdict(self.config, card, card.data.max_length, float("inf"), self._machine(memory, capability),
                              free_is_total=True)
            self._needs[capability] = (got["needed_bytes"], got["needed_bytes"] - got["paged_bytes"])
        return self._needs[capability]

    def fits(self, gpu: str) -> bool:
        return min(self.needs(gpu)) <= GPUS[gpu][0] * GIB


def choose_gpu(loaded: LoadedCard, gpu: str | None) -> tuple[str, dict[str, Any]]:
    """The GPU the files ask for: `gpu` when the estimate says the card's step fits it, else refused; without
    `gpu` the catalog's smallest that fits.

    Args:
        loaded: the card.
        gpu: a catalog name (`GPUS`, any case), or None.
    Returns:
        (the GPU's name, its verdict).
    Raises:
        UsageError: `gpu` is not in the catalog.
        CardError: it does not fit (the message names the smallest that does), or none does.
    """
    order = _by_memory()
    canonical = None
    if gpu is not None:
        canonical = {name.lower(): name for name in GPUS}.get(gpu.strip().lower())
        if canonical is None:
            raise UsageError(f"--gpu {gpu}: not a GPU labkit launch knows; use one of {', '.join(order)}")
    sizer = Sizer(loaded)
    if canonical is not None and sizer.fits(canonical):
        return canonical, sizer.verdict(canonical)
    smallest = next((name for name in order if sizer.fits(name)), None)
    if canonical is not None:
        raise CardError(f"{loaded.path}: does not fit on {canonical} ({GPUS[canonical][0]:g} GiB): the training step "
                        f"needs {min(sizer.needs(canonical)) / GIB:.1f} GiB with its margins; "
                        + (f"the smallest GPU that fits is {smallest}: --gpu {smallest}" if smallest else
                           "no GPU in the catalog fits (labkit estimate says what to change)"))
    if smallest is None:
        raise CardError(f"{loaded.path}: the training step fits no GPU in the catalog ({', '.join(order)}); "
                        "labkit estimate says what it needs and what to change")
    return smallest, sizer.verdict(smallest)


def _extras(loaded: LoadedCard) -> tuple[str, ...]:
    """labkit's extras the run needs on the rented machines."""
    card = loaded.card
    extras = []
    if card.method.kind == "qlora" or card.train.optimizer != "adamw":
        extras.append("gpu")
    if card.distributed.strategy == "deepspeed":
        extras.append("deepspeed")
    if card.tracking.mlflow or card.tracking.wandb or card.tracking.tensorboard:
        extras.append("track")
    return tuple(extras)


BUCKET = re.compile(r"[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]")  # S3 / GCS / R2 bucket names: lower case, digits, . - _
RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")  # a run id is a folder name under runs/<experiment>/


def check_options(**values: str | None) -> None:
    """Refuse option values that could not be written safely: control characters anywhere (a newline in a YAML
    comment or a README line), a bucket or run id that is not a plain name."""
    for key, value in values.items():
        if value is not None and any(ord(c) < 32 or ord(c) == 127 for c in value):
            raise UsageError(f"--{key.replace('_', '-')}: contains a control character (a newline?); give it on one line"
                             if key != "card" else f"{value!r}: the card's path contains a control character; rename it")
    if values.get("bucket") is not None and not BUCKET.fullmatch(values["bucket"]):
        raise UsageError(f"--bucket {values['bucket']}: not a bucket name; use lower-case letters, digits, '.', '-' "
                         "and '_' (3 to 222 characters)")
    if values.get("run_id") is not None and not RUN_ID.fullmatch(values["run_id"]):
        raise UsageError(f"--run-id {values['run_id']}: a run id is a folder name; use letters, digits, '.', '-' "
                         "and '_' (starting with a letter or digit)")


def launch_spec(loaded: LoadedCard, gpu: str, *, runs: str | None = None, wheel: str | None = None,
                bucket: str = PLACEHOLDER_BUCKET, head: str | None = None, cpus: int | None = None,
                minutes: int | None = None, run_id: str | None = None, target: str = "skypilot") -> LaunchSpec:
    """Everything the launch files need, from the card and the options.

    Args:
        loaded: the card.
        gpu: the chosen GPU (a `GPUS` name).
        runs: the shared runs folder on the machines (default: /labkit-runs for SkyPilot, the project's runs
            folder for Slurm and torchrun).
        wheel: the labkit wheel (default: dist/labkit-<version>-py3-none-any.whl in the project).
        bucket: SkyPilot's runs bucket.
        head: the head machine's address for the torchrun scripts.
        cpus: Slurm: CPUs per machine (default 8 per process).
        minutes: Slurm: the time limit (default from the card's budget).
        run_id: the torchrun scripts' run id (default <variant>-<UTC time>).
        target: skypilot, slurm or torchrun (decides the default of `runs`).
    Returns:
        the spec.
    Raises:
        UsageError: the card (or a file of its parent chain) is outside its project folder.
    """
    check_options(runs_mount=runs, wheel=wheel, bucket=bucket, head=head, run_id=run_id, card=str(loaded.path))
    card = loaded.card
    machines = card.distributed.num_machines
    if card.distributed.num_processes % machines:
        raise CardError(f"{loaded.path}: distributed.num_processes {card.distributed.num_processes} is not a multiple "
                        f"of num_machines {machines}; make it processes per machine x machines")
    workdir = R.project_root(loaded.path.parent)
    for path in loaded.chain:
        if not Path(path).resolve().is_relative_to(workdir):
            raise UsageError(f"{path}: outside the project folder {workdir} that the launch files use as working "
                             "folder; move the card (and its parents) under it")
    name = re.sub(r"[^a-z0-9-]+", "-", f"{card.experiment.id}-{card.experiment.variant}".lower()).strip("-")[:63]
    default_runs = SKYPILOT_RUNS if target == "skypilot" else str(R.runs_root(loaded.path.parent))
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return LaunchSpec(
        name=name, card=loaded.path.resolve().relative_to(workdir).as_posix(), workdir=str(workdir), gpu=gpu,
        machines=machines, per_machine=card.distributed.num_processes // machines, runs=runs or default_runs,
        extras=_extras(loaded),
        wheel=str(Path(wheel).expanduser().resolve() if wheel else
                  workdir / "dist" / f"labkit-{__version__}-py3-none-any.whl"),
        bucket=bucket, hub_token=card.model.source.startswith("hf:"),
        minutes=minutes or slurm_minutes(card.budget.max_minutes),
        cpus=cpus or 8 * (card.distributed.num_processes // machines),
        run_id=run_id or f"{card.experiment.variant}-{stamp}", head=head)


def readme(spec: LaunchSpec, target: str, verdict: dict[str, Any]) -> str:
    """The folder's README.md: what the files are and how to start them."""
    lines = [f"# Launch files for {spec.name}", "",
             f"Written by `labkit launch` for `{spec.card}` (project folder `{spec.workdir}`): "
             f"{spec.machines} machine(s) x {spec.per_machine} GPU(s), {spec.gpu} "
             f"(labkit estimate: {verdict['message']}). docs/launch.md explains every file.", "",
             "The head machine (rank 0) runs `labkit run CARD --run-id ID`: it creates the run, or resumes it from "
             "its newest valid checkpoint when it exists; the others run `labkit run --join ID`. The runs folder "
             f"`{spec.runs}` must be storage every machine sees.", ""]
    if target == "skypilot":
        lines += ["## SkyPilot (`task.yaml`)", "",
                  "1. Build labkit's wheel in the project folder: `python -m build --wheel` (writes "
                  f"`{spec.wheel}`; pass another with `labkit launch --wheel`).",
                  f"2. Name a bucket of yours in `file_mounts` (now `{spec.bucket}`; or `labkit launch --bucket`).",
                  "3. Start it as a managed job: `sky jobs launch task.yaml"
                  + (" --secret HF_TOKEN`" if spec.hub_token else "`")
                  + " (`sky jobs queue`, `sky jobs logs` follow it). After a preemption SkyPilot runs the same "
                  "command on new machines with the same `SKYPILOT_TASK_ID`: the run resumes."]
    elif target == "slurm":
        lines += ["## Slurm (`slurm.sbatch`)", "",
                  "1. Install labkit on the cluster (the wheel: `python -m build --wheel`, then "
                  "`pip install dist/labkit-*.whl`) and activate it in the script where it says so.",
                  "2. Submit from this folder: `sbatch slurm.sbatch` (the log is `slurm-<job id>.out` here). "
                  "A requeued job keeps its id (`slurm-$SLURM_JOB_ID` is the run id): it resumes."]
    else:
        lines += ["## torchrun / accelerate (`node-<k>.sh`)", "",
                  f"Run `bash node-k.sh` on machine k (run id `{spec.run_id}`, the same on every machine). "
                  f"The same commands, one line each, from the project folder (`cd {spec.workdir}`):", ""]
        lines += [f"    {command}" for command in node_commands(spec)]
        if spec.machines > 1 and not spec.head:
            lines += ["", "Set MASTER_ADDR (HEAD_ADDRESS above) to the address of the machine that runs node-0.sh."]
        lines += ["", "Run node-0.sh again after an interruption: the run resumes from its newest valid checkpoint."]
    return "\n".join(lines) + "\n"


def write_launch(loaded: LoadedCard, target: str, out: Path, spec: LaunchSpec, verdict: dict[str, Any]) -> list[Path]:
    """Write the launch files of `target` into `out` (created; existing files of the same names are replaced).

    Returns:
        the files written.
    """
    if target not in TARGETS:
        raise UsageError(f"--on {target}: use one of {', '.join(TARGETS)}")
    out.mkdir(parents=True, exist_ok=True)
    files: dict[str, str] = {"README.md": readme(spec, target, verdict)}
    if target == "skypilot":
        files["task.yaml"] = skypilot_task(spec)
    elif target == "slurm":
        files["slurm.sbatch"] = slurm_script(spec)
    else:
        files.update({f"node-{rank}.sh": node_script(spec, rank) for rank in range(spec.machines)})
    written = []
    for name, text in files.items():
        path = out / name
        path.write_text(text, encoding="utf-8")
        if name.endswith((".sh", ".sbatch")):
            path.chmod(0o755)
        written.append(path)
    return written
