// sumo's Adasum against Horovod's CPU Adasum (horovod/common/ops/adasum/adasum.h and
// adasum_mpi.cc, unmodified, compiled against bench/horovod_shim), the same inputs, calls
// alternating in one process. Built and run by bench/horovod_adasum.sh under mpirun.
//
// Horovod's side is called as its AdasumMPIAllreduceOp::Execute calls it for a fused
// response: the tensors packed in one fusion buffer, DispatchFusedAllreduce with the tensor
// counts, start level 1, the global communicator, tag 0, the VHDD reduction communicators
// and its receive buffer. sumo's: sumo_allreduce in place with an op carrying the same layout
// (sumo_op_create_adasum), over sumo_comm_create_mpi.
//
// A call's time is the slowest rank's, from a barrier to its return; each row prints the
// medians and their ratio (sumo / Horovod), and how far the two results are apart (relative
// L2; Horovod's tree for a power of two of ranks is sumo's, so only rounding differs).
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "horovod/common/ops/adasum/adasum_mpi.h"
#include "sumo.h"
#include "sumo_mpi.h"

using horovod::common::AdasumMPI;
using horovod::common::DataType;
using horovod::common::HorovodGlobalState;
using horovod::common::MPIContext;
using horovod::common::TensorTableEntry;

namespace {

class HorovodAdasum : public AdasumMPI {
public:
  HorovodAdasum(MPIContext* ctx, HorovodGlobalState* state) : AdasumMPI(ctx, state), state_(state) {}

  // Execute's steps after the fusion buffer is filled (no prescale or postscale).
  void Run(float* fused, size_t bytes, const std::vector<int>& counts) {
    if (!reduction_comms_initialized) InitializeVHDDReductionComms();
    std::vector<TensorTableEntry> entries(counts.size());
    std::vector<int> tensor_counts(counts);
    uint8_t* recv_buffer = GetRecvBuffer((int)bytes);
    DispatchFusedAllreduce(entries, fused, recv_buffer, tensor_counts, 1, mpi_context_->mpi_comm, 0,
                           reduction_comms_, DataType::HOROVOD_FLOAT32, state_);
  }

private:
  HorovodGlobalState* state_;
};

struct Row {
  const char* name;
  size_t bytes;
  int tensors;
};

double now_us() { return MPI_Wtime() * 1e6; }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// The slowest rank's time for one call, started together.
template <typename F> double timed(F&& call) {
  MPI_Barrier(MPI_COMM_WORLD);
  double t0 = now_us();
  call();
  double t = now_us() - t0;
  MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return t;
}

int calls_for(size_t bytes, int fixed) {
  if (fixed > 0) return fixed;
  return bytes <= (64u << 10) ? 400 : bytes <= (1u << 20) ? 100 : 15;
}

} // namespace

int main(int argc, char** argv) {
  int provided;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank, size;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  int fixed_calls = argc > 1 ? std::atoi(argv[1]) : 0;
  const Row rows[] = {{"one tensor, 4 KiB", 4u << 10, 1},
                      {"50 tensors, 4 KiB in all", 4u << 10, 50},
                      {"50 tensors, 64 KiB in all", 64u << 10, 50},
                      {"one tensor, 1 MiB", 1u << 20, 1},
                      {"one tensor, 64 MiB", 64u << 20, 1}};

  sumo_comm* comm = nullptr;
  if (sumo_comm_create_mpi(MPI_COMM_WORLD, &comm) != SUMO_SUCCESS) {
    std::fprintf(stderr, "horovod_adasum: sumo_comm_create_mpi failed\n");
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPIContext ctx;
  HorovodGlobalState state;
  HorovodAdasum horovod(&ctx, &state);

  if (rank == 0) {
    const char* isa = "?";
    sumo_kernel_isa(&isa);
    char version[MPI_MAX_LIBRARY_VERSION_STRING];
    int len;
    MPI_Get_library_version(version, &len);
    version[strcspn(version, ",\n")] = 0;
    std::printf("# sumo Adasum vs Horovod 0.28.1 CPU Adasum (adasum_mpi.cc), P = %d, fp32, in place\n"
                "# %s; sumo kernels: %s; calls alternate sumo, Horovod on the same inputs\n"
                "# time = median over calls of the slowest rank's time; ratio = sumo / Horovod\n",
                size, version, isa);
    std::printf("# %-28s %7s %11s %13s %7s %10s\n", "call", "calls", "sumo(us)", "horovod(us)",
                "ratio", "rel.diff");
  }
  int failed = 0;
  for (const Row& row : rows) {
    size_t n = row.bytes / sizeof(float);
    std::vector<int> counts(row.tensors);
    std::vector<size_t> scounts(row.tensors);
    for (int t = 0; t < row.tensors; t++) {
      scounts[t] = n / row.tensors + ((size_t)t < n % row.tensors ? 1 : 0);
      counts[t] = (int)scounts[t];
    }
    sumo_op op = SUMO_OP_ADASUM;
    if (row.tensors > 1) {
      sumo_adasum_options o;
      sumo_adasum_options_default(&o);
      o.tensor_counts = scounts.data();
      o.ntensors = scounts.size();
      if (sumo_op_create_adasum(comm, &o, &op) != SUMO_SUCCESS) MPI_Abort(MPI_COMM_WORLD, 1);
    }
    std::vector<float> input(n), a(n), b(n);
    std::mt19937 gen(1234 + 77 * rank);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    for (auto& v : input) v = dist(gen);
    int calls = calls_for(row.bytes, fixed_calls), warm = std::max(2, calls / 10);
    std::vector<double> ts, th;
    for (int i = 0; i < warm + calls; i++) {
      std::memcpy(a.data(), input.data(), row.bytes);
      std::memcpy(b.data(), input.data(), row.bytes);
      sumo_result r = SUMO_SUCCESS;
      double t1 = timed([&] { r = sumo_allreduce(a.data(), a.data(), n, SUMO_FLOAT32, op, comm); });
      double t2 = timed([&] { horovod.Run(b.data(), row.bytes, counts); });
      if (r != SUMO_SUCCESS) failed = 1;
      if (i >= warm) {
        ts.push_back(t1);
        th.push_back(t2);
      }
    }
    double e2 = 0, r2 = 0;
    for (size_t i = 0; i < n; i++) {
      double d = (double)a[i] - (double)b[i];
      e2 += d * d;
      r2 += (double)b[i] * (double)b[i];
    }
    double rel = r2 > 0 ? std::sqrt(e2 / r2) : std::sqrt(e2);
    MPI_Allreduce(MPI_IN_PLACE, &rel, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    double ms = median(ts), mh = median(th);
    if (rank == 0)
      std::printf("  %-28s %7d %11.2f %13.2f %7.2f %10.1e\n", row.name, calls, ms, mh, ms / mh, rel);
    if (row.tensors > 1) sumo_op_destroy(comm, op);
  }
  MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (failed && rank == 0) std::printf("# a sumo call failed\n");
  sumo_comm_destroy(comm);
  MPI_Finalize();
  return failed;
}
