/*
 * The DiLoCo tests' problem, configurations, reference and library runner (test_diloco.c,
 * test_diloco_api.c): what the reference is and how precise, is said in test_diloco.c.
 */
#ifndef SUMO_TEST_DILOCO_REFERENCE_H
#define SUMO_TEST_DILOCO_REFERENCE_H

#define SUMO_EXPERIMENTAL_API 1
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "sumo_diloco.h"
#include "sumo_distributed.h"
#include "support/harness.h"
#include "support/reference.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAXP 5
#define MAXT 40
#define N 27
#define TOL 2e-4

/* Seven tensors, one empty. */
static const size_t LAYOUT[] = {5, 3, 0, 7, 4, 6, 2};
#define NT (sizeof LAYOUT / sizeof LAYOUT[0])

/* ---- the problem ---------------------------------------------------------------------------- */

static inline double coef_a(int rank, size_t j)
{
    return 0.3 + 0.3 * (harness_uniform_at(11, (uint64_t)rank, j) + 1) / 2;
}
static inline double coef_c(int rank, size_t j) { return 2.0 * harness_uniform_at(12, (uint64_t)rank, j); }
static inline double x_init(size_t j) { return harness_uniform_at(13, 0, j); }
static inline double lr_at(int k) { return 0.1 + 0.002 * k; } /* the rate of local step k (1-based) */

/* One local step of rank r at rate lr on fp32 parameters: rounded once. */
static inline void local_step_f(int r, float *x, double lr)
{
    for (size_t j = 0; j < N; j++) x[j] = (float)((double)x[j] - lr * coef_a(r, j) * ((double)x[j] - coef_c(r, j)));
}

/* ---- configuration ---------------------------------------------------------------------- */

typedef struct cfg {
    int P, H, F, delay;
    double merge;
    sumo_outer_optimizer outer;
    double lr, mu;
    sumo_outer_combine combine;
    sumo_compression_format comp;
    size_t block;
    int strided; /* fragment_of = t % F */
    int ranges;  /* SUMO_SPLIT_RANGES: F ranges of the flat vector, cutting tensors */
    int sharded; /* memory_efficient */
    int steps;
} cfg;

static inline sumo_diloco_options options_of(const cfg *c, int *fragment_of)
{
    sumo_diloco_options o;
    sumo_diloco_options_default(SUMO_DILOCO_PRESET_DILOCO, &o);
    o.sync_every = c->H;
    o.fragments = c->F;
    o.delay = c->delay;
    o.merge_alpha = c->merge;
    o.outer = c->outer;
    o.lr = c->lr;
    o.momentum = c->mu;
    o.combine = c->combine;
    o.compression = c->comp;
    o.block_size = c->block ? c->block : 8;
    if (c->strided) {
        for (size_t t = 0; t < NT; t++) fragment_of[t] = (int)(t % (size_t)c->F);
        o.fragment_of = fragment_of;
    }
    if (c->ranges) o.split = SUMO_SPLIT_RANGES;
    o.memory_efficient = c->sharded;
    return o;
}

/* ---- the reference ---------------------------------------------------------------------- */

typedef struct ref {
    const cfg *c;
    bool doc;                /* DOC precision (fp32 storage), else EXACT */
    int frag_of_elem[N];
    int tensor_frag[NT];
    size_t first[16];        /* s_f */
    double theta[MAXP][N], anchor[N], v[N], comb[N];
    int pending;
    int apply_at;
    double gamma;
    bool from_average;
    ref_acga acga[16];
} ref;

static inline double rnd(const ref *R, double x) { return R->doc ? (double)(float)x : x; }

/* The documented split: contiguous whole tensors, fragment f closed at the first tensor
 * boundary where the running count reaches ceil((f + 1) n / F), one tensor left for each
 * later fragment; or t % F. */
static inline void ref_split(const cfg *c, int *tensor_frag)
{
    if (c->strided) {
        for (size_t t = 0; t < NT; t++) tensor_frag[t] = (int)(t % (size_t)c->F);
        return;
    }
    size_t t = 0, sum = 0;
    for (int f = 0; f < c->F; f++) {
        double target = ceil((double)N * (f + 1) / c->F);
        do {
            tensor_frag[t] = f;
            sum += LAYOUT[t++];
        } while (t < NT - (size_t)(c->F - 1 - f) && (f == c->F - 1 || (double)sum < target));
    }
}

static inline void ref_init(ref *R, const cfg *c, bool doc)
{
    memset(R, 0, sizeof *R);
    R->c = c;
    R->doc = doc;
    int *tf = R->tensor_frag;
    size_t j = 0;
    if (!c->ranges) { /* whole tensors (F <= NT) */
        ref_split(c, tf);
        for (size_t t = 0; t < NT; t++)
            for (size_t e = 0; e < LAYOUT[t]; e++) R->frag_of_elem[j++] = tf[t];
    }
    /* Ranges: element j belongs to the f with floor(f N / F) <= j < floor((f + 1) N / F). */
    for (j = 0; c->ranges && j < N; j++)
        for (int f = 0; f < c->F; f++)
            if ((size_t)f * N / (size_t)c->F <= j && j < (size_t)(f + 1) * N / (size_t)c->F)
                R->frag_of_elem[j] = f;
    for (int f = 0; f < c->F; f++) R->first[f] = (size_t)((f + 1) * c->H / c->F);
    for (int r = 0; r < c->P; r++)
        for (j = 0; j < N; j++) R->theta[r][j] = rnd(R, x_init(j));
    for (j = 0; j < N; j++) R->anchor[j] = R->theta[0][j];
    R->pending = -1;
    if (c->combine == SUMO_COMBINE_ACGA)
        for (int f = 0; f < c->F; f++) {
            sumo_aggregator_options o;
            sumo_aggregator_options_default(SUMO_AGGREGATE_ACGA, &o);
            o.acga.rescale = 1; /* sumo_diloco's default */
            size_t cnt = 0;
            for (j = 0; j < N; j++) cnt += R->frag_of_elem[j] == f;
            assert_int_equal(ref_acga_init(&R->acga[f], c->P, &o, cnt), 0);
        }
}

static inline void ref_free(ref *R)
{
    if (R->c->combine == SUMO_COMBINE_ACGA)
        for (int f = 0; f < R->c->F; f++) ref_acga_free(&R->acga[f]);
}

static inline int ref_starting(const ref *R, int k)
{
    for (int f = 0; f < R->c->F; f++)
        if ((size_t)k >= R->first[f] && ((size_t)k - R->first[f]) % (size_t)R->c->H == 0) return f;
    return -1;
}

static inline void ref_apply(ref *R)
{
    const cfg *c = R->c;
    int f = R->pending;
    R->pending = -1;
    for (size_t j = 0; j < N; j++) {
        if (R->frag_of_elem[j] != f) continue;
        double x0 = R->anchor[j];
        double d = R->from_average ? x0 - R->comb[j] : R->comb[j];
        double vd, gd;
        if (c->outer == SUMO_OUTER_NESTEROV) {
            vd = c->mu * R->v[j] + d;
            gd = x0 - c->lr * (d + c->mu * vd);
        } else {
            vd = c->mu * R->v[j] + d / R->gamma;
            gd = x0 - c->lr * R->gamma * vd;
        }
        R->v[j] = rnd(R, vd);
        double g = isfinite(R->v[j]) ? rnd(R, gd) : NAN;
        R->anchor[j] = g;
        for (int r = 0; r < c->P; r++)
            R->theta[r][j] = c->merge == 0 ? g : rnd(R, c->merge * R->theta[r][j] + (1 - c->merge) * g);
    }
}

/* The combine of the fragment's outer gradients (or parameters) into comb. */
static inline void ref_start(ref *R, int f, double lr)
{
    const cfg *c = R->c;
    int P = c->P;
    size_t idx[N], nf = 0;
    for (size_t j = 0; j < N; j++)
        if (R->frag_of_elem[j] == f) idx[nf++] = j;
    R->from_average = c->combine == SUMO_COMBINE_AVERAGE && c->comp == SUMO_COMPRESS_NONE;
    if (R->from_average) {
        for (size_t q = 0; q < nf; q++) {
            size_t j = idx[q];
            double s = R->theta[0][j];
            for (int r = 1; r < P; r++) s = rnd(R, s + R->theta[r][j]);
            R->comb[j] = rnd(R, s / P);
        }
    } else if (c->comp != SUMO_COMPRESS_NONE) {
        /* sumo.h's definition over the gathered fragment: each rank's x0 - x (rounded once)
         * through the codec, the fp32 sum in rank order, divided once, the codec again. */
        float in[MAXP][N], acc[N], t[N], out[N];
        for (int r = 0; r < P; r++) {
            for (size_t q = 0; q < nf; q++) in[r][q] = (float)(R->anchor[idx[q]] - R->theta[r][idx[q]]);
            ref_roundtrip(c->comp, c->block, in[r], t, nf);
            for (size_t q = 0; q < nf; q++) acc[q] = r ? acc[q] + t[q] : t[q];
        }
        for (size_t q = 0; q < nf; q++) acc[q] = acc[q] / (float)P;
        ref_roundtrip(c->comp, c->block, acc, out, nf);
        for (size_t q = 0; q < nf; q++) R->comb[idx[q]] = out[q];
    } else if (c->combine == SUMO_COMBINE_ADASUM) {
        /* Adasum per tensor of the fragment, in double. */
        double *u[MAXP], buf[MAXP][N];
        size_t off[NT + 1], T = 0, start = 0;
        off[0] = 0;
        for (size_t t = 0; t < NT; start += LAYOUT[t], t++) {
            /* The fragment's elements of tensor t (with ranges, the piece inside the range;
             * an empty piece is no tensor of the fragment). */
            size_t in = 0;
            for (size_t e = start; e < start + LAYOUT[t]; e++) in += R->frag_of_elem[e] == f;
            if (c->ranges ? in > 0 : R->tensor_frag[t] == f) {
                off[T + 1] = off[T] + in;
                T++;
            }
        }
        for (int r = 0; r < P; r++) {
            for (size_t q = 0; q < nf; q++) buf[r][q] = R->anchor[idx[q]] - R->theta[r][idx[q]];
            u[r] = buf[r];
        }
        ref_adasum_tree(u, P, off, T);
        for (size_t q = 0; q < nf; q++) R->comb[idx[q]] = u[0][q];
    } else {
        float in[MAXP][N];
        float *pin[MAXP];
        double G[N], bound[N];
        for (int r = 0; r < P; r++) {
            for (size_t q = 0; q < nf; q++) in[r][q] = (float)(R->anchor[idx[q]] - R->theta[r][idx[q]]);
            pin[r] = in[r];
        }
        ref_acga_step(&R->acga[f], pin, G, bound);
        for (size_t q = 0; q < nf; q++) R->comb[idx[q]] = G[q];
    }
    R->pending = f;
    R->gamma = lr;
}

/* End of local step k (the local steps already taken). */
static inline void ref_end(ref *R, int k)
{
    if (R->pending >= 0 && R->apply_at == k) ref_apply(R);
    int f = ref_starting(R, k);
    if (f >= 0) {
        ref_start(R, f, lr_at(k));
        R->apply_at = k + R->c->delay;
        if (R->c->delay == 0) ref_apply(R);
    }
}

static inline void ref_local(ref *R, int k)
{
    for (int r = 0; r < R->c->P; r++)
        for (size_t j = 0; j < N; j++)
            R->theta[r][j] = rnd(R, R->theta[r][j] - lr_at(k) * coef_a(r, j) * (R->theta[r][j] - coef_c(r, j)));
}

/* ---- running the library ------------------------------------------------------------------ */

typedef struct run {
    const cfg *c;
    float trace[MAXP][MAXT + 1][N];
    int communicated[MAXP][MAXT + 1];
    int due[MAXP][MAXT + 1];
    sumo_result err[MAXP];
    int failed_step[MAXP];
    /* resume: stop after `save_at` steps, save, destroy, recreate, load, go on */
    int save_at;
} run;

static inline void run_rank(sumo_comm *comm, int rank, int size, void *arg)
{
    (void)size;
    run *R = arg;
    const cfg *c = R->c;
    int fo[NT];
    sumo_diloco_options o = options_of(c, fo);
    sumo_diloco *d = NULL;
    R->failed_step[rank] = -1;
    sumo_result r = sumo_diloco_create(comm, LAYOUT, NT, N, SUMO_FLOAT32, &o, &d);
    float x[N];
    for (size_t j = 0; j < N; j++) x[j] = (float)x_init(j);
    for (int k = 1; r == SUMO_SUCCESS && k <= c->steps; k++) {
        int what = -1;
        r = sumo_diloco_due(d, &what, NULL, NULL);
        R->due[rank][k] = what;
        if (r == SUMO_SUCCESS) r = sumo_diloco_begin(d, x);
        local_step_f(rank, x, lr_at(k));
        if (r == SUMO_SUCCESS) r = sumo_diloco_end(d, x, lr_at(k), &R->communicated[rank][k]);
        if (r != SUMO_SUCCESS) R->failed_step[rank] = k;
        memcpy(R->trace[rank][k], x, sizeof x);
        if (r == SUMO_SUCCESS && k == R->save_at) {
            size_t bytes = 0;
            r = sumo_diloco_state_size(d, &bytes);
            void *buf = malloc(bytes);
            if (r == SUMO_SUCCESS) r = sumo_diloco_state_save(d, buf, bytes);
            sumo_diloco_destroy(d);
            d = NULL;
            if (r == SUMO_SUCCESS) r = sumo_diloco_create(comm, LAYOUT, NT, N, SUMO_FLOAT32, &o, &d);
            if (r == SUMO_SUCCESS) r = sumo_diloco_state_load(d, buf, bytes);
            free(buf);
        }
    }
    R->err[rank] = r;
    sumo_diloco_destroy(d);
}

static inline run *run_lib(const cfg *c, int save_at)
{
    run *R = calloc(1, sizeof *R);
    assert_non_null(R);
    R->c = c;
    R->save_at = save_at;
    assert_int_equal(harness_run_threads(c->P, run_rank, R), 0);
    for (int r = 0; r < c->P; r++)
        if (R->err[r] != SUMO_SUCCESS)
            fail_msg("P %d H %d F %d delay %d: rank %d %s at step %d", c->P, c->H, c->F, c->delay,
                     r, sumo_result_name(R->err[r]), R->failed_step[r]);
    return R;
}

static inline uint32_t fbits(float f)
{
    uint32_t b;
    memcpy(&b, &f, sizeof b);
    return b;
}

static inline void describe(const cfg *c, char *s, size_t len)
{
    snprintf(s, len, "P %d H %d F %d delay %d merge %g %s lr %g mu %g combine %d comp %d%s", c->P,
             c->H, c->F, c->delay, c->merge, c->outer == SUMO_OUTER_NESTEROV ? "nesterov" : "heavy-ball",
             c->lr, c->mu, (int)c->combine, (int)c->comp,
             c->strided ? " strided" : c->ranges ? " ranges" : "");
}

/* The library against the references, every rank, every step. */
static inline void check_against_references(const cfg *c, bool bitwise)
{
    char what[200];
    describe(c, what, sizeof what);
    run *L = run_lib(c, 0);
    ref *E = malloc(sizeof *E), *D = malloc(sizeof *D);
    assert_true(E && D);
    ref_init(E, c, false);
    ref_init(D, c, true);
    for (int k = 1; k <= c->steps; k++) {
        ref_local(E, k);
        ref_local(D, k);
        ref_end(E, k);
        ref_end(D, k);
        for (int r = 0; r < c->P; r++)
            for (size_t j = 0; j < N; j++) {
                float got = L->trace[r][k][j];
                double want = E->theta[r][j];
                if (!(fabs((double)got - want) <= TOL * fmax(1.0, fabs(want))))
                    fail_msg("%s: rank %d step %d element %zu: %.9g, float64 reference %.9g", what, r,
                             k, j, (double)got, want);
                if (bitwise && fbits(got) != fbits((float)D->theta[r][j]))
                    fail_msg("%s: rank %d step %d element %zu: %a, documented arithmetic %a", what,
                             r, k, j, (double)got, D->theta[r][j]);
            }
    }
    ref_free(E);
    ref_free(D);
    free(E);
    free(D);
    free(L);
}


#endif
