/*
 * What the files of test_cuda share (test_cuda.c says what the program tests): a small
 * runner, the three memories a check runs on, data and comparisons, the tables, and the
 * checks each file holds for the host and the device tests.
 *
 * The runner is this program's own, not cmocka: the device machine builds only the CUDA
 * targets (scripts/gpu-check.sh runs `make cuda`) and need not have cmocka. Everything else
 * that tests/support offers (threads communicators, data, buffers of any dtype, references)
 * is used from there.
 */
#ifndef SUMO_TEST_CUDA_TEST_H
#define SUMO_TEST_CUDA_TEST_H

#define SUMO_EXPERIMENTAL_API 1
#include "cuda_internal.h"
#include "kernels_cuda.h"
#include "sumo.h"
#include "sumo_cuda.h"
#include "sumo_ext.h"
#include "support/harness.h"
#include "support/reference.h"

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define MAXP 8

/* ---- the runner -------------------------------------------------------------------------- */

extern int g_failed_checks;
extern bool g_quick; /* --quick: the device tests' smaller sizes (for compute-sanitizer) */

#define CHECK(cond, ...)                                                               \
    do {                                                                               \
        if (!(cond)) {                                                                 \
            fprintf(stderr, "%s:%d: check failed: %s: ", __FILE__, __LINE__, #cond);   \
            fprintf(stderr, __VA_ARGS__);                                              \
            fputc('\n', stderr);                                                       \
            g_failed_checks++;                                                         \
            return;                                                                    \
        }                                                                              \
    } while (0)
#define CHECK_OK(call) CHECK((call) == SUMO_SUCCESS, "%s", #call)

typedef struct test_case {
    const char *name;
    void (*fn)(void);
} test_case;

/* Runs each test, one line each with its time; returns how many failed. */
int run_tests(const char *group, const test_case *t, size_t n);

/* ---- memories: host, emulated device (an arena the emulated table claims), CUDA device ---- */

enum { M_HOST, M_EMU, M_DEV };

/* Emulated device memory: ordinary allocations, registered so that the emulated table's
 * claims() (and the fake NCCL's "is device") know them, and nothing else. */
#define EMU_BLOCKS 4096
typedef struct arena {
    pthread_mutex_t lock;
    unsigned char *start[EMU_BLOCKS];
    size_t bytes[EMU_BLOCKS];
} arena;

extern arena g_emu;

bool emu_claims(void *ctx, const void *ptr, size_t bytes);
/* Zeroed memory of that kind; aborts when there is none. */
void *m_alloc(int kind, size_t bytes);
void m_free(int kind, void *p);
/* Copies to and from memory of that kind, complete on return: the checks then call entries on
 * streams of their own, which nothing else orders after these copies. */
void m_put(int kind, void *dst, const void *src, size_t bytes);
void m_get(int kind, void *dst, const void *src, size_t bytes);

/* ---- data -------------------------------------------------------------------------------- */

extern const sumo_dtype DTS[4];
extern const char *const DT_NAME[4];

size_t esz(sumo_dtype dt);
/* Random values in [-4, 4) rounded to the dtype, with specials at fixed places when asked:
 * NaN, +-Inf, signed zeros, subnormals of the format, values near its overflow. */
void gen(sumo_dtype dt, void *buf, size_t n, uint64_t seed, bool specials);
/* The first element where a and b differ (both NaN counts as equal: a GPU makes its own NaN),
 * or SIZE_MAX. */
size_t first_diff(sumo_dtype dt, const void *a, const void *b, size_t n);

/* ---- tables ------------------------------------------------------------------------------ */

extern const sumo_kernel_table *g_host;
extern sumo_cuda_kernels *g_emu_kernels;
extern const sumo_kernel_table *g_emu_table;
extern sumo_cuda_kernels *g_dev_kernels;
extern const sumo_kernel_table *g_dev_table;

const sumo_kernel_table *table_of(int kind);

/* ---- buffers of the checks --------------------------------------------------------------- */

/* A buffer of n elements at `off` elements past a 256-byte boundary (off 1: every 16-byte
 * vector path off, so the device's scalar path runs). */
typedef struct tbuf {
    unsigned char *base, *p;
} tbuf;

tbuf t_alloc(int kind, sumo_dtype dt, size_t n, size_t off);
tbuf t_upload(int kind, sumo_dtype dt, const void *host, size_t n, size_t off);
/* n elements of `kind` memory brought back for comparison (malloc'd). */
void *fetch(int kind, sumo_dtype dt, const tbuf *b, size_t n);

/* The table a check calls and the stream it passes (NULL: the legacy default stream). */
typedef struct entry_run {
    int kind;
    const sumo_kernel_table *k;
    void *stream;
} entry_run;

/* A layout with empty tensors and one spanning several items. */
extern const size_t LAYOUT[9];
#define NLAYOUT (sizeof LAYOUT / sizeof LAYOUT[0])
/* Its NLAYOUT + 1 offsets; returns the total. */
size_t layout_offsets(size_t *off);

/* ---- the checks, on `kind` memory against the host table --------------------------------- */

/* entries.c: every 16-bit pattern through convert; every exactly defined entry. */
void check_convert_patterns(int kind);
void check_exact_entries(int kind);

/* gram.c: the Gram partials and dot products (bound, address independence); on the device,
 * also against the emulator bit for bit. */
void check_gram_all(int kind);
void d_gram(void);

/* collectives.c: sum, average and Adasum on the threads transport at P = 2, 3, 4. */
void check_collectives(int kind);

/* combine.c: the device combine's weights (emulated) against the library's, the emulated
 * combine against the table path, and on the device against the emulator. */
void t_combine_weights_emulated(void);
void t_combine_emulated(void);
void d_combine(void);

/* ipc.c: ranks in separate processes (the shm transport) on emulated device buffers shared
 * by the emulated IPC: the collectives, and the refusals. */
void t_ipc_emulated_collectives(void);
void t_ipc_emulated_refusals(void);

/* nccl.c: the NCCL transport over a fake NCCL (host), and the real one at one rank. */
void t_nccl_fake_collectives(void);
void t_nccl_fake_timeout(void);
void t_nccl_fake_error(void);
void t_nccl_fake_abort(void);
void t_nccl_fake_create(void);
void d_nccl_one_rank(void);

/* hier.c: two levels, NCCL between the nodes (the fake on the host, the real one at one rank
 * on a device). */
void t_nccl_fake_hier(void);
void d_hier_one_node(void);

#endif
