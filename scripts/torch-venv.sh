#!/usr/bin/env bash
# A virtual environment with the current torch 2.x wheel, pytest and torchft from PyPI, for
# testing sumo.torch beside Debian's python3-torch 1.13. Prints the environment's python on
# the last line of its output. Made once: a stamp file holding what was asked for marks a
# finished environment, which is reused as long as the request is the same; anything else (a
# half made one, another request) is made afresh.
#
#   scripts/torch-venv.sh                  # build/torch-venv
#   SUMO_TORCH_VENV=DIR scripts/torch-venv.sh
#   SUMO_TORCH_SPEC='torch==2.5.1' scripts/torch-venv.sh
#
# The wheel brings torch's CUDA libraries with it (about 3 GB; PyPI has no CPU-only Linux
# wheel), which sumo does not use. pip keeps its download cache, so making it again (after
# `make clean`) does not download it again.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${SUMO_TORCH_VENV:-build/torch-venv}
spec=${SUMO_TORCH_SPEC:-torch>=2,<3}
# Debian's interpreter: its venv module comes with python3-venv (scripts/deps.sh).
base=${SUMO_VENV_PYTHON:-/usr/bin/python3}
want="$spec pytest"
stamp=$venv/sumo-torch-venv.stamp

if ! { [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && "$venv/bin/python" -c "import torch, pytest" 2> /dev/null; }; then
  echo "torch-venv: making $venv ($want) with $base" >&2
  start=$(date +%s)
  rm -rf "$venv"
  "$base" -m venv "$venv" >&2
  "$venv/bin/python" -m pip install -q --upgrade pip >&2
  "$venv/bin/python" -m pip install -q "$spec" pytest >&2
  # -W: the wheel warns at import that numpy is missing, which sumo does not need.
  "$venv/bin/python" -W "ignore:Failed to initialize NumPy" -c "import torch, pytest" >&2
  echo "$want" > "$stamp"
  echo "torch-venv: $("$venv/bin/python" -W "ignore:Failed to initialize NumPy" -c 'import torch; print("torch", torch.__version__)') in $(( $(date +%s) - start )) s" >&2
fi

# torchft, for tests/python/diloco_torchft.py (sumo's DiLoCo beside torchft's): added to an
# environment that lacks it, with the environment's torch pinned so pip cannot swap it. Its
# 0.2.0 needs torch >= 2.7; an older SUMO_TORCH_SPEC goes without (run.sh says so).
if ! "$venv/bin/python" -c "import torchft" 2> /dev/null; then
  torch_version=$("$venv/bin/python" -c "import torch; print(torch.__version__.split('+')[0])" 2> /dev/null)
  if "$venv/bin/python" -c "
import sys; v = tuple(int(x) for x in '$torch_version'.split('.')[:2]); sys.exit(0 if v >= (2, 7) else 1)"; then
    echo "torch-venv: adding torchft==0.2.0 to $venv" >&2
    "$venv/bin/python" -m pip install -q torchft==0.2.0 "torch==$torch_version" >&2
  fi
fi
echo "$venv/bin/python"
