// The few Horovod types its CPU Adasum (horovod/common/ops/adasum/) names, for
// bench/horovod_adasum.cc: just enough to compile adasum.h and adasum_mpi.cc unmodified.
// bench/horovod_adasum.sh copies this tree next to Horovod's sources under build/.
#ifndef HOROVOD_SHIM_COMMON_H
#define HOROVOD_SHIM_COMMON_H

#include <cassert>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#define MPI_ALLREDUCE "MPI_ALLREDUCE"

namespace horovod {
namespace common {

enum class DataType { HOROVOD_FLOAT16, HOROVOD_FLOAT32, HOROVOD_FLOAT64 };

struct TensorTableEntry {
  int32_t process_set_id = 0;
};

} // namespace common
} // namespace horovod

#endif
