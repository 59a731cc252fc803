/*
 * test_cuda: the device combine (sumo_cuda_adasum_combine, table_cuda.c's sumo_cuda__combine):
 * its weights kernel's code, run through the emulator, against the library's
 * sumo__adasum_gram_weights bit for bit on random and stress Gram matrices; the emulated
 * combine against the table path a collective runs (gram_partials, the host's weights, the
 * decline, weighted_sum) bit for bit, the declines leaving in-place inputs whole; on the
 * device, the device combine against the emulated one bit for bit.
 */
#include "cuda_test.h"
/* The library's own weights: the reference the device's must equal. */
#include "collectives/adasum_gram.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- the weights kernel's code against the library's ---------------------------------------- */

/* n Gram matrices of P inputs (packed, one after the other), of kinds that reach every branch:
 * Gram matrices of random vectors, of vectors that cancel (b = -a exactly, b = -a nearly, a
 * tiny norm), with huge or non-finite entries. */
static void stress_grams(uint64_t seed, int P, size_t n, double *G)
{
    size_t L = sumo__gram_len(P);
    for (size_t t = 0; t < n; t++) {
        double v[16][5];
        int D = 1 + (int)(harness_next(&seed) % 5), kind = (int)(t % 8);
        for (int i = 0; i < P; i++)
            for (int d = 0; d < D; d++) v[i][d] = 2.0 * harness_uniform(&seed) - 1.0;
        if (kind == 1 && P > 1)
            for (int d = 0; d < D; d++) v[1][d] = -v[0][d];
        if (kind == 2 && P > 2)
            for (int d = 0; d < D; d++) v[2][d] = -v[0][d] * (1 + 0x1p-30);
        if (kind == 3)
            for (int d = 0; d < D; d++) v[P - 1][d] *= 0x1p-520;
        if (kind == 4)
            for (int d = 0; d < D; d++) v[0][d] *= 1e150;
        double *g = G + t * L;
        for (int i = 0, q = 0; i < P; i++)
            for (int j = i; j < P; j++, q++) {
                double s = 0;
                for (int d = 0; d < D; d++) s += v[i][d] * v[j][d];
                g[q] = s;
            }
        if (kind == 5) g[harness_next(&seed) % L] = NAN;
        if (kind == 6) g[0] = INFINITY;
    }
}

static void check_weights(int P, int group, double need, double gram_err, bool narrow, uint64_t seed)
{
    enum { N = 96 };
    size_t L = sumo__gram_len(P);
    double *G = malloc(N * L * sizeof *G), *w = malloc(N * (size_t)P * sizeof *w);
    double *want = malloc(N * (size_t)P * sizeof *want), work[64];
    unsigned char wide[N], flags[N], want_flags[N];
    unsigned int accept = 7;
    stress_grams(seed, P, N, G);
    sumo__adasum_gram_params p = {.nranks = P, .group_size = group, .need = need, .gram_err = gram_err};
    sumo__adasum_gram_weights(&p, G, N, want, want_flags, work);
    sumo_cuda__weights_args a = {.nin = P, .group_size = group, .need = need, .gram_err = gram_err,
                                 .narrow = narrow, .npieces = N, .totals = G, .w = w, .wide = wide,
                                 .flags = flags, .accept = &accept};
    sumo_cuda__weights_emulate(&a);
    bool any = false, wide_ok = true;
    for (size_t t = 0; t < N; t++) {
        any = any || want_flags[t];
        bool fits = true;
        /* Within float's normal range, or zero, or NaN (which narrows exactly). */
        for (int i = 0; i < P; i++) {
            double m = fabs(want[t * P + i]);
            fits = fits && (isnan(m) || (m <= FLT_MAX && (m == 0 || m >= FLT_MIN)));
        }
        wide_ok = wide_ok && wide[t] == (narrow && !fits);
    }
    bool same_w = memcmp(w, want, N * (size_t)P * sizeof *w) == 0;
    bool same_f = memcmp(flags, want_flags, N) == 0;
    free(G);
    free(w);
    free(want);
    CHECK(same_w, "P %d group %d need %g: weights differ from sumo__adasum_gram_weights", P, group, need);
    CHECK(same_f, "P %d group %d need %g: flags differ", P, group, need);
    CHECK(accept == (any ? 0u : 1u), "P %d: accept %u, flags say %d", P, accept, !any);
    CHECK(wide_ok, "P %d narrow %d: a wide flag is not the weights' (float's normal range)", P, narrow);
}

void t_combine_weights_emulated(void)
{
    for (int P = 1; P <= 16; P++) {
        check_weights(P, 1, 8 * 0x1p-23, 0, P % 2 == 0, 1000 + (uint64_t)P);
        check_weights(P, 1, 0, 0, true, 2000 + (uint64_t)P);
        check_weights(P, 1, 8 * 0x1p-10, 1e-12, false, 3000 + (uint64_t)P);
        for (int g = 2; g <= P; g++)
            if (P % g == 0) check_weights(P, g, 8 * 0x1p-23, 0, false, 4000 + (uint64_t)(P * 16 + g));
    }
    /* Every piece accepted: random vectors only (kind 0), so accept must be 1. */
    double G[3 * 8], w[2 * 8], work[8];
    unsigned char wide[8], flags[8], want_flags[8];
    unsigned int accept = 0;
    for (int t = 0; t < 8; t++) {
        G[3 * t] = 1.0 + t, G[3 * t + 1] = 0.25, G[3 * t + 2] = 2.0;
    }
    sumo_cuda__weights_args a = {.nin = 2, .group_size = 1, .need = 8 * 0x1p-23, .npieces = 8,
                                 .totals = G, .w = w, .wide = wide, .flags = flags, .accept = &accept};
    sumo_cuda__weights_emulate(&a);
    sumo__adasum_gram_params p = {.nranks = 2, .group_size = 1, .need = 8 * 0x1p-23};
    double want[16];
    sumo__adasum_gram_weights(&p, G, 8, want, want_flags, work);
    CHECK(accept == 1 && memcmp(w, want, sizeof w) == 0, "accepted pairs: accept %u", accept);
}

/* ---- the combine against the table path ----------------------------------------------------- */

/* A few tensors with an empty one (more pieces than travel in the arguments), and one. */
static const size_t CLAYOUT[6] = {5, 0, 3000, 1, 9000, 40};

typedef struct combine_case {
    sumo_dtype dt;
    int P, nout;
    bool in_place;
    bool one_tensor;
    /* 0: random inputs; 1: input 1 = -input 0 (an exact cancellation, accepted); 2: the same
     * but one element a few ulps off (fp32 with 3 or more inputs: a norm the guard calls
     * noise, declined) */
    int cancel;
} combine_case;

static size_t case_offsets(const combine_case *c, size_t *off)
{
    size_t T = c->one_tensor ? 1 : 6;
    off[0] = 0;
    for (size_t t = 0; t < T; t++) off[t + 1] = off[t] + (c->one_tensor ? 5003 : CLAYOUT[t]);
    return T;
}

static void make_inputs(const combine_case *c, size_t n, void **h)
{
    for (int j = 0; j < c->P; j++) {
        h[j] = malloc(n * esz(c->dt) + 8);
        gen(c->dt, h[j], n, 700 + (uint64_t)j * 13 + (uint64_t)c->P, false);
    }
    if (c->cancel && c->P > 1)
        for (size_t i = 0; i < n; i++) {
            double v = -harness_get(c->dt, h[0], i);
            if (c->cancel == 2 && i == 3) v = v * (1 + 0x1p-20) + 0x1p-20;
            harness_set(c->dt, h[1], i, v);
        }
}

/* A case's inputs on `kind` memory, and its outputs (the inputs themselves in place). */
typedef struct case_bufs {
    tbuf in[16], out[16];
    const void *ki[16];
    void *ko[16];
} case_bufs;

static void bufs_make(int kind, const combine_case *c, void *const *h, size_t n, case_bufs *b)
{
    for (int j = 0; j < c->P; j++) {
        b->in[j] = t_upload(kind, c->dt, h[j], n, 0);
        b->ki[j] = b->in[j].p;
    }
    for (int o = 0; o < c->nout; o++) {
        b->out[o] = c->in_place ? b->in[o] : t_alloc(kind, c->dt, n, 0);
        b->ko[o] = b->out[o].p;
    }
}

/* The outputs fetched to host (got), then every buffer freed. */
static void bufs_finish(int kind, const combine_case *c, size_t n, case_bufs *b, void **got)
{
    for (int o = 0; o < c->nout; o++) got[o] = fetch(kind, c->dt, &b->out[o], n);
    for (int j = 0; j < c->P; j++) m_free(kind, b->in[j].base);
    if (!c->in_place)
        for (int o = 0; o < c->nout; o++) m_free(kind, b->out[o].base);
}

/* The combine on `kind` memory through sumo_cuda_adasum_combine (outputs fetched to host). */
static void combine_on(int kind, sumo_cuda_kernels *k, const combine_case *c, void *const *h,
                       void **got, int *applied)
{
    size_t off[8], T = case_offsets(c, off), n = off[T];
    case_bufs b;
    bufs_make(kind, c, h, n, &b);
    *applied = -1;
    sumo_result r = sumo_cuda_adasum_combine(k, c->dt, b.ko, c->nout, b.ki, c->P, off, T, NULL,
                                             applied);
    if (r != SUMO_SUCCESS) *applied = -2;
    bufs_finish(kind, c, n, &b, got);
}

/* What a collective runs on one table: gram_partials into a zeroed array, the library's
 * weights (the accuracy its allreduce asks, flat), declined when any tensor's flags are set,
 * else weighted_sum. */
static void table_path(const sumo_kernel_table *k, int kind, const combine_case *c, void *const *h,
                       void **got, int *applied)
{
    size_t off[8], T = case_offsets(c, off), n = off[T], L = sumo__gram_len(c->P);
    case_bufs b;
    bufs_make(kind, c, h, n, &b);
    double *gram = calloc(T * L, sizeof *gram), *w = malloc(T * (size_t)c->P * sizeof *w), work[32];
    unsigned char flags[8];
    *applied = -2;
    if (k->gram_partials(k->ctx, NULL, c->dt, b.ki, c->P, off, T, 0, n, gram) == SUMO_SUCCESS) {
        sumo__adasum_gram_params p = {.nranks = c->P, .group_size = 1,
                                      .need = sumo__adasum_need(c->dt)};
        sumo__adasum_gram_weights(&p, gram, T, w, flags, work);
        *applied = 1;
        for (size_t t = 0; t < T; t++)
            if (flags[t]) *applied = 0;
        if (*applied && k->weighted_sum(k->ctx, NULL, c->dt, b.ko, c->nout, b.ki, c->P, off, T, 0,
                                        n, w) != SUMO_SUCCESS)
            *applied = -2;
    }
    free(gram);
    free(w);
    bufs_finish(kind, c, n, &b, got);
}

static void check_combine(const combine_case *c, int kind_a, sumo_cuda_kernels *ka, int kind_b,
                          sumo_cuda_kernels *kb)
{
    size_t off[8], T = case_offsets(c, off), n = off[T];
    void *h[16], *a[16], *b[16];
    int app_a, app_b;
    make_inputs(c, n, h);
    combine_on(kind_a, ka, c, h, a, &app_a);
    if (kb) combine_on(kind_b, kb, c, h, b, &app_b);
    else table_path(&g_emu_kernels->table, M_EMU, c, h, b, &app_b);
    size_t at = SIZE_MAX;
    for (int o = 0; o < c->nout && at == SIZE_MAX; o++) {
        size_t bytes = n * esz(c->dt);
        if (memcmp(a[o], b[o], bytes)) at = first_diff(c->dt, a[o], b[o], n), at = at == SIZE_MAX ? 0 : at;
    }
    /* Declined in place: the inputs are whole. */
    bool whole = true;
    if (app_a == 0 && c->in_place)
        for (int o = 0; o < c->nout; o++) whole = whole && memcmp(a[o], h[o], n * esz(c->dt)) == 0;
    for (int j = 0; j < c->P; j++) free(h[j]);
    for (int o = 0; o < c->nout; o++) {
        free(a[o]);
        free(b[o]);
    }
    CHECK(app_a == app_b && app_a >= 0, "%s P %d tensors %zu cancel %d: applied %d vs %d",
          DT_NAME[c->dt], c->P, T, c->cancel, app_a, app_b);
    CHECK(at == SIZE_MAX, "%s P %d tensors %zu nout %d in place %d cancel %d: outputs differ at %zu",
          DT_NAME[c->dt], c->P, T, c->nout, c->in_place, c->cancel, at);
    CHECK(whole, "%s P %d: declined, yet an input was written", DT_NAME[c->dt], c->P);
    const bool must_decline = c->cancel == 2 && c->P >= 3 && c->dt == SUMO_FLOAT32;
    CHECK(!must_decline || app_a == 0, "%s P %d: cancelling inputs were accepted", DT_NAME[c->dt], c->P);
    CHECK(c->cancel == 2 || app_a == 1, "%s P %d cancel %d: declined", DT_NAME[c->dt], c->P, c->cancel);
}

void t_combine_emulated(void)
{
    const int Ps[] = {1, 2, 3, 4, 5, 8, 16};
    for (size_t d = 0; d < 4; d++)
        for (size_t q = 0; q < sizeof Ps / sizeof Ps[0]; q++) {
            int P = Ps[q];
            if (DTS[d] == SUMO_FLOAT64 && P > 2) continue; /* fp64 declines beyond two (the header) */
            if (P > 4 && DTS[d] != SUMO_FLOAT32) continue;
            combine_case c = {.dt = DTS[d], .P = P, .nout = 1, .one_tensor = q % 2 == 0};
            check_combine(&c, M_EMU, g_emu_kernels, M_EMU, NULL);
            combine_case ip = {.dt = DTS[d], .P = P, .nout = P < 3 ? P : 3, .in_place = true,
                               .one_tensor = q % 2 == 1, .cancel = P >= 2 && P <= 4 ? 1 + (int)(d % 2) : 0};
            check_combine(&ip, M_EMU, g_emu_kernels, M_EMU, NULL);
        }
    /* Declined in place, with many tensors (uploaded pieces) and with one (in the arguments),
     * and with the decline's tensor among accepted ones. */
    for (int one = 0; one <= 1; one++)
        for (int P = 3; P <= 4; P++) {
            combine_case c = {.dt = SUMO_FLOAT32, .P = P, .nout = 3, .in_place = true,
                              .one_tensor = one, .cancel = 2};
            check_combine(&c, M_EMU, g_emu_kernels, M_EMU, NULL);
        }
    /* Arguments. */
    size_t off[2] = {1, 5};
    const void *ins[1] = {NULL};
    void *outs[1] = {NULL};
    int applied = 9;
    CHECK(sumo_cuda_adasum_combine(g_emu_kernels, SUMO_FLOAT32, outs, 1, ins, 1, off, 1, NULL, &applied) ==
              SUMO_ERR_INVALID_ARGUMENT && applied == 0,
          "offsets not from 0");
    off[0] = 0;
    CHECK(sumo_cuda_adasum_combine(g_emu_kernels, SUMO_FLOAT32, outs, 1, ins, 17, off, 1, NULL, &applied) ==
              SUMO_ERR_INVALID_ARGUMENT,
          "17 inputs");
    CHECK(sumo_cuda_adasum_combine(NULL, SUMO_FLOAT32, outs, 1, ins, 1, off, 1, NULL, &applied) ==
              SUMO_ERR_INVALID_ARGUMENT,
          "NULL kernels");
    off[1] = 0;
    CHECK(sumo_cuda_adasum_combine(g_emu_kernels, SUMO_FLOAT32, outs, 1, ins, 2, off, 1, NULL, &applied) ==
              SUMO_SUCCESS && applied == 1,
          "an empty layout is applied, trivially");
}

/* ---- on the device ------------------------------------------------------------------------ */

/* The device combine against the emulated one, bit for bit (the Gram partials, the weights and
 * the weighted sum each run the emulator's order), declines included; and against the device
 * table path. */
void d_combine(void)
{
    const int Ps[] = {1, 2, 3, 4, 8, 16};
    for (size_t d = 0; d < 4; d++)
        for (size_t q = 0; q < sizeof Ps / sizeof Ps[0]; q++)
            for (int one = 0; one <= 1; one++) {
                int P = Ps[q];
                if (DTS[d] == SUMO_FLOAT64 && P > 2) continue;
                combine_case c = {.dt = DTS[d], .P = P, .nout = 1, .one_tensor = one};
                check_combine(&c, M_DEV, g_dev_kernels, M_EMU, g_emu_kernels);
                combine_case ip = {.dt = DTS[d], .P = P, .nout = P < 3 ? P : 3, .in_place = true,
                                   .one_tensor = one, .cancel = P >= 2 && P <= 4 ? 1 + one : 0};
                check_combine(&ip, M_DEV, g_dev_kernels, M_EMU, g_emu_kernels);
            }
}
