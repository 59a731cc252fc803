#!/usr/bin/env bash
# `make install` into a scratch prefix, then a program built against it with pkg-config: once
# with the shared library (found through its soname at run time) and once statically.
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
# The shared library exports the public functions alone: sumo_ names, none of sumo__.
exported=$(nm -D --defined-only "$prefix/lib/libsumo.so" | awk '$2 ~ /^[TDBRVWi]$/ {print $3}')
stray=$(grep -v '^sumo_[a-z]' <<< "$exported" || true)
[ -z "$stray" ] || { echo "install: libsumo.so exports symbols outside sumo_:"; head -20 <<< "$stray"; exit 1; }
echo "install: libsumo.so exports $(wc -l <<< "$exported") symbols, all sumo_"
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
ldd "$prefix/check_shared" | grep -q "$soname" || { echo "install: not linked to $soname"; exit 1; }
cc -std=c11 $(pkg-config --cflags sumo) "$prefix/check.c" "$prefix/lib/libsumo.a" $(pkg-config --libs-only-other --static sumo) -lm -o "$prefix/check_static"
"$prefix/check_static"
echo "install: ok (soname $soname, pkg-config $(pkg-config --modversion sumo))"
