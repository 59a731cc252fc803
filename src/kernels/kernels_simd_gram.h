/*
 * kernels_simd.h's Gram partials: the pairwise dot products of P inputs (Adasum of more than
 * two vectors), per buffer and per tensor of a layout. Two inputs take dot_norms' loop
 * (kernels_simd_dot.h, included before this part, with the prefetch helpers). A part of the
 * vector kernels' template, included by kernels_simd.h alone.
 */
#ifndef SUMO__SIMD_NAME
#error "kernels_simd_gram.h is a part of kernels_simd.h, included by it"
#endif

/* ---- Gram partials ------------------------------------------------------------------------- */

/*
 * Two inputs are dot_norms' case and take its loop. More: per block of B elements, each input
 * is read once from memory and widened to double into an L1 buffer (zero-padded to whole
 * vectors, and to 4 rows, so padding adds exact zeros); the pairs are then accumulated from
 * the buffer in register tiles of GRAM_ROWS x 4 entries, each a vector of per-lane partial
 * sums (the lower triangle of a diagonal tile is computed and dropped: simpler than masking,
 * and the loads it shares are the expensive part). The order depends on n and nin only.
 */
#define GRAM_COLS 4
/* 8 KiB of widened inputs per block. Measured with gram_bw 64 (AVX-512, one thread, share of
 * the read bandwidth at P = 4 / 8): 16 KiB 89% / 73-75%, 12 KiB 94% / 80%, 8 KiB 96-98% /
 * 83-85%, 4 KiB 87% / 75% (a block ahead is then too short a prefetch distance). The order of
 * the sums does not depend on it: lane i % WD takes element i whatever the block. */
#define GRAM_BUF_DOUBLES 1024

/* Each input is read in blocks, and no input is read while the tiles of a block are computed:
 * prefetching one whole block ahead keeps memory busy through that phase too. */
SIMD_INLINE void gram_widen(sumo_dtype dt, const void *p, size_t base, size_t m, size_t mpad,
                            size_t block, double *dst)
{
    size_t i = 0;
    if (dt == SUMO_FLOAT64) {
        const double *s = (const double *)p + base;
        for (; i + WD <= m; i += WD) {
            prefetch_at(s, i * sizeof(double), WD * sizeof(double), block * sizeof(double));
            vd_storeu(dst + i, vd_loadu(s + i));
        }
        for (; i < m; i++) dst[i] = s[i];
    } else {
        const size_t esz = sumo__dtype_bytes(dt);
        for (; i + WF <= m; i += WF) {
            prefetch_at(p, (base + i) * esz, WF * esz, block * esz);
            vf v = ld(dt, p, base + i);
            vd_storeu(dst + i, vd_from_lo(v));
            vd_storeu(dst + i + WD, vd_from_hi(v));
        }
        for (; i < m; i++) dst[i] = (double)lds(dt, p, base + i);
    }
    for (; i < mpad; i++) dst[i] = 0.0;
}

/* diag: a tile on the diagonal (i0 == j0, GRAM_ROWS == GRAM_COLS), whose entries below it are
 * dropped: a constant at each call, so the compiler leaves out their FMAs (4 x 4: 10 of 16)
 * and the loads the two sides share. The entries kept get the same FMAs in the same order. */
SIMD_INLINE void gram_tile(const double *buf, size_t ld_, int i0, int j0, size_t mpad, vd *acc,
                           int pp, const bool diag)
{
    /* Unrolled by pragma: -O2 keeps loops over small arrays rolled, and the tile's accumulators
     * then live on the stack, one store per FMA, at a third of the read bandwidth. */
    vd a[GRAM_ROWS][GRAM_COLS];
#pragma GCC unroll 4
    for (int r = 0; r < GRAM_ROWS; r++)
#pragma GCC unroll 4
        for (int c = 0; c < GRAM_COLS; c++) a[r][c] = acc[(i0 + r) * pp + j0 + c];
    const double *xr[GRAM_ROWS], *yc[GRAM_COLS];
#pragma GCC unroll 4
    for (int r = 0; r < GRAM_ROWS; r++) xr[r] = buf + (size_t)(i0 + r) * ld_;
#pragma GCC unroll 4
    for (int c = 0; c < GRAM_COLS; c++) yc[c] = buf + (size_t)(j0 + c) * ld_;
    for (size_t e = 0; e < mpad; e += WD) {
        vd x[GRAM_ROWS], y[GRAM_COLS];
#pragma GCC unroll 4
        for (int r = 0; r < GRAM_ROWS; r++) x[r] = vd_loadu(xr[r] + e);
#pragma GCC unroll 4
        for (int c = 0; c < GRAM_COLS; c++) y[c] = diag ? x[c] : vd_loadu(yc[c] + e);
#pragma GCC unroll 4
        for (int r = 0; r < GRAM_ROWS; r++)
#pragma GCC unroll 4
            for (int c = 0; c < GRAM_COLS; c++)
                if (!diag || c >= r) a[r][c] = vd_fmadd(x[r], y[c], a[r][c]);
    }
#pragma GCC unroll 4
    for (int r = 0; r < GRAM_ROWS; r++)
#pragma GCC unroll 4
        for (int c = 0; c < GRAM_COLS; c++) acc[(i0 + r) * pp + j0 + c] = a[r][c];
}

SIMD_INLINE void gram_f(sumo_dtype dt, const void *const *ins, int nin, size_t n, double *out)
{
    if (nin == 2) {
        double t[3];
        if (dt == SUMO_FLOAT64) dot_d(ins[0], ins[1], n, t);
        else dot_f(dt, ins[0], ins[1], n, t);
        out[0] = t[1];
        out[1] = t[0];
        out[2] = t[2];
        return;
    }
    const int pp = (nin + 3) / 4 * 4;
    /* Elements per input and block: a multiple of WF that fills the buffer. */
    const size_t B = GRAM_BUF_DOUBLES / (size_t)pp / WF * WF;
    _Alignas(64) double buf[GRAM_BUF_DOUBLES];
    vd acc[SUMO__GRAM_MAX_IN * SUMO__GRAM_MAX_IN];
    for (int k = 0; k < pp * pp; k++) acc[k] = vd_zero();
    for (size_t k = (size_t)nin * B; k < (size_t)pp * B; k++) buf[k] = 0.0; /* never written */
    for (size_t base = 0; base < n; base += B) {
        const size_t m = SUMO__MIN(B, n - base), mpad = (m + WD - 1) / WD * WD;
        for (int p = 0; p < nin; p++) gram_widen(dt, ins[p], base, m, mpad, B, buf + (size_t)p * B);
        for (int i0 = 0; i0 < pp; i0 += GRAM_ROWS)
            for (int j0 = i0 / GRAM_COLS * GRAM_COLS; j0 < pp; j0 += GRAM_COLS) {
                if (GRAM_ROWS == GRAM_COLS && i0 == j0) gram_tile(buf, B, i0, j0, mpad, acc, pp, true);
                else gram_tile(buf, B, i0, j0, mpad, acc, pp, false);
            }
    }
    int e = 0;
    for (int i = 0; i < nin; i++)
        for (int j = i; j < nin; j++) out[e++] = vd_hsum(acc[i * pp + j]);
}

/*
 * gram_f for 3 or 4 inputs (NIN, a constant) of at most one block: the same FMAs into the
 * same lanes in the same order (lane l of entry (i,j) takes elements l, l + WD, .. from the
 * first, the last vector zero-padded, then vd_hsum), straight from the inputs. The block's
 * buffer, its stores and reloads, and a 4 x 4 tile's 16 accumulators (10 used) cost more
 * than the arithmetic on the few elements of a small tensor's piece; all 10 accumulators and
 * 4 operands stay in registers.
 */
SIMD_INLINE void gram_direct(sumo_dtype dt, const void *const *ins, const int NIN, size_t n,
                             double *out)
{
    /* Named, not an array: an array of accumulators indexed in loops stays on the stack. */
    const vd z = vd_zero();
    vd a00 = z, a01 = z, a02 = z, a03 = z, a11 = z, a12 = z, a13 = z, a22 = z, a23 = z, a33 = z;
    const void *p0 = ins[0], *p1 = ins[1], *p2 = ins[2], *p3 = NIN == 4 ? ins[3] : ins[2];
    size_t i = 0;
#define GRAM_DIRECT_STEP(x0, x1, x2, x3)                                                           \
    do {                                                                                           \
        a00 = vd_fmadd(x0, x0, a00);                                                               \
        a01 = vd_fmadd(x0, x1, a01);                                                               \
        a02 = vd_fmadd(x0, x2, a02);                                                               \
        a11 = vd_fmadd(x1, x1, a11);                                                               \
        a12 = vd_fmadd(x1, x2, a12);                                                               \
        a22 = vd_fmadd(x2, x2, a22);                                                               \
        if (NIN == 4) {                                                                            \
            a03 = vd_fmadd(x0, x3, a03);                                                           \
            a13 = vd_fmadd(x1, x3, a13);                                                           \
            a23 = vd_fmadd(x2, x3, a23);                                                           \
            a33 = vd_fmadd(x3, x3, a33);                                                           \
        }                                                                                          \
    } while (0)
    if (dt == SUMO_FLOAT64) {
        const double *d0 = p0, *d1 = p1, *d2 = p2, *d3 = p3;
        for (; i + WD <= n; i += WD)
            GRAM_DIRECT_STEP(vd_loadu(d0 + i), vd_loadu(d1 + i), vd_loadu(d2 + i), vd_loadu(d3 + i));
    } else {
        for (; i + WF <= n; i += WF) {
            const vf v0 = ld(dt, p0, i), v1 = ld(dt, p1, i), v2 = ld(dt, p2, i), v3 = ld(dt, p3, i);
            GRAM_DIRECT_STEP(vd_from_lo(v0), vd_from_lo(v1), vd_from_lo(v2), vd_from_lo(v3));
            GRAM_DIRECT_STEP(vd_from_hi(v0), vd_from_hi(v1), vd_from_hi(v2), vd_from_hi(v3));
        }
    }
    if (i < n && dt == SUMO_FLOAT32) {
        /* The tail, widened and zero-padded as below, in registers: scalar stores reloaded as
         * a vector cannot be forwarded, and stalled every small piece (at P = 4 the most
         * expensive part of a 20-element piece). */
        const size_t m = n - i;
        const vf v0 = vf_loadu_head((const float *)p0 + i, m), v1 = vf_loadu_head((const float *)p1 + i, m);
        const vf v2 = vf_loadu_head((const float *)p2 + i, m), v3 = vf_loadu_head((const float *)p3 + i, m);
        GRAM_DIRECT_STEP(vd_from_lo(v0), vd_from_lo(v1), vd_from_lo(v2), vd_from_lo(v3));
        if (m > WD) GRAM_DIRECT_STEP(vd_from_hi(v0), vd_from_hi(v1), vd_from_hi(v2), vd_from_hi(v3));
    } else if (i < n) {
        /* The tail, widened as gram_widen widens it and zero-padded to whole vectors. */
        _Alignas(64) double tail[4][WF];
        const void *ip[4] = {p0, p1, p2, p3};
        const size_t m = n - i, mpad = (m + WD - 1) / WD * WD;
        for (int p = 0; p < NIN; p++) {
            size_t k = 0;
            if (dt == SUMO_FLOAT64)
                for (; k < m; k++) tail[p][k] = ((const double *)ip[p])[i + k];
            else
                for (; k < m; k++) tail[p][k] = (double)lds(dt, ip[p], i + k);
            for (; k < mpad; k++) tail[p][k] = 0.0;
        }
        for (size_t k = 0; k < mpad; k += WD)
            GRAM_DIRECT_STEP(vd_loadu(&tail[0][k]), vd_loadu(&tail[1][k]), vd_loadu(&tail[2][k]),
                             vd_loadu(&tail[NIN - 1][k]));
    }
#undef GRAM_DIRECT_STEP
    if (NIN == 4) {
        const vd acc[10] = {a00, a01, a02, a03, a11, a12, a13, a22, a23, a33};
        for (int e = 0; e < 10; e++) out[e] = vd_hsum(acc[e]);
    } else {
        const vd acc[6] = {a00, a01, a02, a11, a12, a22};
        for (int e = 0; e < 6; e++) out[e] = vd_hsum(acc[e]);
    }
}

/* One tensor piece's partials: gram_f's, by the direct loop where it gives the same bits for
 * less (3 or 4 inputs, one block). */
SIMD_INLINE void gram_piece(sumo_dtype dt, const void *const *ins, int nin, size_t n, double *out)
{
    const size_t B = GRAM_BUF_DOUBLES / 4 / WF * WF; /* gram_f's block for 3 or 4 inputs */
    if (nin == 4 && n <= B) gram_direct(dt, ins, 4, n, out);
    else if (nin == 3 && n <= B) gram_direct(dt, ins, 3, n, out);
    else gram_f(dt, ins, nin, n, out);
}

/* Two inputs (P = 2, the commonest): dot_f's three sums added straight into the tensor's
 * entries. Through gram_piece they went out to a stack array and a loop of unknown length
 * read them back, a store-to-load round trip that was the largest cost of a 16-element piece.
 * The same additions in the same order, so the same bits. A loop of its own: the same branch
 * inside gram_layout's (with its loop over nin pointers) made 50 pieces 764 -> 851-864 ns. */
SIMD_INLINE void gram_layout2(sumo_dtype dt, const void *const *ins, const size_t *offsets,
                              size_t ntensors, size_t lo, size_t hi, double *gram)
{
    const size_t esz = sumo__dtype_bytes(dt);
    const unsigned char *a = ins[0], *b = ins[1];
    for (size_t t = sumo__first_tensor(offsets, ntensors, lo); t < ntensors && offsets[t] < hi;
         t++) {
        size_t s = SUMO__MAX(lo, offsets[t]), e = SUMO__MIN(hi, offsets[t + 1]);
        if (e <= s) continue;
        double d[3];
        if (dt == SUMO_FLOAT64) dot_d((const double *)(const void *)(a + (s - lo) * esz),
                                      (const double *)(const void *)(b + (s - lo) * esz), e - s, d);
        else dot_f(dt, a + (s - lo) * esz, b + (s - lo) * esz, e - s, d);
        gram[t * 3 + 0] += d[1];
        gram[t * 3 + 1] += d[0];
        gram[t * 3 + 2] += d[2];
    }
}

/* sumo__kernel_gram_partials_layout's loop, with the body inlined: a bucket of many small
 * tensors makes one piece per tensor, and a call and a dispatch per piece cost as much as
 * the piece's arithmetic. */
SIMD_INLINE void gram_layout(sumo_dtype dt, const void *const *ins, int nin, const size_t *offsets,
                             size_t ntensors, size_t lo, size_t hi, double *gram)
{
    if (nin == 2) {
        gram_layout2(dt, ins, offsets, ntensors, lo, hi, gram);
        return;
    }
    const size_t esz = sumo__dtype_bytes(dt), L = (size_t)nin * (size_t)(nin + 1) / 2;
    const void *in_at[SUMO__GRAM_MAX_IN];
    double piece[SUMO__GRAM_MAX_IN * (SUMO__GRAM_MAX_IN + 1) / 2];
    for (size_t t = sumo__first_tensor(offsets, ntensors, lo); t < ntensors && offsets[t] < hi;
         t++) {
        size_t s = SUMO__MAX(lo, offsets[t]), e = SUMO__MIN(hi, offsets[t + 1]);
        if (e <= s) continue;
        for (int k = 0; k < nin; k++) in_at[k] = (const unsigned char *)ins[k] + (s - lo) * esz;
        gram_piece(dt, in_at, nin, e - s, piece);
        for (size_t q = 0; q < L; q++) gram[t * L + q] += piece[q];
    }
}

SUMO__SIMD_TARGET void SUMO__SIMD_NAME(sumo__gram_partials_layout)(
    sumo_dtype dtype, const void *const *ins, int nin, const size_t *offsets, size_t ntensors,
    size_t lo, size_t hi, double *gram)
{
    switch (dtype) {
    case SUMO_FLOAT32: gram_layout(SUMO_FLOAT32, ins, nin, offsets, ntensors, lo, hi, gram); break;
    case SUMO_FLOAT16: gram_layout(SUMO_FLOAT16, ins, nin, offsets, ntensors, lo, hi, gram); break;
    case SUMO_BFLOAT16: gram_layout(SUMO_BFLOAT16, ins, nin, offsets, ntensors, lo, hi, gram); break;
    case SUMO_FLOAT64: gram_layout(SUMO_FLOAT64, ins, nin, offsets, ntensors, lo, hi, gram); break;
    default: break;
    }
}

SUMO__SIMD_TARGET void SUMO__SIMD_NAME(sumo__gram_partials)(sumo_dtype dtype,
                                                           const void *const *ins, int nin,
                                                           size_t n, double *out)
{
    switch (dtype) {
    case SUMO_FLOAT32: gram_f(SUMO_FLOAT32, ins, nin, n, out); break;
    case SUMO_FLOAT16: gram_f(SUMO_FLOAT16, ins, nin, n, out); break;
    case SUMO_BFLOAT16: gram_f(SUMO_BFLOAT16, ins, nin, n, out); break;
    case SUMO_FLOAT64: gram_f(SUMO_FLOAT64, ins, nin, n, out); break;
    default: break;
    }
}

#undef GRAM_COLS
#undef GRAM_BUF_DOUBLES
