/*
 * sumo's CUDA plugin (cuda/, include/sumo_cuda.h), tested in two parts.
 *
 * Host tests, everywhere (no GPU needed): the table is complete and sumo accepts it; without a
 * device every entry point says so clearly; the layout planning; and the device code itself,
 * run on the host through the emulators (kernels_cuda.h: the kernels' own per-element and
 * per-thread functions in the device's order) behind the very table glue the device uses:
 *   - every exactly defined entry (fill, scan, reduce, convert, scaled_add, weighted_sum,
 *     delta, apply_delta) equals sumo's host table bit for bit (NaN payloads
 *     aside), all 16-bit patterns and the wide paths included;
 *   - the Gram partials and dot products are within a stated bound of a float64 reference
 *     (compensated sums) and of the host table, and do not depend on addresses;
 *   - sum, average and Adasum of "device" buffers on the threads transport at P = 2, 3, 4,
 *     as test_seams.c runs a third-party table: sum and average bit for bit the host path's,
 *     Adasum within the tree's bound of the float64 reference, identical on every rank and
 *     run;
 *   - the NCCL transport over a fake NCCL (in-process mailboxes behind the same call table the
 *     real NCCL fills): every collective bit for bit the threads transport's (same
 *     algorithms), host buffers staged, deadlines, aborts, NCCL errors, ownership.
 *
 * Device tests, where cudaGetDeviceCount finds a GPU (else one line: "skipped: no CUDA
 * device"): every entry on device memory against the host table (bit for bit where defined)
 * and the emulator (bit for bit, the Gram partials included: same order), float64 references,
 * determinism (two runs, two addresses); the threads transport with P = 2, 3, 4 ranks on one
 * GPU, a stream each, against the emulated run bit for bit; NCCL at one rank (ncclSend/Recv to
 * itself, allgather, barrier, collectives).
 *
 *   test_cuda [--quick] [--device-only]
 * --quick shrinks the device tests' sizes (for compute-sanitizer); --device-only skips the host
 * tests.
 *
 * This file holds the tests of the API and the table as a whole and runs them all; the checks
 * are in entries.c (the exactly defined entries), gram.c (the Gram partials), combine.c (the
 * device combine), collectives.c
 * (the threads transport), nccl.c (the NCCL transport, over fake_nccl.c's fake on the host)
 * and hier.c (two levels, NCCL between the nodes), on what cuda_test.c provides.
 */
#include "cuda_test.h"

#include <cuda_runtime_api.h>

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- host tests -------------------------------------------------------------------------- */

static void t_table_complete(void)
{
    const sumo_kernel_table *t = g_emu_table;
    CHECK(t->struct_size == sizeof(sumo_kernel_table), "struct_size %zu", t->struct_size);
    CHECK(strcmp(t->memory, "cuda") == 0, "memory %s", t->memory);
    const void *entries[] = {t->claims, t->alloc, t->release, t->synchronize, t->copy, t->fill,
                             t->first_nonfinite, t->reduce, t->convert, t->dot_norms,
                             t->scaled_add, t->gram_partials, t->weighted_sum, t->delta,
                             t->apply_delta, t->quantize, t->dequantize,
                             t->outer_update};
    for (size_t i = 0; i < sizeof entries / sizeof entries[0]; i++)
        CHECK(entries[i] != NULL, "entry %zu missing", i);
    /* sumo accepts it (its own completeness check), also through sumo_comm_add_cuda. */
    sumo_comm *c;
    CHECK_OK(sumo_comm_create_threads(1, &c));
    CHECK_OK(sumo_comm_add_kernels(c, t));
    CHECK_OK(sumo_comm_add_cuda(c, g_emu_kernels));
    CHECK(sumo_comm_add_cuda(c, NULL) == SUMO_ERR_INVALID_ARGUMENT, "NULL kernels");
    CHECK(sumo_comm_add_cuda(NULL, g_emu_kernels) == SUMO_ERR_INVALID_ARGUMENT, "NULL comm");
    const sumo_kernel_table *back = NULL;
    CHECK_OK(sumo_cuda_kernels_table(g_emu_kernels, &back));
    CHECK(back == t, "the table of the object");
    CHECK(sumo_cuda_kernels_table(NULL, &back) == SUMO_ERR_INVALID_ARGUMENT, "NULL");
    CHECK_OK(sumo_cuda_kernels_destroy(NULL));
    sumo_comm_destroy(c);
}

/* stderr into a temporary file while a call that reports there runs (the test checks the
 * line instead of showing it). */
typedef struct captured {
    int saved;
    FILE *file;
} captured;

static captured capture_begin(void)
{
    captured c = {.saved = -1, .file = tmpfile()};
    fflush(stderr);
    if (c.file) {
        c.saved = dup(2);
        dup2(fileno(c.file), 2);
    }
    return c;
}

static void capture_end(captured *c, char *text, size_t bytes)
{
    text[0] = '\0';
    fflush(stderr);
    if (c->file == NULL) return;
    dup2(c->saved, 2);
    close(c->saved);
    rewind(c->file);
    size_t got = fread(text, 1, bytes - 1, c->file);
    text[got] = '\0';
    fclose(c->file);
}

/* Without a device every entry point says so, and nothing crashes. */
static void t_no_device(void)
{
    int n = -1;
    char msg[256] = "";
    CHECK_OK(sumo_cuda_device_count(&n, msg, sizeof msg));
    CHECK(sumo_cuda_device_count(NULL, msg, sizeof msg) == SUMO_ERR_INVALID_ARGUMENT, "NULL");
    if (n > 0) {
        CHECK(strstr(msg, "CUDA device") != NULL, "message %s", msg);
        return; /* the device tests cover the rest */
    }
    CHECK(n == 0, "count %d", n);
    CHECK(strstr(msg, "no CUDA device") != NULL, "message: %s", msg);
    sumo_cuda_kernels *k = (sumo_cuda_kernels *)1;
    char said[512];
    captured cap = capture_begin();
    sumo_result r = sumo_cuda_kernels_create(0, &k);
    capture_end(&cap, said, sizeof said);
    CHECK(r == SUMO_ERR_INVALID_USAGE, "kernels_create without a device: %s", sumo_result_name(r));
    CHECK(k == NULL, "no object");
    CHECK(strstr(said, "sumo_cuda_kernels_create: no CUDA device") != NULL, "stderr: %s", said);
    cap = capture_begin();
    r = sumo_cuda_kernels_create(-1, &k);
    capture_end(&cap, said, sizeof said);
    CHECK(r == SUMO_ERR_INVALID_USAGE, "kernels_create(-1) without a device: %s", sumo_result_name(r));
    /* The real claims() of a host pointer is false without a driver (the object is the
     * emulated one with its emulation switched off: the device path's claims). */
    sumo_cuda_kernels *e;
    CHECK_OK(sumo_cuda__kernels_create_emulated(emu_claims, &g_emu, &e));
    e->emulated = false;
    float x[4];
    CHECK(!e->table.claims(e->table.ctx, x, sizeof x), "a host pointer is not claimed");
    e->emulated = true;
    sumo_cuda_kernels_destroy(e);
}

static void t_api_arguments(void)
{
    sumo_comm *c = (sumo_comm *)1;
    CHECK(sumo_comm_create_nccl(NULL, NULL, &c) == SUMO_ERR_INVALID_ARGUMENT, "NULL comm");
    CHECK(sumo_cuda_allreduce(NULL, NULL, 0, SUMO_FLOAT32, SUMO_OP_SUM, NULL, NULL) ==
              SUMO_ERR_INVALID_ARGUMENT,
          "NULL comm");
    unsigned char id[128];
    CHECK(sumo_nccl_unique_id(id, 64) == SUMO_ERR_INVALID_ARGUMENT, "short id");
    CHECK(sumo_comm_create_nccl_rank(2, id, sizeof id, 2, -1, NULL, &c) == SUMO_ERR_INVALID_ARGUMENT,
          "rank out of range");
    CHECK(sumo_cuda_kernels_create(0, NULL) == SUMO_ERR_INVALID_ARGUMENT, "NULL out");
}

/* The pieces and items of a layout range, against a plain walk. */
static void t_plan(void)
{
    for (uint64_t seed = 1; seed <= 300; seed++) {
        size_t T = 1 + (size_t)(harness_next(&seed) % 12), off[14] = {0};
        for (size_t t = 0; t < T; t++) {
            uint64_t r = harness_next(&seed) % 5;
            off[t + 1] = off[t] + (r == 0 ? 0 : r == 1 ? 1 : (size_t)(harness_next(&seed) % 40000));
        }
        size_t total = off[T], lo = total ? (size_t)(harness_next(&seed) % (total + 1)) : 0;
        size_t hi = lo + (total > lo ? (size_t)(harness_next(&seed) % (total - lo + 1)) : 0);
        size_t chunk = 1 + (size_t)(harness_next(&seed) % 9000), items = 0;
        sumo_cuda__piece p[16];
        size_t np = sumo_cuda__plan(off, T, lo, hi, chunk, p, 16, &items);
        size_t want_np = 0, want_items = 0;
        for (size_t t = 0; t < T; t++) {
            size_t s = off[t] > lo ? off[t] : lo, e = off[t + 1] < hi ? off[t + 1] : hi;
            if (e <= s) continue;
            CHECK(want_np < np, "seed %llu: too few pieces", (unsigned long long)seed);
            const sumo_cuda__piece *q = &p[want_np];
            CHECK(q->tensor == t && q->start == s - lo && q->len == e - s && q->first_item == want_items,
                  "seed %llu piece %zu", (unsigned long long)seed, want_np);
            want_items += (e - s + chunk - 1) / chunk;
            want_np++;
        }
        CHECK(np == want_np && items == want_items, "seed %llu: %zu pieces %zu items", (unsigned long long)seed, np, items);
    }
}

static void t_conversions_emulated(void) { check_convert_patterns(M_EMU); }
static void t_entries_emulated(void) { check_exact_entries(M_EMU); }
static void t_gram_emulated(void) { check_gram_all(M_EMU); }
static void t_collectives_emulated(void) { check_collectives(M_EMU); }

/* ---- device tests ------------------------------------------------------------------------ */

static void d_claims(void)
{
    float h[8];
    void *d = NULL;
    CHECK(cudaMalloc(&d, 4096) == cudaSuccess, "cudaMalloc");
    const sumo_kernel_table *t = g_dev_table;
    CHECK(!t->claims(t->ctx, h, sizeof h), "host memory is the host's");
    CHECK(t->claims(t->ctx, d, 4096), "device memory is claimed");
    void *pinned = NULL;
    CHECK(cudaMallocHost(&pinned, 4096) == cudaSuccess, "cudaMallocHost");
    CHECK(!t->claims(t->ctx, pinned, 4096), "pinned host memory stays the host's");
    cudaFreeHost(pinned);
    cudaFree(d);
}

static void d_conversions(void) { check_convert_patterns(M_DEV); }
static void d_entries(void) { check_exact_entries(M_DEV); }
/* P ranks on one GPU, a stream each: every result bit-identical across ranks and runs, equal
 * to the emulated run bit for bit, sum and average to the host path's. */
static void d_collectives(void) { check_collectives(M_DEV); }

/* ---- main -------------------------------------------------------------------------------- */

int main(int argc, char **argv)
{
    bool device_only = false;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0) g_quick = true;
        else if (strcmp(argv[i], "--device-only") == 0) device_only = true;
        else {
            fprintf(stderr, "usage: %s [--quick] [--device-only]\n", argv[0]);
            return 2;
        }
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    pthread_mutex_init(&g_emu.lock, NULL);
    if (sumo_host_kernels(&g_host) != SUMO_SUCCESS ||
        sumo_cuda__kernels_create_emulated(emu_claims, &g_emu, &g_emu_kernels) != SUMO_SUCCESS ||
        sumo_cuda_kernels_table(g_emu_kernels, &g_emu_table) != SUMO_SUCCESS) {
        fprintf(stderr, "test_cuda: setup failed\n");
        return 1;
    }
    static const test_case host_tests[] = {
        {"table complete, accepted", t_table_complete},
        {"no device: clear answers", t_no_device},
        {"argument checks", t_api_arguments},
        {"layout plan", t_plan},
        {"16-bit conversions (emulated)", t_conversions_emulated},
        {"exact entries vs host (emulated)", t_entries_emulated},
        {"Gram partials (emulated)", t_gram_emulated},
        {"combine: weights vs library (emulated)", t_combine_weights_emulated},
        {"combine vs table path (emulated)", t_combine_emulated},
        {"threads P=2..4 (emulated)", t_collectives_emulated},
        {"processes P=2..4, IPC (emulated)", t_ipc_emulated_collectives},
        {"processes, IPC refusals (emulated)", t_ipc_emulated_refusals},
        {"NCCL transport, fake: collectives", t_nccl_fake_collectives},
        {"NCCL transport, fake: deadline", t_nccl_fake_timeout},
        {"NCCL transport, fake: NCCL error", t_nccl_fake_error},
        {"NCCL transport, fake: abort", t_nccl_fake_abort},
        {"NCCL transport, fake: create/ops", t_nccl_fake_create},
        {"hierarchical: node threads, NCCL between nodes (fake)", t_nccl_fake_hier},
    };
    static const test_case device_tests[] = {
        {"claims", d_claims},
        {"16-bit conversions", d_conversions},
        {"exact entries vs host", d_entries},
        {"Gram partials vs emulator, bound", d_gram},
        {"combine vs emulator", d_combine},
        {"threads P=2..4 on one GPU", d_collectives},
        {"NCCL at one rank", d_nccl_one_rank},
        {"hierarchical: one node, NCCL between nodes", d_hier_one_node},
    };
    int failed = 0;
    if (!device_only) failed += run_tests("host", host_tests, sizeof host_tests / sizeof host_tests[0]);
    int ndev = 0;
    char why[256] = "";
    sumo_cuda_device_count(&ndev, why, sizeof why);
    if (ndev == 0) {
        printf("test_cuda: %zu device tests skipped: %s\n",
               sizeof device_tests / sizeof device_tests[0], why);
    } else if (sumo_cuda_kernels_create(0, &g_dev_kernels) != SUMO_SUCCESS ||
               sumo_cuda_kernels_table(g_dev_kernels, &g_dev_table) != SUMO_SUCCESS) {
        printf("test_cuda: FAILED: %s, but the kernels could not be set up on device 0\n", why);
        failed++;
    } else {
        struct cudaDeviceProp prop;
        if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess)
            printf("test_cuda: device 0: %s (sm_%d%d)%s\n", prop.name, prop.major, prop.minor,
                   g_quick ? ", quick sizes" : "");
        failed += run_tests("device", device_tests, sizeof device_tests / sizeof device_tests[0]);
        sumo_cuda_kernels_destroy(g_dev_kernels);
    }
    sumo_cuda_kernels_destroy(g_emu_kernels);
    printf("test_cuda: %d failed\n", failed);
    return failed ? 1 : 0;
}
