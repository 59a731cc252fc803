#!/usr/bin/env bash
# The whole test suite, as CI runs it: dependencies, a warnings-as-errors build, the unit,
# MPI and command tests, the MPI fault suite, the fuzzers for 8 s each, then the unit
# tests under ASan+UBSan and the threaded ones under TSan.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${SUMO_SKIP_SLURM:-0}" = 1 ]; then ./scripts/deps.sh; else ./scripts/deps.sh --slurm; fi
jobs=$(nproc)
start=$(date +%s)

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Waits in the tests are bounded; nothing should come near this.
export SUMO_TIMEOUT=${SUMO_TIMEOUT:-120}

status=0 passed=0 failed=0
step() {
  echo "=== $*"
  local t0=$(date +%s)
  if "$@"; then passed=$((passed + 1)); else echo "=== FAILED: $*"; status=1; failed=$((failed + 1)); fi
  echo "=== $1 took $(( $(date +%s) - t0 )) s"
}

step make -j"$jobs"
step ./scripts/check-layers
step make test
# make install into a scratch prefix; a program built with pkg-config against it.
step make test-install
# The PyTorch binding (python/sumo) under Debian's torch 1.13 and under torch 2.x from PyPI
# (build/torch-venv, made by scripts/torch-venv.sh on the first run): pytest alone and under
# mpirun -np 2 and 3, and a rank killed mid-training. SUMO_SKIP_TORCH=1 (or venv, debian)
# skips, saying so; otherwise a missing torch or pytest fails the step.
step tests/python/run.sh
# The package as a user installs it: sdist, a wheel built from it alone, a fresh venv with
# torch 2.x and no checkout on the path, `python -m sumo` and test_torch/test_abi against it
# (about 2 minutes on two busy cores; skipped with the torch 2.x environment).
step tests/python/wheel.sh
# A real one-node Slurm started for the test: srun -n 2 and -n 3 of sumo train (the threads
# transport's bits) and of the binding's check, srun --mpi=pmix, and docs/cli.md's sbatch
# example. Skipped with one line where Slurm cannot start (not root) or SUMO_SKIP_SLURM=1.
step tests/slurm/run.sh
# Across hosts for real: 2 hosts of 2 ranks as network namespaces on a shaped switch
# (scripts/net-hosts.sh), torchrun, sumo.launch's served store and mpirun across them, and
# `sumo train` under mpirun. Needs root and ip; SUMO_SKIP_NET=1 skips it, saying so.
step tests/net/run.sh
# A rank stopped, killed or leaving early under mpirun ends the job within the deadline.
step make test-faults
# Each fuzzer (IDX, checkpoint, command line, store records, the TCP meeting and frames) for
# 8 s from the kept corpus (a smoke run in CI time: longer runs are
# `make fuzz FUZZ_SECONDS=N`); skipped, saying so, without clang.
step make fuzz FUZZ_SECONDS=${FUZZ_SECONDS:-8}
step make -j"$jobs" SAN=asan test-unit
step make -j"$jobs" SAN=tsan test-threads
step ./build/sumo bench --quick
# The experiments' small versions: each checks its table and plot are produced and well formed.
for e in e1 e2 e3 e4; do step ./scripts/experiment $e --quick; done
# The scripts: deps.sh's SUMO_NO_PYTHON switch, check-recorded's verdicts, experiment's refusals.
step tests/cli/test_scripts.sh
# A recorded E1, E2 and E4 row per method, re-run: a change of training bits needs new results.
step ./scripts/check-recorded

echo "=== tests finished in $(( $(date +%s) - start )) s"
echo "test steps: $passed passed, $failed failed"
exit $status
