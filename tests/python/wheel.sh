#!/usr/bin/env bash
# The package as a user gets it: an sdist made by the build backend (pyproject.toml,
# setup.py), a wheel built from that sdist alone (its own `make shared`, so a file the sdist
# lacks fails here), installed into a fresh virtual environment that sees neither Debian's
# packages nor the checkout, with the torch 2.x of build/torch-venv (scripts/torch-venv.sh)
# added through a .pth file instead of a second 5 GB install. Then, from a temporary folder:
# `python -m sumo`, which must name the package's own library, torchrun of the Horovod-style
# example with nothing set, and the binding's single-process
# tests (test_torch.py, test_abi.py, test_slurm.py) against the installed package
# (SUMO_TEST_INSTALLED=1; they still read the checkout's headers and C drivers, as references).
#
# Skips, saying so, as run.sh does: SUMO_SKIP_TORCH=1 or venv, SUMO_NO_PYTHON=1.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
skip=${SUMO_SKIP_TORCH:-}
[ "${SUMO_NO_PYTHON:-0}" = 1 ] && [ -z "$skip" ] && skip=1
case "$skip" in
  1 | all | venv) echo "wheel: skipped (SUMO_SKIP_TORCH=$skip or SUMO_NO_PYTHON=1: no torch 2.x environment)"; exit 0 ;;
esac
start=$(date +%s)
torch_py=$(scripts/torch-venv.sh | tail -1)
torch_site=$("$torch_py" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
log=$tmp/build.log
fail() { echo "FAIL - wheel: $*"; tail -30 "$log" 2> /dev/null; exit 1; }

# The sdist through the backend's PEP 517 hook, and the wheel from it, both with the torch
# environment's setuptools (no download: --no-build-isolation).
sdist=$("$torch_py" -c "import sys; from setuptools import build_meta as b; print(b.build_sdist(sys.argv[1]))" \
        "$tmp/dist" 2> "$log" | tail -1) || fail "build_sdist"
version=$(sed -n 's/^#define SUMO_VERSION_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\).*/\2/p' include/sumo.h | paste -sd.)
[ "$sdist" = "sumo-$version.tar.gz" ] || fail "the sdist is $sdist, expected sumo-$version.tar.gz (include/sumo.h)"
echo "ok   - sdist $sdist ($(( $(date +%s) - start )) s)"
"$torch_py" -m pip wheel -q --no-deps --no-build-isolation -w "$tmp/dist" "$tmp/dist/$sdist" > "$log" 2>&1 \
  || fail "pip wheel from the sdist"
wheel=$(cd "$tmp/dist" && ls sumo-*.whl)
libs=$("$torch_py" -c "import sys, zipfile; print(' '.join(n[len('sumo/_libs/'):] for n in zipfile.ZipFile(sys.argv[1]).namelist() if n.startswith('sumo/_libs/')))" "$tmp/dist/$wheel")
echo "ok   - wheel $wheel from the sdist, with $libs ($(( $(date +%s) - start )) s)"
case " $libs " in *" libsumo.so.0 "*) ;; *) fail "the wheel has no sumo/_libs/libsumo.so.0" ;; esac
if command -v mpicc > /dev/null; then
  case " $libs " in *" libsumo_mpi.so.0 "*) ;; *) fail "mpicc is here, the wheel has no libsumo_mpi.so.0" ;; esac
fi

# A venv of Debian's python without its packages (no torch 1.13, no pip of its own): the wheel
# goes in with the torch environment's pip, torch and pytest come through the .pth file.
/usr/bin/python3 -m venv --without-pip "$tmp/venv"
py=$tmp/venv/bin/python
site=$("$py" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
echo "$torch_site" > "$site/torch-venv.pth"
"$torch_py" -m pip --python "$py" install -q --no-deps --no-index "$tmp/dist/$wheel" > "$log" 2>&1 \
  || fail "pip install $wheel"

mkdir "$tmp/run"
cd "$tmp/run"
unset PYTHONPATH SUMO_LIBRARY
report=$("$py" -W "ignore:Failed to initialize NumPy" -m sumo 2>&1) || { echo "$report"; fail "python -m sumo"; }
echo "$report" | sed 's/^/     /'
grep -q "^sumo: *$version (package $version)" <<< "$report" || fail "python -m sumo does not say $version for library and package"
grep -q "^library: .*$tmp/venv/.*(the package's own)" <<< "$report" || fail "python -m sumo: the library is not the package's own"
case "$("$py" -c 'import sumo; print(sumo.__file__)')" in
  "$tmp/venv/"*) ;; *) fail "sumo is not imported from the venv" ;;
esac
# The package's library comes first, before SUMO_LIBRARY.
SUMO_LIBRARY=/nonexistent/libsumo.so.0 "$py" -c "import sumo._lib as l, sys; sys.exit(l.SOURCE != \"the package's own\")" \
  || fail "SUMO_LIBRARY was preferred to the package's own library"

# What a user does next: torchrun of the Horovod-style example, nothing else set.
t0=$(date +%s)
timeout -k 10 300 "$py" -W "ignore:Failed to initialize NumPy" -m torch.distributed.run --standalone \
  --nproc_per_node 2 "$root/examples/horovod_style.py" --epochs 1 --train-limit 1000 --test-limit 200 \
  --check-replicas > "$log" 2>&1 || fail "torchrun --nproc_per_node 2 examples/horovod_style.py"
# Counted as occurrences, not lines: the two processes' prints may land on one line.
[ "$(grep -o 'replicas identical: True' "$log" | wc -l)" = 2 ] || fail "torchrun of the example: the replicas differ"
echo "ok   - torchrun --nproc_per_node 2 examples/horovod_style.py with the installed package ($(( $(date +%s) - t0 )) s)"

SUMO_TEST_INSTALLED=1 SUMO_TIMEOUT=${SUMO_TIMEOUT:-60} timeout -k 10 600 "$py" -m pytest -q --color=no \
  -p no:cacheprovider -W "ignore:Failed to initialize NumPy" \
  "$root/tests/python/test_torch.py" "$root/tests/python/test_abi.py" "$root/tests/python/test_slurm.py" || fail "pytest against the installed wheel"
echo "ok   - wheel: sdist, wheel, fresh venv and the binding's tests against it in $(( $(date +%s) - start )) s"
