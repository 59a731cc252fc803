#!/usr/bin/env bash
# `make install` into a scratch prefix, then a program built against it with pkg-config: once
# with the shared library (found through its soname at run time) and once statically; with
# MPI, the same for an MPI program over sumo-mpi. Also what the core library needs and exports.
set -euo pipefail
cd "$(dirname "$0")/../.."
prefix=$(mktemp -d)
trap 'rm -rf "$prefix"' EXIT
make --no-print-directory install PREFIX="$prefix" > /dev/null
export PKG_CONFIG_PATH=$prefix/lib/pkgconfig
for f in include/sumo.h include/sumo_shm.h lib/libsumo.a lib/libsumo.so lib/pkgconfig/sumo.pc; do
  [ -e "$prefix/$f" ] || { echo "install: $f missing"; exit 1; }
done
soname=$(objdump -p "$prefix/lib/libsumo.so" | awk '/SONAME/ {print $2}')
# The core needs the C library alone (libm, and libpthread where glibc still has one): MPI
# lives in libsumo_mpi.so, so a process that does not launch through MPI never loads it.
needed=$(readelf -d "$prefix/lib/libsumo.so" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
extra=$(grep -vxE 'libc\.so\.6|libm\.so\.6|libpthread\.so\.0' <<< "$needed" || true)
[ -z "$extra" ] || { echo "install: libsumo.so needs more than libc, libm and pthreads:" $extra; exit 1; }
echo "install: libsumo.so needs" $needed
# The shared library exports the public functions (sumo_, unversioned) and, under the private
# node SUMO_PRIVATE_<version>, the internals sumo's MPI plugin calls: exactly those it imports.
version=$(pkg-config --modversion sumo)
exports() { nm -D --defined-only "$1" | awk '$2 ~ /^[TDBRVWi]$/ {print $3}'; }
exported=$(exports "$prefix/lib/libsumo.so")
stray=$(grep -vE '^sumo_[a-z][a-z0-9_]*$|^sumo__[a-z0-9_]+@@SUMO_PRIVATE_'"${version//./\\.}"'$' <<< "$exported" || true)
[ -z "$stray" ] || { echo "install: libsumo.so exports symbols outside sumo_ and SUMO_PRIVATE_$version:"; head -20 <<< "$stray"; exit 1; }
private=$(grep '^sumo__' <<< "$exported" | sed 's/@.*//' | sort || true)
if [ -e "$prefix/lib/libsumo_mpi.so" ]; then
  wanted=$(nm -D --undefined-only "$prefix/lib/libsumo_mpi.so" | awk '$2 ~ /^sumo__/ {print $2}' | sed 's/@.*//' | sort)
  [ "$private" = "$wanted" ] || { echo "install: libsumo.so's private exports are not what libsumo_mpi.so imports:"; diff <(echo "$private") <(echo "$wanted"); exit 1; }
  stray=$(exports "$prefix/lib/libsumo_mpi.so" | grep -v '^sumo_[a-z]' || true)
  [ -z "$stray" ] || { echo "install: libsumo_mpi.so exports symbols outside sumo_:"; head -20 <<< "$stray"; exit 1; }
fi
echo "install: libsumo.so exports $(grep -c '^sumo_[a-z]' <<< "$exported") sumo_ symbols and $(grep -c . <<< "$private") for its MPI plugin under SUMO_PRIVATE_$version"
[ -e "$prefix/lib/$soname" ] || { echo "install: soname $soname missing"; exit 1; }
cat > "$prefix/check.c" <<'C'
#define SUMO_EXPERIMENTAL_API
#include <sumo.h>
#include <sumo_aggregation.h>
#include <sumo_diloco.h>
#include <sumo_distributed.h>
#include <sumo_ext.h>
#include <stdio.h>
static sumo_result rank_fn(sumo_comm *comm, int rank, void *arg)
{
    (void)arg;
    float x[3] = {(float)rank, 1.0f, 2.0f};
    return sumo_allreduce(x, x, 3, SUMO_FLOAT32, SUMO_OP_SUM, comm);
}
int main(void)
{
    int major = 0, minor = 0;
    sumo_version(&major, &minor, NULL);
    if (major != SUMO_VERSION_MAJOR || minor != SUMO_VERSION_MINOR) return 2;
    sumo_result r = sumo_threads_run(2, rank_fn, NULL, NULL);
    printf("installed sumo %d.%d: %s\n", major, minor, sumo_result_name(r));
    return r == SUMO_SUCCESS ? 0 : 1;
}
C
cc -std=c11 $(pkg-config --cflags sumo) "$prefix/check.c" $(pkg-config --libs sumo) -o "$prefix/check_shared"
LD_LIBRARY_PATH=$prefix/lib "$prefix/check_shared"
# ldd's output is taken whole first: `ldd | grep -q` under pipefail fails when grep stops
# reading early and ldd dies of SIGPIPE.
libs=$(ldd "$prefix/check_shared")
grep -q "$soname" <<< "$libs" || { echo "install: not linked to $soname"; exit 1; }
cc -std=c11 $(pkg-config --cflags sumo) "$prefix/check.c" "$prefix/lib/libsumo.a" $(pkg-config --libs-only-other --static sumo) -lm -o "$prefix/check_static"
"$prefix/check_static"

# With MPI: an MPI program built with pkg-config's sumo-mpi (and mpicc), run under mpirun on
# the shared plugin and on the static archives.
mpi_note="no MPI plugin installed"
if [ -e "$prefix/lib/libsumo_mpi.so" ]; then
  for f in include/sumo_mpi.h lib/libsumo_mpi.a lib/pkgconfig/sumo-mpi.pc; do
    [ -e "$prefix/$f" ] || { echo "install: $f missing"; exit 1; }
  done
  cat > "$prefix/check_mpi.c" <<'C'
#include <sumo_mpi.h>
#include <stdio.h>
int main(void)
{
    int initialized = 0, rank = 0;
    sumo_comm *comm = NULL;
    if (sumo_mpi_world_create(&initialized, &comm) != SUMO_SUCCESS) return 1;
    sumo_comm_rank(comm, &rank);
    double x[2] = {1.0, (double)rank};
    sumo_result r = sumo_allreduce(x, x, 2, SUMO_FLOAT64, SUMO_OP_SUM, comm);
    if (rank == 0) printf("installed sumo over MPI: %s, %g ranks\n", sumo_result_name(r), x[0]);
    sumo_result f = sumo_mpi_world_finalize(comm, initialized);
    return r == SUMO_SUCCESS && f == SUMO_SUCCESS ? 0 : 1;
}
C
  mpicc -std=c11 $(pkg-config --cflags sumo-mpi) "$prefix/check_mpi.c" $(pkg-config --libs sumo-mpi) -o "$prefix/check_mpi_shared"
  libs=$(ldd "$prefix/check_mpi_shared")
  grep -q libsumo_mpi.so.0 <<< "$libs" || { echo "install: not linked to libsumo_mpi.so.0"; exit 1; }
  mpicc -std=c11 $(pkg-config --cflags sumo-mpi) "$prefix/check_mpi.c" "$prefix/lib/libsumo_mpi.a" "$prefix/lib/libsumo.a" -lm -pthread -o "$prefix/check_mpi_static"
  mpi_note="no mpirun: MPI checks built, not run"
  if command -v mpirun > /dev/null; then
    for kind in shared static; do
      LD_LIBRARY_PATH=$prefix/lib timeout -k 10 120 mpirun -np 2 --oversubscribe --mca btl self,vader \
        -x LD_LIBRARY_PATH "$prefix/check_mpi_$kind"
    done
    mpi_note="MPI plugin shared and static under mpirun"
  fi
fi
echo "install: ok (soname $soname, pkg-config $(pkg-config --modversion sumo), $mpi_note)"
