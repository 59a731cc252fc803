#include "support/reference.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- 16-bit formats ---------------------------------------------------------------------- */

/* The value of a 16-bit pattern with ebits exponent bits and mbits fraction bits. */
static double value16(uint16_t h, int ebits, int mbits)
{
    int bias = (1 << (ebits - 1)) - 1;
    int e = (h >> mbits) & ((1 << ebits) - 1), m = h & ((1 << mbits) - 1);
    double v;
    if (e == (1 << ebits) - 1) v = m ? NAN : INFINITY;
    else if (e == 0) v = ldexp(m, 1 - bias - mbits);
    else v = ldexp(m + (1 << mbits), e - bias - mbits);
    return (h & 0x8000) ? -v : v;
}

double ref_half_value(uint16_t h) { return value16(h, 5, 10); }
double ref_bf16_value(uint16_t h) { return value16(h, 8, 7); }

double ref_round_to(sumo_dtype dtype, double x)
{
    switch (dtype) {
    case SUMO_FLOAT16: return ref_half_value(ref_round_half(x));
    case SUMO_BFLOAT16: return ref_bf16_value(ref_round_bf16(x));
    case SUMO_FLOAT32: return (double)(float)x;
    default: return x;
    }
}

/* x (not NaN) rounded once to nearest even in that format, as bits. */
static uint16_t round16(double x, int ebits, int mbits)
{
    int bias = (1 << (ebits - 1)) - 1, emin = 1 - bias, emax = bias;
    uint16_t sign = signbit(x) ? 0x8000 : 0;
    uint16_t inf = (uint16_t)(sign | (((1 << ebits) - 1) << mbits));
    double ax = fabs(x);
    if (isinf(ax)) return inf;
    if (ax == 0) return sign;
    int E;
    (void)frexp(ax, &E);
    int e = E - 1 < emin ? emin : E - 1;       /* ax in [2^e, 2^(e+1)) unless subnormal */
    double r = nearbyint(ldexp(ax, mbits - e)); /* significand in units of the last place */
    if (r >= ldexp(1, mbits + 1)) {
        r /= 2;
        e++;
    }
    if (e > emax) return inf;
    if (r < ldexp(1, mbits)) return (uint16_t)(sign | (uint16_t)r);
    return (uint16_t)(sign | ((e + bias) << mbits) | (uint16_t)(r - ldexp(1, mbits)));
}

uint16_t ref_round_half(double x) { return isnan(x) ? 0x7e00 : round16(x, 5, 10); }
uint16_t ref_round_bf16(double x) { return isnan(x) ? 0x7fc0 : round16(x, 8, 7); }

static int is_nan16(uint16_t h, int ebits, int mbits)
{
    int e = (h >> mbits) & ((1 << ebits) - 1);
    return e == (1 << ebits) - 1 && (h & ((1 << mbits) - 1)) != 0;
}

int ref_is_nan_half(uint16_t h) { return is_nan16(h, 5, 10); }
int ref_is_nan_bf16(uint16_t h) { return is_nan16(h, 8, 7); }

/* ---- sums -------------------------------------------------------------------------------- */

double ref_sum_in_order(sumo_dtype dtype, const double *values, int n, int divisor)
{
    if (dtype == SUMO_FLOAT64) {
        double acc = values[0];
        for (int j = 1; j < n; j++) acc = acc + values[j];
        if (divisor != 1) acc = acc / (double)divisor;
        return acc;
    }
    float acc = (float)values[0];
    for (int j = 1; j < n; j++) acc = acc + (float)values[j];
    if (divisor != 1) acc = acc / (float)divisor;
    return acc;
}

/* ---- Adasum ------------------------------------------------------------------------------ */

void ref_adasum_pair(double *a, const double *b, size_t n)
{
    double d = 0, na = 0, nb = 0;
    for (size_t i = 0; i < n; i++) {
        d += a[i] * b[i];
        na += a[i] * a[i];
        nb += b[i] * b[i];
    }
    const double tiny = sqrt(DBL_MIN);
    double ca = na < tiny ? 1.0 : 1.0 - d / (2.0 * na);
    double cb = nb < tiny ? 1.0 : 1.0 - d / (2.0 * nb);
    for (size_t i = 0; i < n; i++) a[i] = ca * a[i] + cb * b[i];
}

void ref_adasum_tree(double **u, int G, const size_t *off, size_t T)
{
    int g2 = 1;
    while (g2 * 2 <= G) g2 *= 2;
    int rem = G - g2;
    double **w = malloc((size_t)g2 * sizeof *w);
    if (w == NULL) abort();
    for (int i = 0; i < g2; i++) {
        if (i < rem) {
            for (size_t t = 0; t < T; t++)
                ref_adasum_pair(u[2 * i] + off[t], u[2 * i + 1] + off[t], off[t + 1] - off[t]);
            w[i] = u[2 * i];
        } else {
            w[i] = u[i + rem];
        }
    }
    for (int step = 1; step < g2; step *= 2)
        for (int i = 0; i + step < g2; i += 2 * step)
            for (size_t t = 0; t < T; t++)
                ref_adasum_pair(w[i] + off[t], w[i + step] + off[t], off[t + 1] - off[t]);
    if (w[0] != u[0]) memcpy(u[0], w[0], off[T] * sizeof(double));
    free(w);
}

/* ---- ACGA -------------------------------------------------------------------------------- */

int ref_acga_init(ref_acga *F, int nranks, const sumo_aggregator_options *o, size_t count)
{
    memset(F, 0, sizeof *F);
    const sumo_acga_options *a = &o->acga;
    F->N = nranks;
    F->beta = a->beta;
    F->eps = a->eps;
    F->refperm = a->reference_permutation;
    F->guard = a->negative_guard;
    F->rescale = a->rescale;
    F->K = a->per_tensor && o->ntensors > 0 ? o->ntensors : 1;
    F->off = calloc(F->K + 1, sizeof *F->off);
    F->m = calloc((size_t)nranks * F->K, sizeof *F->m);
    if (F->off == NULL || F->m == NULL) {
        ref_acga_free(F);
        return -1;
    }
    if (a->per_tensor && o->ntensors > 0)
        for (size_t k = 0; k < F->K; k++) F->off[k + 1] = F->off[k] + o->tensor_counts[k];
    else
        F->off[1] = count;
    return 0;
}

void ref_acga_free(ref_acga *F)
{
    free(F->off);
    free(F->m);
    F->off = NULL;
    F->m = NULL;
}

/*
 * The step, per group: s = the sum of the ranks' inputs; a_r = (g_r . s) / (|g_r| + eps) / N;
 * the stable sort of a (ties by rank, as a count of smaller keys); the EMA of the sorted values;
 * mapped back by rank (or, with reference_permutation, the sample code's m[idx]); the negative
 * guard shifts by the minimum; weights w = a' / sum(a'), or uniform when sum(a') <= 1e-6
 * sum|a'|; G = sum_r w_r g_r / (|g_r| + eps); the rescale gives G the norm of s / N.
 */
int ref_acga_step(ref_acga *F, float *const *in, double *G, double *bound)
{
    const int N = F->N;
    const size_t n = F->off[F->K];
    double *s = calloc(n + 1, sizeof *s), *mnew = calloc((size_t)N * F->K, sizeof *mnew);
    double *a = calloc((size_t)N, sizeof *a), *den = calloc((size_t)N, sizeof *den),
           *mm = calloc((size_t)N, sizeof *mm), *ap = calloc((size_t)N, sizeof *ap),
           *w = calloc((size_t)N, sizeof *w);
    int *idx = calloc((size_t)N, sizeof *idx);
    if (!s || !mnew || !a || !den || !mm || !ap || !w || !idx) abort();
    for (int r = 0; r < N; r++)
        for (size_t i = 0; i < n; i++) s[i] += in[r][i];
    int any_bad = 0;
    for (size_t k = 0; k < F->K; k++) {
        size_t lo = F->off[k], hi = F->off[k + 1];
        int bad = 0;
        double ss = 0;
        for (size_t i = lo; i < hi; i++) ss += s[i] * s[i];
        for (int r = 0; r < N; r++) {
            double dot = 0, nn = 0;
            for (size_t i = lo; i < hi; i++) {
                dot += in[r][i] * s[i];
                nn += (double)in[r][i] * in[r][i];
            }
            den[r] = sqrt(nn) + F->eps;
            a[r] = den[r] == 0 ? 0.0 : dot / den[r] / N;
            if (!isfinite(a[r])) bad = 1;
        }
        if (bad) {
            any_bad = 1;
            for (size_t i = lo; i < hi; i++) G[i] = NAN, bound[i] = 0;
            continue;
        }
        for (int r = 0; r < N; r++) {
            int pos = 0;
            for (int j = 0; j < N; j++) pos += a[j] < a[r] || (a[j] == a[r] && j < r);
            idx[pos] = r;
        }
        for (int p = 0; p < N; p++) {
            double v = a[idx[p]];
            mm[p] = F->init ? F->beta * F->m[k * N + p] + (1 - F->beta) * v : v;
            mnew[k * N + p] = mm[p];
        }
        for (int p = 0; p < N; p++) {
            if (F->refperm) ap[p] = mm[idx[p]];
            else ap[idx[p]] = mm[p];
        }
        double mn = ap[0];
        for (int r = 1; r < N; r++) mn = ap[r] < mn ? ap[r] : mn;
        if (F->guard && mn < 0)
            for (int r = 0; r < N; r++) ap[r] -= mn;
        double sum = 0, l1 = 0;
        for (int r = 0; r < N; r++) sum += ap[r], l1 += fabs(ap[r]);
        int uniform = !(sum > 1e-6 * l1);
        for (int r = 0; r < N; r++) w[r] = uniform ? 1.0 / N : ap[r] / sum;
        double gg = 0;
        for (size_t i = lo; i < hi; i++) {
            G[i] = bound[i] = 0;
            for (int r = 0; r < N; r++) {
                double c = den[r] == 0 ? 0.0 : w[r] / den[r];
                G[i] += c * in[r][i];
                bound[i] += fabs(c * in[r][i]);
            }
            gg += G[i] * G[i];
        }
        if (F->rescale && gg > 0) {
            double f = sqrt(ss) / N / sqrt(gg);
            for (size_t i = lo; i < hi; i++) G[i] *= f, bound[i] *= f;
        }
    }
    if (!any_bad) {
        memcpy(F->m, mnew, (size_t)N * F->K * sizeof *mnew);
        F->init = 1;
    }
    free(s);
    free(mnew);
    free(a);
    free(den);
    free(mm);
    free(ap);
    free(w);
    free(idx);
    return any_bad;
}

/* ---- the compressed allreduce's formats -------------------------------------------------- */

uint32_t ref_code_count(sumo_compression_format f)
{
    switch (f) {
    case SUMO_COMPRESS_E3M0: return 8;          /* 0..7: 0, then fields 1..7 */
    case SUMO_COMPRESS_FP8_E4M3: return 0x7f;   /* 0x7f is NaN in E4M3FN */
    case SUMO_COMPRESS_BF16: return 0x7f80;     /* 0x7f80 is +Inf */
    default: return 0;
    }
}

int ref_code_bits(sumo_compression_format f)
{
    return f == SUMO_COMPRESS_E3M0 ? 4 : f == SUMO_COMPRESS_FP8_E4M3 ? 8 : 16;
}

double ref_code_value(sumo_compression_format f, uint32_t c)
{
    switch (f) {
    case SUMO_COMPRESS_E3M0: return c == 0 ? 0.0 : ldexp(1.0, (int)c - 3); /* bias 3 */
    case SUMO_COMPRESS_FP8_E4M3: {                                        /* bias 7 */
        int e = (int)(c >> 3), m = (int)(c & 7);
        return e == 0 ? ldexp(m, -9) : ldexp(8 + m, e - 7 - 3);
    }
    default: {                                                            /* bias 127 */
        int e = (int)(c >> 7), m = (int)(c & 127);
        return e == 0 ? ldexp(m, -126 - 7) : ldexp(128 + m, e - 127 - 7);
    }
    }
}

int ref_scale_exponent(sumo_compression_format f, double amax)
{
    if (f == SUMO_COMPRESS_BF16) return 0;
    double largest = ref_code_value(f, ref_code_count(f) - 1);
    int s = -149;
    while (s < 127 && amax > ldexp(largest, s)) s++;
    return s;
}

uint32_t ref_encode(sumo_compression_format f, float x, int s)
{
    uint32_t sign = signbit(x) ? 1u << (ref_code_bits(f) - 1) : 0, count = ref_code_count(f);
    double y = ldexp(fabs((double)x), -s);
    /* The largest code not above y, by bisection over the increasing values. */
    uint32_t lo = 0, hi = count - 1;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo + 1) / 2;
        if (ref_code_value(f, mid) <= y) lo = mid;
        else hi = mid - 1;
    }
    uint32_t c = lo;
    if (c + 1 < count) {
        double below = y - ref_code_value(f, c), above = ref_code_value(f, c + 1) - y;
        if (above < below || (above == below && (c & 1))) c++;
    }
    while (c > 0 && ldexp(ref_code_value(f, c), s) > FLT_MAX) c--;
    return sign | c;
}

float ref_decode(sumo_compression_format f, uint32_t code, int s)
{
    int bits = ref_code_bits(f);
    float v = (float)ldexp(ref_code_value(f, code & ((1u << (bits - 1)) - 1)), s);
    return (code >> (bits - 1)) & 1 ? -v : v;
}

size_t ref_roundtrip(sumo_compression_format f, size_t block, const float *in, float *out,
                     size_t n)
{
    size_t first = SIZE_MAX;
    for (size_t lo = 0; lo < n; lo += block) {
        size_t hi = lo + block < n ? lo + block : n;
        double amax = 0;
        int bad = 0;
        for (size_t i = lo; i < hi; i++) {
            if (!isfinite(in[i])) {
                bad = 1;
                if (first == SIZE_MAX) first = i;
            } else if (fabs((double)in[i]) > amax) {
                amax = fabs((double)in[i]);
            }
        }
        int s = amax > 0 ? ref_scale_exponent(f, amax) : 0;
        for (size_t i = lo; i < hi; i++) {
            if (bad) out[i] = NAN;
            else if (amax == 0 && f != SUMO_COMPRESS_BF16) out[i] = 0.0f; /* a zero scale: +0 */
            else out[i] = ref_decode(f, ref_encode(f, in[i], s), s);
        }
    }
    return first;
}
