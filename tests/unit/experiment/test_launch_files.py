"""`labkit launch`: the SkyPilot task (read back by SkyPilot's own parser), the Slurm script and the per-machine
scripts for the Llama 3 8B card and a 2-machine variant of it; bad --gpu values refused in one line."""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import REPO

from labkit.card.load import load_card
from labkit.cli.main import main
from labkit.errors import CardError
from labkit.experiment.launch_files import choose_gpu, launch_spec, write_launch

TWO_MACHINES = """parent: llama3-8b-qlora.yaml
experiment: {variant: llama3-8b-qlora-2x8}
distributed: {launcher: accelerate, strategy: ddp, num_processes: 16, num_machines: 2%s}
"""
NO_FIT = """parent: llama3-8b-qlora.yaml
experiment: {variant: llama3-8b-qlora-mb8}
train: {micro_batch: 8, gradient_checkpointing: false}
"""


def _write_card(path: Path, text: str) -> Path:
    """Write a child card; before issue 26's card change (num_machines > 1 needed main_process_ip in the card),
    the head's address is given there so the card loads on either schema."""
    path.write_text(text % "" if "%s" in text else text)
    if "%s" in text:
        try:
            load_card(path)
        except CardError as exc:
            if "main_process_ip" not in str(exc):
                raise
            path.write_text(text % ", main_process_ip: 10.0.0.1")
    return path


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """A project folder holding a copy of params/ and the two child cards."""
    root = tmp_path_factory.mktemp("project")
    shutil.copytree(REPO / "params", root / "params")
    _write_card(root / "params" / "examples" / "llama3-8b-2machines.yaml", TWO_MACHINES)
    _write_card(root / "params" / "examples" / "llama3-8b-nofit.yaml", NO_FIT)
    return root


@pytest.fixture(scope="module", params=["llama3-8b-qlora.yaml", "llama3-8b-2machines.yaml"])
def written(request, project: Path, tmp_path_factory) -> dict:
    """The three targets' files for one card (the GPU chosen once: the smallest that fits)."""
    loaded = load_card(project / "params" / "examples" / request.param)
    gpu, verdict = choose_gpu(loaded, None)
    out = tmp_path_factory.mktemp("launch")
    files = {}
    for target in ("skypilot", "slurm", "torchrun"):
        spec = launch_spec(loaded, gpu, target=target, run_id="llama-run-1", bucket="my-runs")
        files[target] = write_launch(loaded, target, out / target, spec, verdict)
    machines = loaded.card.distributed.num_machines
    return {"out": out, "gpu": gpu, "machines": machines, "budget": loaded.card.budget.max_minutes, "per_machine": loaded.card.distributed.num_processes
            // machines, "card": f"params/examples/{request.param}", "project": project, "files": files}


def test_skypilot_task_reads_back(written: dict, tmp_path: Path) -> None:
    task = yaml.safe_load((written["out"] / "skypilot" / "task.yaml").read_text())
    assert task["num_nodes"] == written["machines"]
    assert task["resources"]["accelerators"] == f"{written['gpu']}:{written['per_machine']}"
    assert task["workdir"] == str(written["project"])
    assert task["file_mounts"]["/labkit-runs"] == {"name": "my-runs", "mode": "MOUNT_CACHED"}
    wheel = [k for k in task["file_mounts"] if k.startswith("/labkit-wheel/")]
    assert len(wheel) == 1 and wheel[0] in task["setup"] and "[gpu]" in task["setup"]
    head = f'labkit --runs /labkit-runs run {written["card"]} --run-id "$SKYPILOT_TASK_ID"'
    assert head in task["run"]
    assert ('run --join "$SKYPILOT_TASK_ID"' in task["run"]) == (written["machines"] > 1)
    if written["machines"] > 1:
        assert '"${SKYPILOT_NODE_RANK}" = "0"' in task["run"]
    assert task["secrets"] == {"HF_TOKEN": None}  # asked for at launch, never written
    for script in ("setup", "run"):
        assert subprocess.run(["bash", "-n"], input=task[script], text=True).returncode == 0


def test_skypilot_parser_accepts_the_task(written: dict, tmp_path: Path) -> None:
    """SkyPilot's own parser (sky.Task.from_yaml: its JSON-schema validation, then the Task, Resources and
    Storage objects), offline, with HOME in a temporary folder: no cloud call, no credentials."""
    sky_python = REPO / ".venv-sky" / "bin" / "python"  # `make test`'s own environment for SkyPilot (Makefile)
    if not sky_python.exists():
        pytest.importorskip("sky", reason="skypilot is not installed (make skypilot, or pip install 'labkit[skypilot]')")
    probe = ("import json, sys, sky\n"
             "task = sky.Task.from_yaml(sys.argv[1])\n"
             "res = list(task.resources)[0]\n"
             "print(json.dumps({'nodes': task.num_nodes, 'accelerators': res.accelerators,\n"
             "    'mounts': sorted(task.storage_mounts), 'run': task.run}))\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SKYPILOT", "AWS", "GOOGLE"))}
    env["HOME"] = str(tmp_path)
    python = str(sky_python)
    if not sky_python.exists():  # skypilot beside labkit in this environment
        python, env["PYTHONPATH"] = sys.executable, os.pathsep.join(p for p in sys.path if p)
    got = subprocess.run([python, "-c", probe, str(written["out"] / "skypilot" / "task.yaml")], env=env,
                         cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert got.returncode == 0, got.stderr[-2000:]
    parsed = json.loads(got.stdout.strip().splitlines()[-1])
    assert parsed["nodes"] == written["machines"]
    assert parsed["accelerators"] == {written["gpu"]: written["per_machine"]}
    assert parsed["mounts"] == ["/labkit-runs"]
    assert '--run-id "$SKYPILOT_TASK_ID"' in parsed["run"]


def test_slurm_script_reads_back(written: dict) -> None:
    path = written["out"] / "slurm" / "slurm.sbatch"
    text = path.read_text()
    sbatch = dict(re.findall(r"^#SBATCH --([a-z-]+)(?:=(\S+))?", text, flags=re.M))
    assert sbatch["nodes"] == str(written["machines"])
    assert sbatch["ntasks-per-node"] == "1"
    assert sbatch["gpus-per-node"] == str(written["per_machine"])
    assert sbatch["cpus-per-task"] == str(8 * written["per_machine"])
    minutes = math.ceil(written["budget"] * 1.5 + 30)  # the card's training budget x 1.5 + 30 min
    assert sbatch["time"] == f"0-{minutes // 60:02d}:{minutes % 60:02d}:00"
    assert sbatch["output"] == "slurm-%j.out" and "requeue" in sbatch
    assert subprocess.run(["bash", "-n", str(path)]).returncode == 0
    srun = text[text.index("\nsrun ") + 1:]  # the last command (its quoted script spans lines)
    inner = shlex.split(srun)[-1]  # what bash -c runs on every machine
    runs = os.environ.get("LABKIT_RUNS") or str(written["project"] / "runs")  # the project's runs folder
    assert f"labkit --runs {shlex.quote(runs)} run {written['card']} " \
           '--run-id "slurm-$SLURM_JOB_ID"' in inner
    assert ('run --join "slurm-$SLURM_JOB_ID"' in inner) == (written["machines"] > 1)
    assert subprocess.run(["bash", "-n"], input=inner, text=True).returncode == 0
    assert f"cd {shlex.quote(str(written['project']))}" in text


def test_torchrun_scripts_read_back(written: dict) -> None:
    folder = written["out"] / "torchrun"
    scripts = sorted(folder.glob("node-*.sh"))
    assert [p.name for p in scripts] == [f"node-{k}.sh" for k in range(written["machines"])]
    for rank, path in enumerate(scripts):
        text = path.read_text()
        assert subprocess.run(["bash", "-n", str(path)]).returncode == 0
        assert os.access(path, os.X_OK)
        last = text.strip().splitlines()[-1]
        if rank == 0:
            assert last.endswith(f"run {written['card']} --run-id llama-run-1")
        else:
            assert last.endswith("run --join llama-run-1")
        if written["machines"] > 1:
            assert f"export NODE_RANK={rank}" in text and 'MASTER_PORT="${MASTER_PORT:-29500}"' in text
            assert "${MASTER_ADDR:?" in text  # no --head: the script asks for the head's address
    readme = (folder / "README.md").read_text()
    commands = [line.strip() for line in readme.splitlines() if "labkit --runs" in line]
    assert len(commands) == written["machines"]
    if written["machines"] > 1:
        assert commands[1].startswith("NODE_RANK=1 MASTER_ADDR=HEAD_ADDRESS MASTER_PORT=29500 labkit")


def test_the_command_writes_and_prints(project: Path, tmp_path: Path, capsys) -> None:
    card = project / "params" / "examples" / "llama3-8b-2machines.yaml"
    code = main(["launch", str(card), "--on", "torchrun", "--gpu", "a100-80gb", "--out", str(tmp_path / "t"),
                 "--head", "10.1.2.3", "--run-id", "run-1", "--runs-mount", "/shared/runs dir; rm -rf ~"])
    assert code == 0
    out = capsys.readouterr().out
    assert "2 machine(s) x 8 A100-80GB" in out and str(tmp_path / "t") in out
    assert "python -m build --wheel" not in out  # torchrun installs nothing; the wheel note is SkyPilot's
    code = main(["launch", str(card), "--on", "skypilot", "--gpu", "H100", "--out", str(tmp_path / "s"),
                 "--wheel", str(tmp_path / "missing.whl"), "--bucket", "team-runs"])
    assert code == 0 and "missing.whl does not exist yet: build it" in capsys.readouterr().out
    task = yaml.safe_load((tmp_path / "s" / "task.yaml").read_text())
    assert task["file_mounts"]["/labkit-wheel/missing.whl"] == str(tmp_path / "missing.whl")
    assert task["file_mounts"]["/labkit-runs"]["name"] == "team-runs"
    node1 = (tmp_path / "t" / "node-1.sh").read_text()
    assert "export MASTER_ADDR=10.1.2.3" in node1
    assert "labkit --runs '/shared/runs dir; rm -rf ~' run --join run-1" in node1  # quoted, never pasted
    assert subprocess.run(["bash", "-n", str(tmp_path / "t" / "node-1.sh")]).returncode == 0


def test_bad_gpu_is_refused_in_one_line(project: Path, tmp_path: Path, capsys) -> None:
    card = project / "params" / "examples" / "llama3-8b-qlora.yaml"
    assert main(["launch", str(card), "--on", "skypilot", "--gpu", "RTX9999", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--gpu RTX9999" in err and "A100-80GB" in err
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("option", [["--bucket", "My Bucket"], ["--run-id", "../escape"],
                                    ["--runs-mount", "/runs\nrun: rm -rf ~"], ["--time-minutes", "0"]])
def test_unsafe_options_are_refused_in_one_line(project: Path, tmp_path: Path, capsys, option: list[str]) -> None:
    card = project / "params" / "examples" / "llama3-8b-qlora.yaml"
    assert main(["launch", str(card), "--on", "skypilot", "--gpu", "H100", "--out", str(tmp_path / "x"), *option]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and option[0] in err
    assert not (tmp_path / "x").exists()


def test_a_gpu_that_does_not_fit_names_the_smallest_that_does(project: Path, tmp_path: Path, capsys) -> None:
    card = project / "params" / "examples" / "llama3-8b-nofit.yaml"
    assert main(["launch", str(card), "--on", "slurm", "--gpu", "T4", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "does not fit on T4" in err
    fits = re.search(r"the smallest GPU that fits is (\S+): --gpu \1", err)
    assert fits, err
    assert choose_gpu(load_card(card), None)[0] == fits.group(1)  # the same GPU launch picks without --gpu
    assert not (tmp_path / "x").exists()
