# sumo build. `make` builds the libraries, the `sumo` tool and the tests; `make test` runs the
# tests (unit tests, then the MPI tests under mpirun when MPI is installed);
# `make SAN=asan test` and `make SAN=tsan test-threads` run them under sanitizers.
#
# Layers live in src/<layer>/; a file ending in _mpi.c needs MPI and goes into libsumo_mpi.a
# and libsumo_mpi.so, everything else into libsumo.a and libsumo.so, which build and work
# without MPI (and libsumo.so needs nothing but libc and libm, so a process that never
# launches through MPI never loads it).

CC      ?= cc
MPICC   ?= $(shell command -v mpicc 2>/dev/null)
SAN     ?=
NO_MPI  ?=

ifeq ($(SAN),)
BUILD   ?= build
OPT     ?= -O2
else
BUILD   ?= build-$(SAN)
OPT     ?= -O1
NO_MPI  := 1
endif

ifneq ($(NO_MPI),)
MPICC :=
endif

WARN     := -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes -Wmissing-prototypes
CPPFLAGS := -Iinclude -Isrc -D_GNU_SOURCE
# -fvisibility=hidden: the shared library exports what the headers mark SUMO_API and, to the
# MPI plugin alone, the few sumo__ functions marked SUMO__PLUGIN_API (unit tests link the
# static libraries, where hidden symbols still resolve).
CFLAGS   := -std=c11 $(OPT) -g $(WARN) -fPIC -pthread -fno-strict-aliasing -fno-math-errno \
            -fvisibility=hidden $(EXTRA_CFLAGS)
LDLIBS   := -lm -pthread

ifeq ($(SAN),asan)
CFLAGS  += -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all
LDFLAGS += -fsanitize=address,undefined
endif
ifeq ($(SAN),tsan)
CFLAGS  += -fsanitize=thread -fno-omit-frame-pointer
LDFLAGS += -fsanitize=thread
endif

# The training driver (src/train) needs BLAS and zlib; the library proper needs neither.
ALL_SRCS   := $(wildcard src/*/*.c)
TRAIN_SRCS := $(wildcard src/train/*.c)
MPI_SRCS   := $(filter %_mpi.c,$(ALL_SRCS))
LIB_SRCS   := $(filter-out %_mpi.c $(TRAIN_SRCS),$(ALL_SRCS))
LIB_OBJS   := $(LIB_SRCS:%.c=$(BUILD)/%.o)
MPI_OBJS   := $(MPI_SRCS:%.c=$(BUILD)/%.o)
TRAIN_OBJS := $(TRAIN_SRCS:%.c=$(BUILD)/%.o)
TRAIN_LIBS := -lopenblas -lz

LIBSUMO       := $(BUILD)/libsumo.a
LIBSUMO_MPI   := $(BUILD)/libsumo_mpi.a
LIBSUMO_TRAIN := $(BUILD)/libsumo_train.a

# The shared libraries: the core, and the MPI transport as a plugin of its own beside it
# (linked with mpicc, so the plugin, not the core, records the libmpi dependency). Each soname
# changes with the major version.
SO_MAJOR      := $(shell sed -n 's/^\#define SUMO_VERSION_MAJOR \([0-9]*\).*/\1/p' include/sumo.h)
SO_VERSION    := $(SO_MAJOR).$(shell sed -n 's/^\#define SUMO_VERSION_MINOR \([0-9]*\).*/\1/p' include/sumo.h).$(shell sed -n 's/^\#define SUMO_VERSION_PATCH \([0-9]*\).*/\1/p' include/sumo.h)
SONAME        := libsumo.so.$(SO_MAJOR)
LIBSUMO_SO    := $(BUILD)/libsumo.so.$(SO_VERSION)
MPI_SONAME    := libsumo_mpi.so.$(SO_MAJOR)
LIBSUMO_MPI_SO := $(BUILD)/libsumo_mpi.so.$(SO_VERSION)
# The version node of what libsumo.so exports to its own plugins alone (SUMO__PLUGIN_API in
# src/common/common.h): named after the exact version, so a plugin of another one is refused
# by the dynamic linker instead of calling internals whose types may have changed.
PRIVATE_NODE  := SUMO_PRIVATE_$(SO_VERSION)

TOOL_SRCS := $(wildcard tools/sumo/*.c)
TOOL_HDRS := $(wildcard tools/sumo/*.h)
# Stand-alone measurement programs (bench/*.c), built with everything so they cannot rot.
BENCH_SRCS := $(wildcard bench/*.c)
BENCH_BINS := $(BENCH_SRCS:bench/%.c=$(BUILD)/bench/%)
UNIT_SRCS := $(wildcard tests/unit/test_*.c)
UNIT_BINS := $(UNIT_SRCS:tests/unit/%.c=$(BUILD)/tests/%)
MPI_TEST_SRCS := $(wildcard tests/mpi/test_*.c)
MPI_TEST_BINS := $(MPI_TEST_SRCS:tests/mpi/%.c=$(BUILD)/tests/mpi/%)
TEST_SUPPORT := $(wildcard tests/support/*.c)
TEST_SUPPORT_HDRS := $(wildcard tests/support/*.h)

ifneq ($(MPICC),)
TARGETS := $(LIBSUMO) $(LIBSUMO_MPI) $(BUILD)/sumo $(UNIT_BINS) $(MPI_TEST_BINS) $(BENCH_BINS)
TOOL_CC := $(MPICC)
TOOL_DEFS := -DSUMO_HAVE_MPI
TOOL_LIBS := $(LIBSUMO_TRAIN) $(LIBSUMO_MPI) $(LIBSUMO)
SO_TARGETS := $(LIBSUMO_MPI_SO) $(BUILD)/libsumo_mpi.so $(BUILD)/sumo-mpi.pc
else
TARGETS := $(LIBSUMO) $(BUILD)/sumo $(UNIT_BINS) $(BENCH_BINS)
TOOL_CC := $(CC)
TOOL_DEFS :=
TOOL_LIBS := $(LIBSUMO_TRAIN) $(LIBSUMO)
SO_TARGETS :=
endif
# Sanitizer builds are for the tests; the shared library is built from the normal build only.
ifeq ($(SAN),)
TARGETS += $(LIBSUMO_SO) $(BUILD)/libsumo.so $(BUILD)/sumo.pc $(SO_TARGETS) $(BUILD)/tests/combine_driver \
           $(BUILD)/tests/diloco_driver
endif

.PHONY: all test test-unit test-threads test-mpi test-cli clean
all: $(TARGETS)

# The shared libraries alone, what the Python package carries (setup.py: `pip install .`):
# libsumo.so, libsumo_mpi.so where MPI is found, libsumo_cuda.so where nvcc is (added below).
# Needs neither cmocka, OpenBLAS nor zlib.
.PHONY: shared
shared: $(BUILD)/libsumo.so $(if $(MPICC),$(BUILD)/libsumo_mpi.so)

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) -MMD -MP -c $< -o $@

$(MPI_OBJS): $(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(MPICC) $(CPPFLAGS) $(CFLAGS) -MMD -MP -c $< -o $@

$(LIBSUMO): $(LIB_OBJS)
	@rm -f $@
	ar rcs $@ $^

$(LIBSUMO_MPI): $(MPI_OBJS)
	@rm -f $@
	ar rcs $@ $^

$(LIBSUMO_TRAIN): $(TRAIN_OBJS)
	@rm -f $@
	ar rcs $@ $^

# The linker script: the functions marked SUMO__PLUGIN_API under $(PRIVATE_NODE); the public
# ones stay unversioned, as they always were.
$(BUILD)/libsumo.map: $(wildcard src/*/*.h) include/sumo.h
	@mkdir -p $(dir $@)
	{ echo '$(PRIVATE_NODE) {'; echo '  global:'; \
	  sed -n 's/^SUMO__PLUGIN_API [^(]*\b\(sumo__[a-z0-9_]*\)(.*/    \1;/p' $(sort $(wildcard src/*/*.h)); \
	  echo '};'; } > $@

# -z defs: an undefined symbol fails the link here rather than at a user's dlopen.
$(LIBSUMO_SO): $(LIB_OBJS) $(BUILD)/libsumo.map
	$(CC) -shared -Wl,-soname,$(SONAME) -Wl,-z,defs -Wl,--version-script,$(BUILD)/libsumo.map \
	  $(LDFLAGS) $(LIB_OBJS) $(LDLIBS) -o $@

$(BUILD)/libsumo.so: $(LIBSUMO_SO)
	ln -sf $(notdir $<) $(BUILD)/$(SONAME)
	ln -sf $(SONAME) $@

# The MPI plugin links the libsumo.so beside it ($$ORIGIN, in build/ as where it is installed)
# and binds its internals through $(PRIVATE_NODE).
$(LIBSUMO_MPI_SO): $(MPI_OBJS) $(BUILD)/libsumo.so
	$(MPICC) -shared -Wl,-soname,$(MPI_SONAME) -Wl,-z,defs $(LDFLAGS) $(MPI_OBJS) -L$(BUILD) -lsumo \
	  -Wl,-rpath,'$$ORIGIN' $(LDLIBS) -o $@

$(BUILD)/libsumo_mpi.so: $(LIBSUMO_MPI_SO)
	ln -sf $(notdir $<) $(BUILD)/$(MPI_SONAME)
	ln -sf $(MPI_SONAME) $@

# pkg-config file; PREFIX is substituted at install time (this copy points at PREFIX too).
PREFIX  ?= /usr/local
LIBDIR  ?= $(PREFIX)/lib
INCDIR  ?= $(PREFIX)/include
$(BUILD)/sumo.pc $(BUILD)/sumo-mpi.pc: $(BUILD)/%.pc: scripts/%.pc.in include/sumo.h
	@mkdir -p $(dir $@)
	sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@LIBDIR@|$(LIBDIR)|g' -e 's|@INCDIR@|$(INCDIR)|g' \
	  -e 's|@VERSION@|$(SO_VERSION)|g' $< > $@

# make install PREFIX=... [DESTDIR=...]: headers, static and shared libraries, sumo.pc.
# sumo_mpi.h, libsumo_mpi.a, libsumo_mpi.so and sumo-mpi.pc are installed only when MPI was
# found.
.PHONY: install uninstall test-install
install: $(TARGETS)
	@rm -f $(BUILD)/sumo.pc $(BUILD)/sumo-mpi.pc && $(MAKE) --no-print-directory $(BUILD)/sumo.pc \
	  $(filter %.pc,$(SO_TARGETS)) PREFIX=$(PREFIX)
	install -d $(DESTDIR)$(INCDIR) $(DESTDIR)$(LIBDIR)/pkgconfig
	install -m 644 include/sumo.h include/sumo_aggregation.h include/sumo_optim.h \
	  include/sumo_distributed.h include/sumo_diloco.h include/sumo_delta.h include/sumo_ext.h \
	  include/sumo_shm.h include/sumo_tcp.h include/sumo_elastic.h \
	  include/sumo_bootstrap.h \
	  $(DESTDIR)$(INCDIR)/
	install -m 644 $(LIBSUMO) $(DESTDIR)$(LIBDIR)/
	install -m 755 $(LIBSUMO_SO) $(DESTDIR)$(LIBDIR)/
	ln -sf $(notdir $(LIBSUMO_SO)) $(DESTDIR)$(LIBDIR)/$(SONAME)
	ln -sf $(SONAME) $(DESTDIR)$(LIBDIR)/libsumo.so
	install -m 644 $(BUILD)/sumo.pc $(DESTDIR)$(LIBDIR)/pkgconfig/
ifneq ($(MPICC),)
	install -m 644 include/sumo_mpi.h $(DESTDIR)$(INCDIR)/
	install -m 644 $(LIBSUMO_MPI) $(DESTDIR)$(LIBDIR)/
	install -m 755 $(LIBSUMO_MPI_SO) $(DESTDIR)$(LIBDIR)/
	ln -sf $(notdir $(LIBSUMO_MPI_SO)) $(DESTDIR)$(LIBDIR)/$(MPI_SONAME)
	ln -sf $(MPI_SONAME) $(DESTDIR)$(LIBDIR)/libsumo_mpi.so
	install -m 644 $(BUILD)/sumo-mpi.pc $(DESTDIR)$(LIBDIR)/pkgconfig/
endif

uninstall:
	rm -f $(addprefix $(DESTDIR)$(INCDIR)/,sumo.h sumo_mpi.h sumo_aggregation.h sumo_optim.h sumo_distributed.h sumo_diloco.h sumo_delta.h sumo_ext.h sumo_shm.h sumo_tcp.h sumo_elastic.h sumo_bootstrap.h)
	rm -f $(addprefix $(DESTDIR)$(LIBDIR)/,libsumo.a libsumo_mpi.a libsumo.so $(SONAME) $(notdir $(LIBSUMO_SO)) pkgconfig/sumo.pc)
	rm -f $(addprefix $(DESTDIR)$(LIBDIR)/,libsumo_mpi.so $(MPI_SONAME) $(notdir $(LIBSUMO_MPI_SO)) pkgconfig/sumo-mpi.pc)

# Installs into a scratch prefix and builds a program against it with pkg-config, once
# linked to the shared library (run through the soname) and once statically, and with MPI an
# MPI program the same two ways over sumo-mpi.pc; checks that libsumo.so needs libc alone and
# exports the public functions and, under the private node, what the MPI plugin imports.
test-install: $(TARGETS)
	tests/install/run.sh

$(BUILD)/sumo: $(TOOL_SRCS) $(TOOL_HDRS) $(TOOL_LIBS)
	@mkdir -p $(dir $@)
	$(TOOL_CC) $(CPPFLAGS) $(TOOL_DEFS) $(CFLAGS) $(TOOL_SRCS) $(TOOL_LIBS) $(LDFLAGS) $(TRAIN_LIBS) $(LDLIBS) -o $@

$(BUILD)/bench/%: bench/%.c bench/bench_util.h $(LIBSUMO_TRAIN) $(LIBSUMO)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) $< $(LIBSUMO_TRAIN) $(LIBSUMO) $(LDFLAGS) $(TRAIN_LIBS) $(LDLIBS) -o $@

$(BUILD)/tests/%: tests/unit/%.c $(TEST_SUPPORT) $(TEST_SUPPORT_HDRS) $(LIBSUMO_TRAIN) $(LIBSUMO)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) -Itests $(CFLAGS) $< $(TEST_SUPPORT) $(LIBSUMO_TRAIN) $(LIBSUMO) $(LDFLAGS) -lcmocka $(TRAIN_LIBS) $(LDLIBS) -o $@

# The MPI tests (public API alone) run on the shared libraries, the MPI plugin over the core
# as the Python binding and a C user of sumo-mpi.pc load them; `sumo` keeps the archives.
$(BUILD)/tests/mpi/%: tests/mpi/%.c tests/mpi/check.h $(TEST_SUPPORT) $(BUILD)/libsumo_mpi.so $(BUILD)/libsumo.so
	@mkdir -p $(dir $@)
	$(MPICC) $(CPPFLAGS) -Itests $(CFLAGS) $< $(TEST_SUPPORT) -L$(BUILD) -lsumo_mpi -lsumo \
	  -Wl,-rpath,'$$ORIGIN/../..' $(LDFLAGS) $(LDLIBS) -o $@

# The C sides of the Python binding's parity tests (tests/python).
$(BUILD)/tests/%_driver: tests/python/%_driver.c tests/python/driver_io.h $(LIBSUMO)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) $< $(LIBSUMO) $(LDFLAGS) $(LDLIBS) -o $@

# Unit tests: each binary is a cmocka suite; a failing suite fails the target after all ran.
test-unit: $(UNIT_BINS) $(BUILD)/sumo
	@fail=0; for t in $(UNIT_BINS); do echo "== $$t"; $$t || fail=1; done; exit $$fail

# The subset that exercises threads against each other (what TSan is for); only these are
# built, since a sanitizer build of every suite costs minutes of CI.
THREAD_BINS := $(filter %collectives %gossip %gossip_slowmo %async %faults %adasum_pair %adasum_tree %adasum_errors %acga_oracles %acga_options %acga_degenerate %acga_state %slowmo %slowmo_api %distributed %core %seams_memory %seams_transport %compress %diloco %diloco_api %elastic %store_agree %store_commit %tickets %elastic_object %heartbeat %restore %tcp %comm_hier %join,$(UNIT_BINS))
test-threads: $(THREAD_BINS)
	@fail=0; for t in $(THREAD_BINS); do echo "== $$t"; $$t || fail=1; done; exit $$fail

MPIRUN_FLAGS ?= --oversubscribe --allow-run-as-root --mca btl self,vader --mca rmaps_base_oversubscribe 1
# test_gossip_mpi once more under MPI_THREAD_SINGLE: sumo calls MPI on the caller's thread only.
test-mpi: $(MPI_TEST_BINS)
	@fail=0; for t in $(MPI_TEST_BINS); do for np in 2 3 4; do \
	  echo "== mpirun -np $$np $$t"; \
	  timeout -k 10 300 mpirun -np $$np $(MPIRUN_FLAGS) $$t || fail=1; done; done; \
	echo "== mpirun -np 3 $(BUILD)/tests/mpi/test_gossip_mpi single"; \
	timeout -k 10 300 mpirun -np 3 $(MPIRUN_FLAGS) $(BUILD)/tests/mpi/test_gossip_mpi single || fail=1; \
	exit $$fail

# End-to-end checks of the command (training, checkpoints, resume, data errors).
test-cli: $(BUILD)/sumo
	tests/cli/test_train.sh $(BUILD)/sumo $(CRASHTEST)
	tests/cli/test_elastic.sh $(BUILD)/sumo

ifneq ($(MPICC),)
test: test-unit test-mpi test-cli
else
test: test-unit test-cli
endif

clean:
	rm -rf build build-asan build-tsan

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)

# ---- Hardening: the crash-test build of the command, fuzzing, the MPI fault suite ----------
# sumo-crashtest is the command with checkpoint.c's fault hook compiled in (a test build: the
# library and build/sumo have no hook); test-cli kills it in the middle of a save.
CRASHTEST := $(BUILD)/tests/sumo-crashtest
$(CRASHTEST): $(TOOL_SRCS) $(TRAIN_SRCS) $(filter-out $(LIBSUMO_TRAIN),$(TOOL_LIBS))
	@mkdir -p $(dir $@)
	$(TOOL_CC) $(CPPFLAGS) $(TOOL_DEFS) -DSUMO_TEST_CRASH_DURING_SAVE $(CFLAGS) $(TOOL_SRCS) $(TRAIN_SRCS) \
	  $(filter-out $(LIBSUMO_TRAIN),$(TOOL_LIBS)) $(LDFLAGS) $(TRAIN_LIBS) $(LDLIBS) -o $@
test-cli: $(CRASHTEST)

# The MPI fault suite: a rank stopped, killed or leaving early, in `sumo train` and in a bare
# allreduce program; every other rank must report within the deadline and the job must end.
ifneq ($(MPICC),)
FAULT_PROG := $(BUILD)/tests/faults/allreduce_fault
$(FAULT_PROG): tests/faults/allreduce_fault.c $(BUILD)/libsumo_mpi.so $(BUILD)/libsumo.so
	@mkdir -p $(dir $@)
	$(MPICC) $(CPPFLAGS) $(CFLAGS) $< -L$(BUILD) -lsumo_mpi -lsumo -Wl,-rpath,'$$ORIGIN/../..' \
	  $(LDFLAGS) $(LDLIBS) -o $@
.PHONY: test-faults
test-faults: $(BUILD)/sumo $(FAULT_PROG)
	tests/faults/run.sh $(BUILD)/sumo $(FAULT_PROG)
else
.PHONY: test-faults
test-faults:
	@echo "test-faults: skipped (no mpicc)"
endif

# Fuzzing with libFuzzer (clang): the IDX reader, the checkpoint and manifest reader, the
# command-line parser, the store's records (agreement, heartbeat, shared-memory meeting, join
# tickets) and the TCP meeting's hello and frames, each for FUZZ_SECONDS from the corpus in
# tests/fuzz/corpus/. Skipped, saying so, when clang is not installed.
FUZZ_CC      ?= clang
FUZZ_BUILD   := build-fuzz
FUZZ_SECONDS ?= 60
FUZZ_FLAGS   := $(CPPFLAGS) -std=c11 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all
FUZZ_BINS    := $(FUZZ_BUILD)/fuzz_idx $(FUZZ_BUILD)/fuzz_checkpoint $(FUZZ_BUILD)/fuzz_cli \
                $(FUZZ_BUILD)/fuzz_store $(FUZZ_BUILD)/fuzz_tcp
$(FUZZ_BUILD)/fuzz_idx: tests/fuzz/fuzz_idx.c src/train/idx.c $(LIBSUMO)
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_FLAGS) $(filter %.c,$^) $(LIBSUMO) -lz -lm -pthread -o $@
$(FUZZ_BUILD)/fuzz_checkpoint: tests/fuzz/fuzz_checkpoint.c src/train/checkpoint.c $(LIBSUMO)
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_FLAGS) $(filter %.c,$^) $(LIBSUMO) -lz -lm -pthread -o $@
$(FUZZ_BUILD)/fuzz_cli: tests/fuzz/fuzz_cli.c tools/sumo/train_options.c tools/sumo/args.c $(TOOL_HDRS) $(LIBSUMO_TRAIN) $(LIBSUMO)
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_FLAGS) tests/fuzz/fuzz_cli.c tools/sumo/train_options.c tools/sumo/args.c $(LIBSUMO_TRAIN) $(LIBSUMO) $(TRAIN_LIBS) -lm -pthread -o $@
FUZZ_STORE_SRCS := src/transport/store_agree.c src/transport/heartbeat.c src/transport/shm_meeting.c \
                   src/transport/tickets.c
$(FUZZ_BUILD)/fuzz_store: tests/fuzz/fuzz_store.c $(FUZZ_STORE_SRCS) $(LIBSUMO)
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_FLAGS) $(filter %.c,$^) $(LIBSUMO) -lm -pthread -o $@
FUZZ_TCP_SRCS := src/transport/tcp_meeting.c src/transport/transport_tcp.c
$(FUZZ_BUILD)/fuzz_tcp: tests/fuzz/fuzz_tcp.c $(FUZZ_TCP_SRCS) $(LIBSUMO)
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_FLAGS) $(filter %.c,$^) $(LIBSUMO) -lm -pthread -o $@
.PHONY: fuzz fuzz-build
fuzz-build: $(FUZZ_BINS)
fuzz:
	@if command -v $(FUZZ_CC) > /dev/null; then $(MAKE) --no-print-directory fuzz-build && \
	  tests/fuzz/run.sh $(FUZZ_BUILD) $(FUZZ_SECONDS); \
	else echo "fuzz: skipped ($(FUZZ_CC) is not installed; scripts/deps.sh installs clang)"; fi
.PHONY: clean-fuzz
clean-fuzz:
	rm -rf $(FUZZ_BUILD)
clean: clean-fuzz

# ---- CUDA: libsumo_cuda (cuda/), built when nvcc is found ----------------------------------
# The CUDA plugin: a kernel table for device memory and an NCCL transport, on sumo's public and
# experimental API only (include/sumo_cuda.h). Built when nvcc is on PATH or in CUDA_HOME, else
# skipped with one message; the CPU library never needs it. Machine code for Hopper (sm_90) and
# PTX for compute_80, which the driver compiles for any newer GPU (docs/gpu.md). NCCL is
# loaded at run time, so neither nccl.h nor libnccl is needed to build. `make test` runs
# test_cuda, which runs its host tests and skips its device tests, saying so, without a GPU.
CUDA_HOME ?= /usr/local/cuda
ifeq ($(origin NVCC),undefined)
NVCC      := $(shell command -v nvcc 2>/dev/null || { test -x $(CUDA_HOME)/bin/nvcc && echo $(CUDA_HOME)/bin/nvcc; })
endif
CUDA_GENCODE ?= -gencode arch=compute_90,code=sm_90 -gencode arch=compute_80,code=compute_80
.PHONY: test-cuda cuda
ifneq ($(NVCC),)
ifeq ($(SAN),)
CUDA_LIBDIR   := $(firstword $(wildcard $(CUDA_HOME)/lib64 $(CUDA_HOME)/targets/x86_64-linux/lib $(CUDA_HOME)/lib))
CUDA_CPPFLAGS := -Iinclude -Icuda -isystem $(CUDA_HOME)/include -D_GNU_SOURCE
# -fmad=false: nothing is fused unless the code says fma(), as in the host kernels (C11 with
# -ffp-contract=off); no flag that changes IEEE division, square roots or denormals.
NVCC_WERROR   ?= -Werror all-warnings
NVCC_FLAGS    ?= -std=c++17 -O3 $(CUDA_GENCODE) -fmad=false $(NVCC_WERROR) \
                 -Xcompiler -fPIC,-fvisibility=hidden,-ffp-contract=off,-fno-exceptions,-fno-threadsafe-statics,-Wall,-Wextra,-Wno-unknown-pragmas
# cudart linked statically (only libcuda.so, the driver, is needed at run time, and its absence
# is reported, not fatal); its symbols are kept out of libsumo_cuda.so's exports.
CUDA_LDLIBS   := -L$(CUDA_LIBDIR) -lcudart_static -ldl -lrt -lpthread -lm
CUDA_C_OBJS   := $(patsubst cuda/%.c,$(BUILD)/cuda/%.o,$(wildcard cuda/*.c))
CUDA_CU_OBJS  := $(patsubst cuda/%.cu,$(BUILD)/cuda/%.o,$(wildcard cuda/*.cu))
CUDA_OBJS     := $(CUDA_C_OBJS) $(CUDA_CU_OBJS)
TEST_CUDA_SRCS := $(wildcard tests/cuda/*.c)
LIBSUMO_CUDA  := $(BUILD)/libsumo_cuda.a
LIBSUMO_CUDA_SO := $(BUILD)/libsumo_cuda.so
CUDA_TARGETS  := $(LIBSUMO_CUDA) $(LIBSUMO_CUDA_SO) $(BUILD)/tests/test_cuda $(BUILD)/bench/cuda_adasum
all: $(CUDA_TARGETS)
cuda: $(CUDA_TARGETS)
shared: $(LIBSUMO_CUDA_SO)

$(CUDA_C_OBJS): $(BUILD)/cuda/%.o: cuda/%.c
	@mkdir -p $(dir $@)
	$(CC) $(CUDA_CPPFLAGS) $(CFLAGS) -MMD -MP -c $< -o $@

$(CUDA_CU_OBJS): $(BUILD)/cuda/%.o: cuda/%.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(CUDA_CPPFLAGS) $(NVCC_FLAGS) -MMD -MP -c $< -o $@

$(LIBSUMO_CUDA): $(CUDA_OBJS)
	@rm -f $@
	ar rcs $@ $^

$(LIBSUMO_CUDA_SO): $(CUDA_OBJS) $(BUILD)/libsumo.so
	$(CC) -shared -Wl,-soname,libsumo_cuda.so -Wl,-z,defs -Wl,--exclude-libs,ALL $(LDFLAGS) \
	  $(CUDA_OBJS) -L$(BUILD) -lsumo -Wl,-rpath,'$$ORIGIN' $(CUDA_LDLIBS) -o $@

$(BUILD)/tests/test_cuda: $(TEST_CUDA_SRCS) $(wildcard tests/cuda/*.h) $(TEST_SUPPORT) $(LIBSUMO_CUDA) $(LIBSUMO)
	@mkdir -p $(dir $@)
	$(CC) $(CUDA_CPPFLAGS) -Isrc -Itests $(CFLAGS) $(TEST_CUDA_SRCS) $(TEST_SUPPORT) $(LIBSUMO_CUDA) $(LIBSUMO) $(LDFLAGS) $(CUDA_LDLIBS) -o $@

$(BUILD)/bench/cuda_adasum: bench/cuda_adasum.cu $(LIBSUMO_CUDA) $(LIBSUMO)
	@mkdir -p $(dir $@)
	$(NVCC) $(CUDA_CPPFLAGS) -Isrc $(NVCC_FLAGS) $< $(LIBSUMO_CUDA) $(LIBSUMO) -Xcompiler -pthread -lm -o $@

test-cuda: $(BUILD)/tests/test_cuda
	@echo "== $<"; $<
test: test-cuda
else
test-cuda:
	@echo "test-cuda: skipped (sanitizer builds leave the CUDA plugin out)"
endif
else
cuda test-cuda:
	@echo "$@: skipped (nvcc not found on PATH or in CUDA_HOME=$(CUDA_HOME)): libsumo_cuda not built"
test: test-cuda
endif
