/*
 * test_cuda: the entries whose results are exactly defined (every one but the Gram partials),
 * on `kind` memory against sumo's host table, bit for bit (NaN payloads aside on a device):
 * every 16-bit pattern through convert, fill, scan, reduce (far pointers too), convert,
 * scaled_add (the wide path too), delta, apply_delta, outer_update, the codec,
 * weighted_sum; aligned and not, in place and not.
 */
#include "cuda_test.h"

#include <cuda_runtime_api.h>

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- conversions ------------------------------------------------------------------------- */

/* Every 16-bit pattern widened, and narrowing from float and double (round to nearest even,
 * through round-to-odd from double), as the host table converts them. */
void check_convert_patterns(int kind)
{
    const sumo_kernel_table *k = table_of(kind);
    enum { N = 65536 };
    uint16_t *h16 = malloc(N * sizeof *h16);
    float *hf = malloc(N * sizeof *hf), *wf = malloc(N * sizeof *wf);
    double *hd = malloc(N * sizeof *hd), *wd = malloc(N * sizeof *wd);
    uint16_t *w16 = malloc(N * sizeof *w16);
    void *d16 = m_alloc(kind, N * 2), *d32 = m_alloc(kind, N * 4), *d64 = m_alloc(kind, N * 8);
    for (int fmt = 0; fmt < 2; fmt++) {
        sumo_dtype dt = fmt ? SUMO_BFLOAT16 : SUMO_FLOAT16;
        for (size_t i = 0; i < N; i++) h16[i] = (uint16_t)i;
        m_put(kind, d16, h16, N * 2);
        CHECK_OK(k->convert(k->ctx, NULL, SUMO_FLOAT32, d32, dt, d16, N));
        CHECK_OK(g_host->convert(g_host->ctx, NULL, SUMO_FLOAT32, wf, dt, h16, N));
        m_get(kind, hf, d32, N * 4);
        size_t at = first_diff(SUMO_FLOAT32, hf, wf, N);
        CHECK(at == SIZE_MAX, "%s -> fp32: pattern %zx", DT_NAME[dt], at);
        /* float -> 16 bits: every float near each 16-bit value and the halfway points. */
        uint64_t s = 99 + (uint64_t)fmt;
        for (size_t i = 0; i < N; i++) {
            uint32_t u;
            memcpy(&u, &wf[i], 4);
            u += (uint32_t)(harness_next(&s) % 0x4000u) - 0x2000u;
            if (i % 3 == 0) u = (uint32_t)harness_next(&s);
            memcpy(&hf[i], &u, 4);
        }
        m_put(kind, d32, hf, N * 4);
        CHECK_OK(k->convert(k->ctx, NULL, dt, d16, SUMO_FLOAT32, d32, N));
        CHECK_OK(g_host->convert(g_host->ctx, NULL, dt, w16, SUMO_FLOAT32, hf, N));
        m_get(kind, h16, d16, N * 2);
        at = first_diff(dt, h16, w16, N);
        CHECK(at == SIZE_MAX, "fp32 -> %s at %zu (%a)", DT_NAME[dt], at, (double)hf[at]);
        /* double -> 16 bits: values just off the halfway points (where double rounding errs). */
        for (size_t i = 0; i < N; i++) {
            double v = (double)wf[i];
            hd[i] = isfinite(v) ? v * (1 + ldexp(harness_uniform(&s), -20 - (int)(i % 30))) : v;
        }
        m_put(kind, d64, hd, N * 8);
        CHECK_OK(k->convert(k->ctx, NULL, dt, d16, SUMO_FLOAT64, d64, N));
        CHECK_OK(g_host->convert(g_host->ctx, NULL, dt, w16, SUMO_FLOAT64, hd, N));
        m_get(kind, h16, d16, N * 2);
        at = first_diff(dt, h16, w16, N);
        CHECK(at == SIZE_MAX, "fp64 -> %s at %zu (%a)", DT_NAME[dt], at, hd[at]);
        /* and back to double (exact) */
        CHECK_OK(k->convert(k->ctx, NULL, SUMO_FLOAT64, d64, dt, d16, N));
        CHECK_OK(g_host->convert(g_host->ctx, NULL, SUMO_FLOAT64, wd, dt, w16, N));
        m_get(kind, hd, d64, N * 8);
        at = first_diff(SUMO_FLOAT64, hd, wd, N);
        CHECK(at == SIZE_MAX, "%s -> fp64 at %zu", DT_NAME[dt], at);
    }
    m_free(kind, d16);
    m_free(kind, d32);
    m_free(kind, d64);
    free(h16);
    free(hf);
    free(wf);
    free(hd);
    free(wd);
    free(w16);
}

/* ---- the exactly defined entries --------------------------------------------------------- */

static void check_fill_scan(const entry_run *er, sumo_dtype dt, size_t n, size_t off)
{
    const double values[] = {0.1, -0.0, 1e10, 65519.0, 65520.0, NAN, 1e-8, -3.5, 1e300};
    for (size_t v = 0; v < sizeof values / sizeof values[0]; v++) {
        tbuf b = t_alloc(er->kind, dt, n, off);
        void *want = malloc(n * esz(dt) + 1);
        CHECK_OK(er->k->fill(er->k->ctx, er->stream, dt, b.p, values[v], n));
        CHECK_OK(g_host->fill(g_host->ctx, NULL, dt, want, values[v], n));
        void *got = fetch(er->kind, dt, &b, n);
        size_t at = first_diff(dt, got, want, n);
        CHECK(at == SIZE_MAX, "fill %s %g n %zu at %zu", DT_NAME[dt], values[v], n, at);
        free(got);
        free(want);
        m_free(er->kind, b.base);
    }
    /* The first non-finite: none, one, two (the first wins), at the ends. */
    void *h = malloc(n * esz(dt) + 1);
    const size_t where[][2] = {{SIZE_MAX, SIZE_MAX}, {0, SIZE_MAX}, {n - 1, SIZE_MAX},
                               {n / 2, n / 3}, {n / 3, n - 1}};
    for (size_t w = 0; w < sizeof where / sizeof where[0]; w++) {
        gen(dt, h, n, 5, false);
        for (int j = 0; j < 2; j++)
            if (where[w][j] < n) harness_set(dt, h, where[w][j], j ? INFINITY : NAN);
        tbuf b = t_upload(er->kind, dt, h, n, off);
        size_t got = 7, want = 9;
        CHECK_OK(er->k->first_nonfinite(er->k->ctx, er->stream, dt, b.p, n, &got));
        CHECK_OK(g_host->first_nonfinite(g_host->ctx, NULL, dt, h, n, &want));
        CHECK(got == want, "scan %s n %zu case %zu: %zu, host %zu", DT_NAME[dt], n, w, got, want);
        m_free(er->kind, b.base);
    }
    free(h);
}

/* The inputs and outputs of a reduce or weighted-sum check, on the host and on the device (n
 * elements at `off`): inputs generated from `seed` + j (input `special` with the generator's
 * special values), outputs uninitialised; in place, output 0 is input 0 on both sides, as the
 * shared-memory algorithms run. */
typedef struct io_set {
    int nin, nout;
    bool in_place;
    void *hin[40], *hout[4];
    tbuf din[40], dout[4];
    const void *ki[40], *hi[40];
    void *ko[4], *ho[4];
} io_set;

static void io_make(io_set *io, const entry_run *er, sumo_dtype dt, size_t n, size_t off, int nin,
                    int nout, bool in_place, uint64_t seed, int special)
{
    size_t bytes = n * esz(dt);
    *io = (io_set){.nin = nin, .nout = nout, .in_place = in_place};
    for (int j = 0; j < nin; j++) {
        io->hin[j] = malloc(bytes + 1);
        gen(dt, io->hin[j], n, seed + (uint64_t)j, j == special);
        io->din[j] = t_upload(er->kind, dt, io->hin[j], n, off);
    }
    for (int o = 0; o < nout; o++) {
        io->hout[o] = malloc(bytes + 1);
        io->dout[o] = t_alloc(er->kind, dt, n, off);
    }
    if (in_place) {
        memcpy(io->hout[0], io->hin[0], bytes);
        m_free(er->kind, io->dout[0].base);
        io->dout[0] = io->din[0];
    }
    for (int j = 0; j < nin; j++) io->ki[j] = io->din[j].p, io->hi[j] = io->hin[j];
    for (int o = 0; o < nout; o++) io->ko[o] = io->dout[o].p, io->ho[o] = io->hout[o];
    if (in_place) io->hi[0] = io->hout[0];
}

/* Where output o's device bits first differ from the host's (SIZE_MAX: nowhere). */
static size_t io_diff(const io_set *io, const entry_run *er, sumo_dtype dt, size_t n, int o)
{
    void *got = fetch(er->kind, dt, &io->dout[o], n);
    size_t at = first_diff(dt, got, io->hout[o], n);
    free(got);
    return at;
}

static void io_free(io_set *io, const entry_run *er)
{
    for (int j = 0; j < io->nin; j++) {
        free(io->hin[j]);
        m_free(er->kind, io->din[j].base);
    }
    for (int o = 0; o < io->nout; o++) {
        free(io->hout[o]);
        if (!(io->in_place && o == 0)) m_free(er->kind, io->dout[o].base);
    }
}

static void check_reduce(const entry_run *er, sumo_dtype dt, size_t n, size_t off, int nin,
                         int nout, int divisor, bool in_place)
{
    io_set io;
    io_make(&io, er, dt, n, off, nin, nout, in_place, 100, 1);
    CHECK_OK(er->k->reduce(er->k->ctx, er->stream, dt, io.ko, nout, io.ki, nin, n, divisor));
    CHECK_OK(g_host->reduce(g_host->ctx, NULL, dt, io.ho, nout, io.hi, nin, n, divisor));
    for (int o = 0; o < nout; o++) {
        size_t at = io_diff(&io, er, dt, n, o);
        CHECK(at == SIZE_MAX, "reduce %s n %zu off %zu nin %d nout %d div %d in place %d: out %d at %zu",
              DT_NAME[dt], n, off, nin, nout, divisor, in_place, o, at);
    }
    io_free(&io, er);
}

static void check_elementwise(const entry_run *er, sumo_dtype dt, size_t n, size_t off)
{
    size_t bytes = n * esz(dt);
    void *a = malloc(bytes + 1), *b = malloc(bytes + 1), *c = malloc(bytes + 1), *w = malloc(8 * n + 8);
    gen(dt, a, n, 1, true);
    gen(dt, b, n, 2, true);
    /* convert to and from every dtype */
    for (size_t d = 0; d < 4; d++) {
        sumo_dtype to = DTS[d];
        tbuf src = t_upload(er->kind, dt, a, n, off), dst = t_alloc(er->kind, to, n, off);
        CHECK_OK(er->k->convert(er->k->ctx, er->stream, to, dst.p, dt, src.p, n));
        CHECK_OK(g_host->convert(g_host->ctx, NULL, to, w, dt, a, n));
        void *got = fetch(er->kind, to, &dst, n);
        size_t at = first_diff(to, got, w, n);
        free(got);
        m_free(er->kind, src.base);
        m_free(er->kind, dst.base);
        CHECK(at == SIZE_MAX, "convert %s -> %s n %zu off %zu at %zu", DT_NAME[dt], DT_NAME[to], n, off, at);
    }
    /* scaled_add: ordinary coefficients, and ones outside float's range (the wide path) */
    const double co[][2] = {{0.75, -1.25}, {1e-40, 3.0}, {2.5, 1e39}, {-0.5, 0.0}};
    for (size_t q = 0; q < sizeof co / sizeof co[0]; q++) {
        tbuf x = t_upload(er->kind, dt, a, n, off), y = t_upload(er->kind, dt, b, n, off);
        memcpy(c, a, bytes);
        CHECK_OK(er->k->scaled_add(er->k->ctx, er->stream, dt, x.p, co[q][0], y.p, co[q][1], n));
        CHECK_OK(g_host->scaled_add(g_host->ctx, NULL, dt, c, co[q][0], b, co[q][1], n));
        void *got = fetch(er->kind, dt, &x, n);
        size_t at = first_diff(dt, got, c, n);
        free(got);
        m_free(er->kind, x.base);
        m_free(er->kind, y.base);
        CHECK(at == SIZE_MAX, "scaled_add %s (%g, %g) n %zu off %zu at %zu", DT_NAME[dt], co[q][0],
              co[q][1], n, off, at);
    }
    /* delta, and apply_delta with its first non-finite result */
    {
        tbuf x = t_upload(er->kind, dt, a, n, off), y = t_upload(er->kind, dt, b, n, off);
        tbuf z = t_alloc(er->kind, dt, n, off);
        CHECK_OK(er->k->delta(er->k->ctx, er->stream, dt, z.p, x.p, y.p, n));
        CHECK_OK(g_host->delta(g_host->ctx, NULL, dt, c, a, b, n));
        void *got = fetch(er->kind, dt, &z, n);
        size_t at = first_diff(dt, got, c, n);
        free(got);
        CHECK(at == SIZE_MAX, "delta %s n %zu at %zu", DT_NAME[dt], n, at);
        /* finite inputs whose sum overflows the 16-bit formats late in the buffer */
        gen(dt, a, n, 3, false);
        gen(dt, b, n, 4, false);
        if (n > 3) {
            harness_set(dt, a, n - 2, dt == SUMO_FLOAT16 ? 60000.0 : 3e38);
            harness_set(dt, b, n - 2, dt == SUMO_FLOAT16 ? 60000.0 : dt == SUMO_FLOAT64 ? 3e38 : 3e38);
        }
        m_put(er->kind, x.p, a, bytes);
        m_put(er->kind, y.p, b, bytes);
        size_t gf = 1, wf = 2;
        CHECK_OK(er->k->apply_delta(er->k->ctx, er->stream, dt, z.p, x.p, y.p, n, &gf));
        CHECK_OK(g_host->apply_delta(g_host->ctx, NULL, dt, c, a, b, n, &wf));
        got = fetch(er->kind, dt, &z, n);
        at = first_diff(dt, got, c, n);
        free(got);
        CHECK(at == SIZE_MAX && gf == wf, "apply_delta %s n %zu at %zu first %zu / %zu", DT_NAME[dt], n,
              at, gf, wf);
        m_free(er->kind, x.base);
        m_free(er->kind, y.base);
        m_free(er->kind, z.base);
    }
    free(a);
    free(b);
    free(c);
    free(w);
}

/* outer_update (fp32, fp64) against the host table, every branch: Nesterov and heavy ball,
 * from the average or from the change, merge 0 and not, in place (c is x) and not, a momentum
 * that overflows (g NaN). */
static void check_outer(const entry_run *er, sumo_dtype dt, size_t n, size_t off)
{
    if (dt != SUMO_FLOAT32 && dt != SUMO_FLOAT64) return;
    size_t bytes = n * esz(dt);
    void *h[4], *w[4];
    for (int i = 0; i < 4; i++) {
        h[i] = malloc(bytes + 1);
        w[i] = malloc(bytes + 1);
        gen(dt, h[i], n, 20 + (uint64_t)i, false);
    }
    if (n > 5 && dt == SUMO_FLOAT32) harness_set(dt, h[2], 5, 3e38); /* v overflows */
    const sumo_outer_step steps[] = {{1, 0, 0.7, 0.9, 1.0, 0.0}, {1, 1, 0.7, 0.9, 1.0, 0.5},
                                     {0, 1, 0.1 * 1e-3, 0.5, 1e-3, 0.0}, {0, 0, 2.0, 0.0, 0.5, 0.25}};
    for (size_t q = 0; q < sizeof steps / sizeof steps[0]; q++)
        for (int in_place = 0; in_place <= 1; in_place++) {
            tbuf b[4];
            for (int i = 0; i < 4; i++) {
                b[i] = t_upload(er->kind, dt, h[i], n, off);
                memcpy(w[i], h[i], bytes);
            }
            /* x, c, v, x0 */
            const void *kc = in_place ? b[0].p : b[1].p, *hc = in_place ? w[0] : w[1];
            CHECK_OK(er->k->outer_update(er->k->ctx, er->stream, dt, b[0].p, kc, b[2].p, b[3].p, n, &steps[q]));
            CHECK_OK(g_host->outer_update(g_host->ctx, NULL, dt, w[0], hc, w[2], w[3], n, &steps[q]));
            for (int i = 0; i < 4; i++) {
                void *got = fetch(er->kind, dt, &b[i], n);
                size_t at = first_diff(dt, got, w[i], n);
                bool same_bits = memcmp(got, w[i], bytes) == 0 || er->kind == M_DEV;
                free(got);
                CHECK(at == SIZE_MAX && same_bits, "outer_update %s step %zu in place %d buffer %d at %zu",
                      DT_NAME[dt], q, in_place, i, at);
                m_free(er->kind, b[i].base);
            }
        }
    for (int i = 0; i < 4; i++) {
        free(h[i]);
        free(w[i]);
    }
}

/* quantize and dequantize against the host table: the payload byte for byte, the decoded
 * values bit for bit and the first non-finite element, for every format, short last blocks,
 * all-zero blocks, NaN and Inf, and the largest magnitudes. */
static void check_codec(const entry_run *er, size_t n, size_t off)
{
    const sumo_compression_format fmts[] = {SUMO_COMPRESS_BF16, SUMO_COMPRESS_FP8_E4M3,
                                            SUMO_COMPRESS_E3M0};
    const size_t blocks[] = {8, 32, 256, 4096};
    float *x = malloc(n * sizeof *x + 4), *gotf = malloc(n * sizeof *x + 4), *wantf = malloc(n * sizeof *x + 4);
    for (size_t fi = 0; fi < 3; fi++)
        for (size_t bi = 0; bi < 4; bi++)
            for (int special = 0; special <= 1; special++) {
                size_t block = blocks[bi];
                gen(SUMO_FLOAT32, x, n, 30 + fi, false);
                for (size_t i = 0; i < n; i++) x[i] *= (float)ldexp(1.0, (int)((i / block) % 40) * 6 - 120);
                if (special) {
                    for (size_t i = 0; i < n && i < block; i++) x[i] = 0.0f; /* a zero block */
                    /* A block of ties between consecutive codes (the largest value first: scale
                     * 1), where the rounding rule alone decides. */
                    uint32_t count = ref_code_count(fmts[fi]);
                    for (size_t i = block, c = 0; i < n && i < 2 * block; i++, c = (c + 1) % (count - 1))
                        x[i] = i == block ? (float)ref_code_value(fmts[fi], count - 1)
                                          : (float)((ref_code_value(fmts[fi], (uint32_t)c) +
                                                     ref_code_value(fmts[fi], (uint32_t)c + 1)) / 2);
                    if (n > 3) x[n - 2] = -FLT_MAX;
                    if (n > 20) x[n / 2] = NAN;
                    if (n > 40) x[n / 3] = INFINITY;
                }
                sumo_compression c = {.struct_size = sizeof c, .format = fmts[fi], .block_size = block,
                                      .op = SUMO_OP_SUM};
                size_t pb = 0;
                CHECK_OK(sumo_compressed_bytes(&c, n, &pb));
                unsigned char *hp = malloc(pb + 1), *kp = malloc(pb + 1);
                memset(hp, 0xa5, pb);
                tbuf src = t_upload(er->kind, SUMO_FLOAT32, x, n, off), dst = t_alloc(er->kind, SUMO_FLOAT32, n, off);
                unsigned char *payload = m_alloc(er->kind, pb + 16);
                size_t f1 = 1, f2 = 2;
                CHECK_OK(er->k->quantize(er->k->ctx, er->stream, fmts[fi], block, payload, (const float *)(const void *)src.p, n, &f1));
                CHECK_OK(g_host->quantize(g_host->ctx, NULL, fmts[fi], block, hp, x, n, &f2));
                m_get(er->kind, kp, payload, pb);
                CHECK(f1 == f2 && memcmp(hp, kp, pb) == 0, "quantize format %d block %zu n %zu special %d: first %zu / %zu, payload %s",
                      (int)fmts[fi], block, n, special, f1, f2, memcmp(hp, kp, pb) ? "differs" : "same");
                CHECK_OK(er->k->dequantize(er->k->ctx, er->stream, fmts[fi], block, (float *)(void *)dst.p, payload, n));
                CHECK_OK(g_host->dequantize(g_host->ctx, NULL, fmts[fi], block, wantf, hp, n));
                m_get(er->kind, gotf, dst.p, n * sizeof(float));
                size_t at = first_diff(SUMO_FLOAT32, gotf, wantf, n);
                CHECK(at == SIZE_MAX, "dequantize format %d block %zu n %zu at %zu", (int)fmts[fi], block, n, at);
                m_free(er->kind, src.base);
                m_free(er->kind, dst.base);
                m_free(er->kind, payload);
                free(hp);
                free(kp);
            }
    free(x);
    free(gotf);
    free(wantf);
}

static void check_weighted(const entry_run *er, sumo_dtype dt, int nin, int nout, bool in_place,
                           size_t lo_cut, size_t hi_cut, size_t off)
{
    size_t offs[NLAYOUT + 1], total = layout_offsets(offs);
    size_t lo = lo_cut, hi = total - hi_cut, n = hi - lo;
    double w[NLAYOUT * 16];
    uint64_t s = 77 + (uint64_t)nin;
    for (size_t i = 0; i < NLAYOUT * (size_t)nin; i++) w[i] = 2.0 * harness_uniform(&s);
    w[2 * nin + nin - 1] = 1e-40; /* tensor 2: a weight outside float's range (wide path) */
    w[4 * nin] = -3e39;           /* tensor 4: another */
    io_set io;
    io_make(&io, er, dt, n, off, nin, nout, in_place, 300, 0);
    CHECK_OK(er->k->weighted_sum(er->k->ctx, er->stream, dt, io.ko, nout, io.ki, nin, offs, NLAYOUT, lo, hi, w));
    CHECK_OK(g_host->weighted_sum(g_host->ctx, NULL, dt, io.ho, nout, io.hi, nin, offs, NLAYOUT, lo, hi, w));
    for (int o = 0; o < nout; o++) {
        size_t at = io_diff(&io, er, dt, n, o);
        CHECK(at == SIZE_MAX, "weighted_sum %s nin %d nout %d in place %d [%zu, %zu) off %zu: out %d at %zu",
              DT_NAME[dt], nin, nout, in_place, lo, hi, off, o, at);
    }
    io_free(&io, er);
}

void check_exact_entries(int kind)
{
    entry_run er = {.kind = kind, .k = table_of(kind)};
    cudaStream_t s = NULL;
    if (kind == M_DEV) {
        CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess, "stream");
        er.stream = s;
    }
    const size_t sizes_full[] = {1, 7, 1000, 100003}, sizes_quick[] = {1, 7, 1000};
    const size_t *sizes = g_quick ? sizes_quick : sizes_full;
    size_t nsizes = g_quick ? 3 : 4;
    int before = g_failed_checks;
    for (size_t d = 0; d < 4 && g_failed_checks == before; d++)
        for (size_t si = 0; si < nsizes && g_failed_checks == before; si++)
            for (size_t off = 0; off <= 1; off++) {
                size_t n = sizes[si];
                check_fill_scan(&er, DTS[d], n, off);
                check_elementwise(&er, DTS[d], n, off);
                check_outer(&er, DTS[d], n, off);
                if (DTS[d] == SUMO_FLOAT32) check_codec(&er, n, off);
                const int shapes[][3] = {{1, 1, 3}, {2, 1, 1}, {2, 2, 2}, {3, 4, 1}, {5, 1, 5}};
                for (size_t q = 0; q < sizeof shapes / sizeof shapes[0]; q++)
                    for (int ip = 0; ip <= 1; ip++)
                        check_reduce(&er, DTS[d], n, off, shapes[q][0], shapes[q][1], shapes[q][2], ip);
                if (n <= 1000) check_reduce(&er, DTS[d], n, off, 40, 3, 40, false); /* far pointers */
                if (g_failed_checks != before) break;
            }
    for (size_t d = 0; d < 4 && g_failed_checks == before; d++) {
        const int nins[] = {1, 2, 3, 5, 8, 9, 16};
        for (size_t q = 0; q < sizeof nins / sizeof nins[0]; q++) {
            check_weighted(&er, DTS[d], nins[q], 1, false, 0, 0, 0);
            check_weighted(&er, DTS[d], nins[q], nins[q] < 4 ? nins[q] : 3, true, 3, 5, 0);
            /* Four pieces (the most that travel in the launch's arguments), and one. */
            if (!g_quick) check_weighted(&er, DTS[d], nins[q], 2, false, 140, 4000, 1);
            check_weighted(&er, DTS[d], nins[q], 1, true, 700, 5000, 0);
        }
    }
    if (s) cudaStreamDestroy(s);
}
