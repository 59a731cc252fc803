// Shim (see ../common.h): the MPI context, the global communicator only.
#ifndef HOROVOD_SHIM_MPI_CONTEXT_H
#define HOROVOD_SHIM_MPI_CONTEXT_H

#include <mpi.h>

#include "../common.h"

namespace horovod {
namespace common {

struct MPIContext {
  MPI_Comm mpi_comm = MPI_COMM_WORLD;
  MPI_Datatype GetMPIDataType(DataType t) const {
    return t == DataType::HOROVOD_FLOAT64 ? MPI_DOUBLE
           : t == DataType::HOROVOD_FLOAT32 ? MPI_FLOAT
                                            : MPI_UINT16_T;
  }
};

} // namespace common
} // namespace horovod

#endif
