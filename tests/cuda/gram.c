/*
 * test_cuda: the Gram partials and dot products, which sum in an order of their own: within a
 * stated bound of a float64 reference (compensated sums) and of the host table, the same bits
 * at other addresses and on another run, dot_norms the two-input case; on the device, the
 * emulator's bits exactly (the device sums in the order the emulator writes out).
 */
#include "cuda_test.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- references -------------------------------------------------------------------------- */

/* Compensated (Neumaier) sum of x_a x_b in double, with each product's rounding error from an
 * fma: far closer to the exact value than the bound below. */
static double exact_dot(sumo_dtype dt, const void *a, const void *b, size_t n, double *abs_sum)
{
    double s = 0, c = 0, m = 0;
    for (size_t i = 0; i < n; i++) {
        double x = harness_get(dt, a, i), y = harness_get(dt, b, i);
        double p = x * y, e = fma(x, y, -p);
        double terms[2] = {p, e};
        for (int k = 0; k < 2; k++) {
            double t = s + terms[k];
            c += fabs(s) >= fabs(terms[k]) ? (s - t) + terms[k] : (terms[k] - t) + s;
            s = t;
        }
        m += fabs(p);
    }
    *abs_sum = m;
    return s + c;
}

/* A sum of n products in double, in any order, is within n u sum|x_a x_b| of the exact value
 * (u = 2^-53; a fused multiply-add rounds once per term). */
static bool within_gram_bound(double got, double exact, double abs_sum, size_t n)
{
    return fabs(got - exact) <= (double)(n + 2) * 0x1p-53 * abs_sum + 1e-300;
}

typedef struct gram_case {
    sumo_dtype dt;
    int nin;
    size_t lo, hi; /* of the layout */
    size_t off;    /* elements past alignment */
} gram_case;

/* The partials on `kind` memory (added into a zeroed host array, as sumo calls it). */
static void gram_on(const entry_run *er, const gram_case *g, void *const *hin, double *out)
{
    size_t offs[NLAYOUT + 1];
    layout_offsets(offs);
    size_t n = g->hi - g->lo, L = sumo_cuda__gram_len(g->nin);
    tbuf din[16];
    const void *ki[16];
    /* Every input at the same distance from alignment: 0 lets the device load whole 16-byte
     * vectors where a piece starts aligned, anything else makes it load element by element. */
    for (int j = 0; j < g->nin; j++) {
        din[j] = t_upload(er->kind, g->dt, hin[j], n, g->off);
        ki[j] = din[j].p;
    }
    memset(out, 0, NLAYOUT * L * sizeof *out);
    sumo_result r = er->k->gram_partials(er->k->ctx, er->stream, g->dt, ki, g->nin, offs, NLAYOUT,
                                         g->lo, g->hi, out);
    if (r != SUMO_SUCCESS) out[0] = NAN;
    for (int j = 0; j < g->nin; j++) m_free(er->kind, din[j].base);
}

static void check_gram(const entry_run *er, const gram_case *g)
{
    size_t offs[NLAYOUT + 1];
    layout_offsets(offs);
    size_t n = g->hi - g->lo, L = sumo_cuda__gram_len(g->nin);
    void *hin[16];
    for (int j = 0; j < g->nin; j++) {
        hin[j] = malloc(n * esz(g->dt) + 1);
        gen(g->dt, hin[j], n, 500 + (uint64_t)j, false);
    }
    double *got = calloc(NLAYOUT * L, sizeof *got), *again = calloc(NLAYOUT * L, sizeof *again);
    double *host = calloc(NLAYOUT * L, sizeof *host);
    gram_on(er, g, hin, got);
    /* Another address (the other load path) and another run: the same bits. */
    gram_case g2 = *g;
    g2.off = g->off ? 0 : 3;
    gram_on(er, &g2, hin, again);
    bool same = memcmp(got, again, NLAYOUT * L * sizeof *got) == 0;
    CHECK_OK(g_host->gram_partials(g_host->ctx, NULL, g->dt, (const void *const *)hin, g->nin, offs,
                                   NLAYOUT, g->lo, g->hi, host));
    for (size_t t = 0; t < NLAYOUT; t++) {
        size_t s = offs[t] > g->lo ? offs[t] : g->lo, e = offs[t + 1] < g->hi ? offs[t + 1] : g->hi;
        size_t len = e > s ? e - s : 0;
        int q = 0;
        for (int a = 0; a < g->nin; a++)
            for (int b = a; b < g->nin; b++, q++) {
                double abs_sum = 0, exact = 0;
                if (len)
                    exact = exact_dot(g->dt, (unsigned char *)hin[a] + (s - g->lo) * esz(g->dt),
                                      (unsigned char *)hin[b] + (s - g->lo) * esz(g->dt), len, &abs_sum);
                double v = got[t * L + (size_t)q];
                CHECK(within_gram_bound(v, exact, abs_sum, len),
                      "gram %s nin %d tensor %zu (%d,%d): %.17g, exact %.17g (bound %.3g)",
                      DT_NAME[g->dt], g->nin, t, a, b, v, exact, (double)(len + 2) * 0x1p-53 * abs_sum);
                CHECK(within_gram_bound(host[t * L + (size_t)q], exact, abs_sum, len), "host gram");
            }
    }
    CHECK(same, "gram %s nin %d: other addresses gave other bits", DT_NAME[g->dt], g->nin);
    /* dot_norms: the two-input case over one piece, (a.b, |a|^2, |b|^2) */
    if (g->nin >= 2) {
        tbuf a = t_upload(er->kind, g->dt, hin[0], n, g->off), b = t_upload(er->kind, g->dt, hin[1], n, 0);
        double d[3], w[3], abs_sum;
        CHECK_OK(er->k->dot_norms(er->k->ctx, er->stream, g->dt, a.p, b.p, n, d));
        const void *pair[2] = {a.p, b.p};
        const size_t one[2] = {0, n};
        double g3[3] = {0, 0, 0};
        CHECK_OK(er->k->gram_partials(er->k->ctx, er->stream, g->dt, pair, 2, one, 1, 0, n, g3));
        CHECK(d[0] == g3[1] && d[1] == g3[0] && d[2] == g3[2], "dot_norms is the two-input Gram");
        w[0] = exact_dot(g->dt, hin[0], hin[1], n, &abs_sum);
        CHECK(within_gram_bound(d[0], w[0], abs_sum, n), "dot %.17g vs %.17g", d[0], w[0]);
        w[1] = exact_dot(g->dt, hin[0], hin[0], n, &abs_sum);
        CHECK(within_gram_bound(d[1], w[1], abs_sum, n), "|a|^2");
        m_free(er->kind, a.base);
        m_free(er->kind, b.base);
    }
    for (int j = 0; j < g->nin; j++) free(hin[j]);
    free(got);
    free(again);
    free(host);
}

void check_gram_all(int kind)
{
    entry_run er = {.kind = kind, .k = table_of(kind)};
    size_t offs[NLAYOUT + 1], total = layout_offsets(offs);
    const int nins[] = {2, 3, 4, 5, 8, 9, 16};
    for (size_t d = 0; d < 4; d++)
        for (size_t q = 0; q < sizeof nins / sizeof nins[0]; q++) {
            if (g_quick && nins[q] > 4 && nins[q] != 16) continue;
            gram_case g = {.dt = DTS[d], .nin = nins[q], .lo = 0, .hi = total, .off = 0};
            check_gram(&er, &g);
            gram_case h = {.dt = DTS[d], .nin = nins[q], .lo = 135, .hi = total - 2000, .off = 1};
            check_gram(&er, &h);
            /* Two pieces: in the launch's arguments, not uploaded (the path does not depend on
             * nin: two input counts suffice). */
            if (nins[q] > 3) continue;
            gram_case few = {.dt = DTS[d], .nin = nins[q], .lo = 700, .hi = total - 2000, .off = 0};
            check_gram(&er, &few);
        }
}

/* ---- on the device ----------------------------------------------------------------------- */

/* Device Gram partials: the bound, address independence (check_gram), and the emulator's
 * bits exactly: the device sums in the order the emulator writes out. */
void d_gram(void)
{
    check_gram_all(M_DEV);
    size_t offs[NLAYOUT + 1], total = layout_offsets(offs);
    entry_run dev = {.kind = M_DEV, .k = g_dev_table}, emu = {.kind = M_EMU, .k = g_emu_table};
    /* 5: the 8-input kernel with inputs it must not load (its parts path masks them). */
    const int nins[] = {2, 3, 5, 8, 16};
    const size_t NQ = sizeof nins / sizeof nins[0];
    for (size_t d = 0; d < 4; d++)
        for (size_t q = 0; q < NQ; q++) {
            gram_case g = {.dt = DTS[d], .nin = nins[q], .lo = 11, .hi = total, .off = 0};
            size_t n = g.hi - g.lo, L = sumo_cuda__gram_len(g.nin);
            void *hin[16];
            for (int j = 0; j < g.nin; j++) {
                hin[j] = malloc(n * esz(g.dt) + 1);
                gen(g.dt, hin[j], n, 900 + (uint64_t)j, false);
            }
            double *a = calloc(NLAYOUT * L, 8), *b = calloc(NLAYOUT * L, 8);
            gram_on(&dev, &g, hin, a);
            gram_on(&emu, &g, hin, b);
            bool same = memcmp(a, b, NLAYOUT * L * 8) == 0;
            for (int j = 0; j < g.nin; j++) free(hin[j]);
            free(a);
            free(b);
            CHECK(same, "gram %s nin %d: device and emulator differ", DT_NAME[g.dt], g.nin);
        }
    /* One tensor starting aligned (the vector loads) and one element off (element loads):
     * device, device and emulator give the same bits. */
    for (size_t q = 0; q < NQ; q++) {
        size_t n1 = g_quick ? 20000 : 300001, one[2] = {0, n1};
        int nin = nins[q];
        void *hin[16];
        const void *ka[16], *kb[16], *ke[16];
        tbuf da[16], db[16], de[16];
        for (int j = 0; j < nin; j++) {
            hin[j] = malloc(n1 * 4);
            gen(SUMO_FLOAT32, hin[j], n1, 40 + (uint64_t)j, false);
            da[j] = t_upload(M_DEV, SUMO_FLOAT32, hin[j], n1, 0);
            db[j] = t_upload(M_DEV, SUMO_FLOAT32, hin[j], n1, 1);
            de[j] = t_upload(M_EMU, SUMO_FLOAT32, hin[j], n1, 0);
            ka[j] = da[j].p, kb[j] = db[j].p, ke[j] = de[j].p;
        }
        double ga[136] = {0}, gb[136] = {0}, ge[136] = {0};
        CHECK_OK(g_dev_table->gram_partials(g_dev_table->ctx, NULL, SUMO_FLOAT32, ka, nin, one, 1, 0, n1, ga));
        CHECK_OK(g_dev_table->gram_partials(g_dev_table->ctx, NULL, SUMO_FLOAT32, kb, nin, one, 1, 0, n1, gb));
        CHECK_OK(g_emu_table->gram_partials(g_emu_table->ctx, NULL, SUMO_FLOAT32, ke, nin, one, 1, 0, n1, ge));
        size_t L = sumo_cuda__gram_len(nin);
        bool same = memcmp(ga, gb, L * 8) == 0 && memcmp(ga, ge, L * 8) == 0;
        for (int j = 0; j < nin; j++) {
            free(hin[j]);
            m_free(M_DEV, da[j].base);
            m_free(M_DEV, db[j].base);
            m_free(M_EMU, de[j].base);
        }
        CHECK(same, "one tensor, nin %d: aligned, misaligned and emulated differ", nin);
    }
    /* A large single tensor (many items, two levels of the reduction), twice. */
    size_t n = g_quick ? (size_t)1 << 18 : (size_t)3 << 22;
    float *x = malloc(n * 4), *y = malloc(n * 4);
    gen(SUMO_FLOAT32, x, n, 1, false);
    gen(SUMO_FLOAT32, y, n, 2, false);
    tbuf dx = t_upload(M_DEV, SUMO_FLOAT32, x, n, 0), dy = t_upload(M_DEV, SUMO_FLOAT32, y, n, 0);
    double r1[3], r2[3], abs_sum;
    CHECK_OK(g_dev_table->dot_norms(g_dev_table->ctx, NULL, SUMO_FLOAT32, dx.p, dy.p, n, r1));
    CHECK_OK(g_dev_table->dot_norms(g_dev_table->ctx, NULL, SUMO_FLOAT32, dx.p, dy.p, n, r2));
    CHECK(memcmp(r1, r2, sizeof r1) == 0, "two runs, two results");
    double ex = exact_dot(SUMO_FLOAT32, x, y, n, &abs_sum);
    CHECK(within_gram_bound(r1[0], ex, abs_sum, n), "large dot %.17g vs %.17g", r1[0], ex);
    m_free(M_DEV, dx.base);
    m_free(M_DEV, dy.base);
    free(x);
    free(y);
}
