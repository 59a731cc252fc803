#!/bin/sh
# sumo's Adasum against Horovod's CPU Adasum in one process (bench/horovod_adasum.cc), under
# mpirun at each rank count of NPS (default "2 4"). Horovod's sources come from its sdist,
# downloaded and extracted under build/horovod/ (never committed); when it cannot be had the
# script says so in one line and exits 0. Run from the repository root after make.
#   CALLS=N  timed calls per row (default: 400 up to 64 KiB, 100 at 1 MiB, 15 at 64 MiB)
set -eu
BUILD=${BUILD:-build}
DIR=$BUILD/horovod
VERSION=0.28.1
SDIST=$DIR/horovod-$VERSION.tar.gz
SRC=$DIR/horovod-$VERSION/horovod/common/ops/adasum
PYTHON=${PYTHON:-python3}
mkdir -p "$DIR"
if [ ! -f "$SDIST" ]; then
    if ! "$PYTHON" -m pip download "horovod==$VERSION" --no-deps --no-binary :all: -d "$DIR" \
        >"$DIR/download.log" 2>&1 || [ ! -f "$SDIST" ]; then
        echo "horovod_adasum: skipped, Horovod $VERSION's sdist is not at hand (pip download failed, see $DIR/download.log)"
        exit 0
    fi
fi
[ -d "$SRC" ] || tar -xzf "$SDIST" -C "$DIR"
# Horovod's Adasum files, unmodified, beside the shim of the headers they include.
TREE=$DIR/tree/horovod/common
mkdir -p "$TREE/ops/adasum" "$TREE/mpi"
cp "$SRC/adasum.h" "$SRC/adasum_mpi.h" "$SRC/adasum_mpi.cc" "$TREE/ops/adasum/"
cp bench/horovod_shim/common.h bench/horovod_shim/controller.h bench/horovod_shim/global_state.h "$TREE/"
cp bench/horovod_shim/mpi/mpi_context.h "$TREE/mpi/"
MPICXX=${MPICXX:-mpicxx}
# Horovod builds its CPU ops with -mavx -mfma -mf16c (setup.py / CMakeLists), -O3.
"$MPICXX" -std=c++14 -O3 -mavx -mfma -mf16c -Iinclude -I"$DIR/tree" \
    bench/horovod_adasum.cc "$TREE/ops/adasum/adasum_mpi.cc" \
    -L"$BUILD" -lsumo_mpi -lsumo -Wl,-rpath,"$(cd "$BUILD" && pwd)" -o "$DIR/horovod_adasum"
export OMPI_ALLOW_RUN_AS_ROOT=${OMPI_ALLOW_RUN_AS_ROOT:-1} OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=${OMPI_ALLOW_RUN_AS_ROOT_CONFIRM:-1}
for np in ${NPS:-2 4}; do
    mpirun --oversubscribe -np "$np" "$DIR/horovod_adasum" ${CALLS:-}
done
