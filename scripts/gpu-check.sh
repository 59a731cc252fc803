#!/usr/bin/env bash
# The CUDA path's whole check on a machine with an NVIDIA GPU, in one run (docs/gpu.md):
#
#   scripts/gpu-check.sh OUTDIR
#
#  1. prints the device, the driver, nvcc and the NCCL it will use;
#  2. builds libsumo, libsumo_cuda, test_cuda and cuda_adasum (warnings as errors; should a
#     compiler other than CI's find a new warning, once more without, saying so);
#  3. runs test_cuda (host and device tests), then its device tests under compute-sanitizer
#     memcheck and racecheck (quick sizes);
#  4. runs sumo.torch's CUDA tests (tests/python/test_torch_cuda.py): one rank on the threads
#     transport, then over sumo's NCCL transport under torchrun, one rank per GPU (2 where
#     there are 2 GPUs, else 1: NCCL takes one GPU per rank), then over the shared-memory
#     transport under torchrun with 2 and 4 processes on GPU 0 (CUDA IPC between them), then
#     on the hierarchical path (CUDA IPC inside a host, NCCL between hosts: one host of 2
#     processes on GPU 0, and 2 simulated hosts of one rank each where there are 2 GPUs);
#  5. runs the benchmarks: the fused Adasum combine (bench/cuda_adasum) and the torch
#     compositions on the same GPU (bench/torch_adasum_cuda.py), a CNN training step at one
#     rank (bench/torch_cuda_step.py: DDP's NCCL against sumo's average and Adasum hooks on the
#     threads and the NCCL transports), then 2 and 4 ranks sharing the GPU under torchrun (DDP
#     with gloo against the hooks over shared memory and CUDA IPC);
#  6. writes OUTDIR/results.md (the tables, the steps' outcomes), the benchmarks' CSV files and
#     OUTDIR/log.txt (everything printed). At most 8 files, none in subfolders.
#
# Every step runs under a time limit and its outcome is recorded; the script goes on after a
# failed step and exits non-zero at the end if any failed. Budget: under 6 minutes on one
# H100 or H200 (each step's limit is its ceiling, not its expected time).
set -euo pipefail

out=${1:?usage: scripts/gpu-check.sh OUTDIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$(dirname "$0")/.."
exec > >(tee "$out/log.txt") 2>&1

start=$(date +%s)
status=0
summary=()
# step NAME LIMIT_S COMMAND...: prints the command, runs it under the limit, records the outcome.
step() {
  local name=$1 limit=$2
  shift 2
  echo
  echo "=== $name: $*"
  local t0=$(date +%s) rc=0
  timeout -k 10 "$limit" "$@" || rc=$?
  local took=$(( $(date +%s) - t0 ))
  if [ "$rc" -eq 0 ]; then
    summary+=("| $name | ok | ${took} s |")
  else
    [ "$rc" -eq 124 ] && why="timed out after ${limit} s" || why="exit $rc"
    summary+=("| $name | FAILED ($why) | ${took} s |")
    status=1
  fi
  echo "=== $name: exit $rc, ${took} s"
}

CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
export PATH="$CUDA_HOME/bin:$PATH"
jobs=$(nproc)
python=${PYTHON:-python3}

echo "=== device"
nvidia-smi -L || true
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv || true
nvcc --version | tail -2 || true
command -v compute-sanitizer || ls "$CUDA_HOME"/bin/compute-sanitizer 2>/dev/null || true

# NCCL: the one PyTorch loads (its wheel's), else one in CUDA's folders; the NCCL test at one
# rank then must run (SUMO_CUDA_TEST_REQUIRE_NCCL).
if [ -z "${SUMO_NCCL_LIBRARY:-}" ]; then
  SUMO_NCCL_LIBRARY=$("$python" - <<'EOF' 2>/dev/null || true
import torch, torch.cuda.nccl
torch.cuda.nccl.version()
for line in open("/proc/self/maps"):
    if "libnccl" in line:
        print(line.split()[-1])
        break
EOF
)
  if [ -z "$SUMO_NCCL_LIBRARY" ]; then
    SUMO_NCCL_LIBRARY=$(ls "$CUDA_HOME"/lib*/libnccl.so.2 "$CUDA_HOME"/targets/*/lib/libnccl.so.2 2>/dev/null | head -1 || true)
  fi
fi
if [ -n "$SUMO_NCCL_LIBRARY" ]; then
  export SUMO_NCCL_LIBRARY SUMO_CUDA_TEST_REQUIRE_NCCL=1
  echo "NCCL: $SUMO_NCCL_LIBRARY"
else
  echo "NCCL: not found (the NCCL test at one rank will say so and not run)"
fi

step "build" 300 make -j"$jobs" NO_MPI=1 cuda
if ! [ -x build/tests/test_cuda ] || ! [ -x build/bench/cuda_adasum ]; then
  echo "(the build with warnings as errors failed: once more without, to measure)"
  step "build, warnings not errors" 300 make -j"$jobs" NO_MPI=1 WARN="-Wall -Wextra" NVCC_WERROR= cuda
fi

sanitizer=$(command -v compute-sanitizer || echo "$CUDA_HOME/bin/compute-sanitizer")
step "test_cuda" 300 build/tests/test_cuda
if ! nvidia-smi -L > /dev/null 2>&1; then
  # Without a GPU the device tests and benchmarks only skip: say so rather than report them.
  summary+=("| device | FAILED (no GPU: nvidia-smi -L finds none; device tests and benchmarks not run) | 0 s |")
  status=1
  skip_device=1
fi
if [ -z "${skip_device:-}" ]; then
step "memcheck" 300 "$sanitizer" --tool memcheck --error-exitcode 1 build/tests/test_cuda --device-only --quick
step "racecheck" 300 "$sanitizer" --tool racecheck --racecheck-report all --error-exitcode 1 \
  build/tests/test_cuda --device-only --quick

export PYTHONUNBUFFERED=1
step "cuda_adasum" 240 build/bench/cuda_adasum --csv "$out/cuda_adasum.csv"
step "torch_adasum_cuda" 300 "$python" bench/torch_adasum_cuda.py --csv "$out/torch_adasum.csv" \
  --fused "$out/cuda_adasum.csv" --table "$out/tables.md"

# sumo.torch on CUDA tensors: one rank; NCCL, one rank per GPU (it refuses two ranks on one
# device); the shared-memory transport, several processes on one GPU over CUDA IPC.
pytest_args=(-m pytest -q -rs --color=no -p no:cacheprovider -W "ignore:Failed to initialize NumPy"
             tests/python/test_torch_cuda.py)
export SUMO_TIMEOUT=${SUMO_TIMEOUT:-60}
step "torch CUDA tests, one rank (threads transport)" 150 "$python" "${pytest_args[@]}"
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
nccl_ranks=$(( gpus >= 2 ? 2 : 1 ))
step "torch CUDA tests, NCCL transport, $nccl_ranks rank(s) under torchrun" 150 \
  env SUMO_TEST_TRANSPORT=nccl "$python" -m torch.distributed.run --standalone \
  --nproc_per_node "$nccl_ranks" "${pytest_args[@]}"
if [ "$nccl_ranks" -lt 2 ]; then
  summary+=("| torch CUDA tests, NCCL, 2 ranks | not run: one GPU (NCCL takes one GPU per rank) | 0 s |")
fi
for ipc_ranks in 2 4; do
  step "torch CUDA tests, shm transport over CUDA IPC, $ipc_ranks processes on GPU 0" 120 \
    env SUMO_TEST_TRANSPORT=shm CUDA_VISIBLE_DEVICES=0 "$python" -m torch.distributed.run \
    --standalone --nproc_per_node "$ipc_ranks" "${pytest_args[@]}"
done
# The hierarchical path (sumo_comm_create_hier: CUDA IPC inside a host, NCCL between hosts): one host of
# 2 processes on GPU 0 (an NCCL communicator of one rank per local rank); with 2 GPUs, 2 ranks
# as 2 simulated hosts, NCCL between them.
step "torch CUDA tests, hierarchical, one host of 2 processes on GPU 0" 120 \
  env SUMO_TEST_TRANSPORT=hierarchical CUDA_VISIBLE_DEVICES=0 "$python" -m torch.distributed.run \
  --standalone --nproc_per_node 2 "${pytest_args[@]}"
if [ "$gpus" -ge 2 ]; then
  step "torch CUDA tests, hierarchical, 2 hosts of 1 (NCCL between GPUs 0 and 1)" 120 \
    env SUMO_TEST_TRANSPORT=hierarchical SUMO_LOCAL_SIZE=1 "$python" -m torch.distributed.run \
    --standalone --nproc_per_node 2 "${pytest_args[@]}"
else
  summary+=("| torch CUDA tests, hierarchical, 2 hosts | not run: one GPU (NCCL takes one GPU per rank) | 0 s |")
fi
step "torch_cuda_step" 180 "$python" bench/torch_cuda_step.py --csv "$out/torch_step.csv" --table "$out/tables.md"
# N ranks sharing the GPU(s) under torchrun: DDP with gloo against sumo's hooks over shared
# memory and CUDA IPC (issue 30 item 5); the CSV of each N beside the one-rank one.
for n in 2 4; do
  step "torch_cuda_step, $n ranks under torchrun" 150 "$python" -m torch.distributed.run \
    --standalone --nproc_per_node "$n" bench/torch_cuda_step.py --steps 30 --warmup 5 \
    --csv "$out/torch_step_$n.csv" --table "$out/tables.md"
done
fi

{
  echo "# sumo CUDA check: $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)"
  echo
  echo "Run by scripts/gpu-check.sh at commit $(git rev-parse --short HEAD 2>/dev/null || echo '?') on $(date -u +%Y-%m-%dT%H:%MZ);"
  echo "driver $(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1), $(nvcc --version | tail -1)."
  echo
  echo "| step | outcome | time |"
  echo "|---|---|---|"
  printf '%s\n' "${summary[@]}"
  echo
  [ -f "$out/tables.md" ] && cat "$out/tables.md"
} > "$out/results.md"
rm -f "$out/tables.md"

echo
cat "$out/results.md"
echo "=== gpu-check finished in $(( $(date +%s) - start )) s, status $status"
exit $status
