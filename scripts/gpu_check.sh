#!/usr/bin/env bash
# The GPU check (scripts/gpu_check.py), ready for a short GPU slot: about 4 minutes on one H200, 8 at most.
#
#   bash scripts/gpu_check.sh OUT_DIR [gpu_check.py options]      # PYTHON=... picks the interpreter
#
# The GPU machine has torch and transformers but no network: this tree runs as it is, from src/, with none of
# the package's pinned dependencies installed. A call carries at most 64 MiB of working tree: if the tracked tree has
# grown past that, untrack what this does not read for the call, as scripts/gpu_drafter.sh's header says.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: bash scripts/gpu_check.sh OUT_DIR [gpu_check.py options]}
shift
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
python=${PYTHON:-python3}
timeout 480 "$python" scripts/gpu_check.py "$out" "$@"
