// Shim (see common.h): the parts of HorovodGlobalState the Adasum code reads.
#ifndef HOROVOD_SHIM_GLOBAL_STATE_H
#define HOROVOD_SHIM_GLOBAL_STATE_H

#include "common.h"
#include "controller.h"

namespace horovod {
namespace common {

struct ParameterManager {
  int64_t TensorFusionThresholdBytes() const { return 128 << 20; } // Horovod's default: 128 MiB
};

struct Timeline {
  void ActivityStartAll(const std::vector<TensorTableEntry>&, const std::string&) {}
  void ActivityEndAll(const std::vector<TensorTableEntry>&) {}
};

struct ProcessSet {
  Controller* controller;
};

struct ProcessSetTable {
  ProcessSet set;
  ProcessSet& Get(int32_t) { return set; }
};

struct HorovodGlobalState {
  ParameterManager parameter_manager;
  Timeline timeline;
  Controller controller_;
  Controller* global_controller = &controller_;
  ProcessSetTable process_set_table{ProcessSet{&controller_}};
  int64_t adasum_mpi_chunk_size = 1 << 30; // HOROVOD_ADASUM_MPI_CHUNK_SIZE's default
};

} // namespace common
} // namespace horovod

#endif
