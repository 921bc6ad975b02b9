#!/usr/bin/env bash
# Install the minimum bench/gpu_check.py needs on a fresh CUDA machine, from PyPI only, at requirements.txt's pins:
# torch (as PyPI serves it: the CUDA build on Linux x86-64), transformers, tokenizers, peft, trl, accelerate,
# bitsandbytes, datasets, rouge_score, what labkit's modules import besides them (pydantic, PyYAML, psutil, tqdm,
# numpy, pandas, jsonschema, gguf, mistune, bleach; IPython, which transformers.utils.notebook imports and
# requirements.txt gets through ipykernel), then labkit itself with --no-deps. No JupyterLab, MLflow or Playwright.
#
#   bench/gpu_setup.sh                 into the current Python environment (python3, or $PYTHON), from PyPI
#   bench/gpu_setup.sh --wheels DIR    from the wheels in DIR only (a machine without PyPI: docs/gpu.md says how)
#
# Packages already installed at a version the pins accept stay (pip does not reinstall them). A torch that already
# sees a CUDA GPU stays too, whatever its version (labkit needs torch >= 2.4; the check records the version it ran
# with): replacing a machine's CUDA torch would download gigabytes. Prints the versions it leaves, and the time.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
WHEELS=""
while [ $# -gt 0 ]; do
  case "$1" in
    --wheels) WHEELS=$2; shift 2 ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "gpu_setup: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
start=$(date +%s)

pin() {  # NAME: its line in requirements.txt (NAME==VERSION)
  local line
  line=$(grep -i -E "^$1==" requirements.txt | head -1) || { echo "gpu_setup: $1 is not pinned in requirements.txt" >&2; exit 1; }
  echo "$line"
}
specs=()
for name in transformers tokenizers peft trl accelerate bitsandbytes datasets rouge_score pydantic PyYAML psutil tqdm \
            numpy pandas jsonschema gguf mistune bleach; do
  specs+=("$(pin "$name")")
done
specs+=(ipython)
if "$PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  echo "gpu_setup: keeping the installed torch $("$PYTHON" -c 'import torch; print(torch.__version__)') (it sees a CUDA GPU)"
  specs+=("torch>=2.4")
else
  specs+=("$(pin torch)")
fi

pip_args=(--disable-pip-version-check --no-input --progress-bar off)
[ -n "$WHEELS" ] && pip_args+=(--no-index --find-links "$WHEELS")
"$PYTHON" -m pip install "${pip_args[@]}" "${specs[@]}"
# labkit itself, without its dependencies (the notebooks' and the tracking's packages are not needed here)
"$PYTHON" -m pip install "${pip_args[@]}" --no-deps --no-build-isolation -e . \
  || "$PYTHON" -m pip install "${pip_args[@]}" --no-deps -e .
"$PYTHON" - <<'EOF'
import importlib.metadata as md
names = ["torch", "transformers", "peft", "trl", "accelerate", "bitsandbytes", "datasets", "labkit"]
print("gpu_setup: " + ", ".join(f"{n} {md.version(n)}" for n in names))
EOF
echo "gpu_setup: done in $(( $(date +%s) - start )) s; next: $PYTHON bench/gpu_check.py"
