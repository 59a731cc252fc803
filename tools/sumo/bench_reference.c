/*
 * Written against sumo's public header only, and independently of the library's own code:
 * a reference that reused the library's conversions or tree would agree with its bugs. The
 * dtype roundings below are arithmetic (scale to the dtype's quantum, round to nearest even),
 * not the bit manipulation the kernels use.
 */
#include "bench_reference.h"

#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- the narrow dtypes -------------------------------------------------------------------- */

/* v rounded to a binary format with `digits` significant bits whose normal exponents start at
 * min_exp, ties to even (nearbyint in the default rounding mode); overflow gives Inf. */
static double round_to_format(double v, int digits, int min_exp, double overflow)
{
    if (!isfinite(v)) return v;
    if (fabs(v) >= overflow) return copysign(INFINITY, v);
    int e = v == 0 ? min_exp : ilogb(v);
    if (e < min_exp) e = min_exp; /* subnormals share the smallest normal's quantum */
    double quantum = ldexp(1.0, e - (digits - 1));
    return nearbyint(v / quantum) * quantum;
}

/* fp16: 11 significant bits, normals from 2^-14; 65520 and above (ties up) overflow. */
static double round_half(double v) { return round_to_format(v, 11, -14, 65520.0); }
/* bf16: fp32's exponent range with 8 significant bits. */
static double round_bf16(double v) { return round_to_format(v, 8, -126, 0x1.ffp127); }

static uint16_t half_bits(double rounded)
{
    uint16_t sign = signbit(rounded) ? 0x8000u : 0;
    double a = fabs(rounded);
    if (isnan(a)) return 0x7e00u;
    if (isinf(a)) return (uint16_t)(sign | 0x7c00u);
    if (a < 0x1p-14) return (uint16_t)(sign | (uint16_t)(a * 0x1p24));
    int e = ilogb(a);
    return (uint16_t)(sign | (uint16_t)((e + 15) << 10) | (uint16_t)(ldexp(a, 10 - e) - 1024));
}

static double half_value(uint16_t h)
{
    int e = (h >> 10) & 0x1f;
    double m = h & 0x3ffu, sign = h & 0x8000u ? -1.0 : 1.0;
    if (e == 0x1f) return m != 0 ? NAN : sign * INFINITY;
    if (e == 0) return sign * m * 0x1p-24;
    return sign * ldexp(1024 + m, e - 25);
}

/* A bf16 value is an fp32 value whose low 16 bits are zero. */
static uint16_t bf16_bits(double rounded)
{
    float f = (float)rounded;
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return (uint16_t)(u >> 16);
}

static double bf16_value(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Rounds v to the dtype (through fp32 for the narrow types, as the kernels do). */
static double round_to(sumo_dtype dtype, double v)
{
    switch (dtype) {
    case SUMO_FLOAT32: return (float)v;
    case SUMO_FLOAT16: return round_half((float)v);
    case SUMO_BFLOAT16: return round_bf16((float)v);
    default: return v;
    }
}

static void store(sumo_dtype dtype, void *buf, size_t i, double v)
{
    switch (dtype) {
    case SUMO_FLOAT32: ((float *)buf)[i] = (float)v; break;
    case SUMO_FLOAT64: ((double *)buf)[i] = v; break;
    case SUMO_FLOAT16: ((uint16_t *)buf)[i] = half_bits(round_to(dtype, v)); break;
    case SUMO_BFLOAT16: ((uint16_t *)buf)[i] = bf16_bits(round_to(dtype, v)); break;
    default: break;
    }
}

static double load(sumo_dtype dtype, const void *buf, size_t i)
{
    switch (dtype) {
    case SUMO_FLOAT32: return ((const float *)buf)[i];
    case SUMO_FLOAT64: return ((const double *)buf)[i];
    case SUMO_FLOAT16: return half_value(((const uint16_t *)buf)[i]);
    case SUMO_BFLOAT16: return bf16_value(((const uint16_t *)buf)[i]);
    default: return NAN;
    }
}

/* ---- inputs ------------------------------------------------------------------------------- */

/* splitmix64's output for state x: a stateless hash of the element's coordinates. */
static uint64_t mix64(uint64_t x)
{
    uint64_t z = x + 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Rank r's element i, uniform in [-1, 1) before rounding to the dtype. */
static double gen_value(int rank, size_t i)
{
    uint64_t h = mix64(((uint64_t)(unsigned)rank << 48) ^ (uint64_t)i);
    return (double)(h >> 11) * 0x1p-52 - 1.0;
}

/* The value rank r holds at i, exactly as stored in the dtype. */
static double stored_value(sumo_dtype dtype, int rank, size_t i)
{
    return round_to(dtype, gen_value(rank, i));
}

void bench_fill(sumo_dtype dtype, void *buf, size_t lo, size_t hi, int rank)
{
    for (size_t i = lo; i < hi; i++) store(dtype, buf, i, gen_value(rank, i));
}

/* ---- verdicts ----------------------------------------------------------------------------- */

const char *bench_verdict_name(int verdict)
{
    switch (verdict) {
    case BENCH_CHECK_EXACT: return "exact";
    case BENCH_CHECK_OK: return "ok";
    case BENCH_CHECK_NA: return "n/a";
    case BENCH_CHECK_FAIL: return "FAIL";
    default: return "-";
    }
}

/* Machine epsilon of the dtype and of the type it accumulates in. */
static double eps_of(sumo_dtype dtype)
{
    switch (dtype) {
    case SUMO_FLOAT64: return DBL_EPSILON;
    case SUMO_FLOAT16: return 0x1p-10;
    case SUMO_BFLOAT16: return 0x1p-7;
    default: return FLT_EPSILON;
    }
}

static double acc_eps_of(sumo_dtype dtype) { return dtype == SUMO_FLOAT64 ? DBL_EPSILON : FLT_EPSILON; }

/* ---- sum and average ---------------------------------------------------------------------- */

/* The header's sum and average, summed in rank order in the accumulator type. */
static double reference_sum(sumo_dtype dtype, int op, int p, size_t i, double *abs_sum)
{
    double s64 = 0, a = 0;
    float s32 = 0;
    for (int r = 0; r < p; r++) {
        double x = stored_value(dtype, r, i);
        a += fabs(x);
        if (dtype == SUMO_FLOAT64) s64 += x;
        else s32 += (float)x;
    }
    *abs_sum = a;
    if (dtype == SUMO_FLOAT64) return op == SUMO_OP_AVERAGE ? s64 / p : s64;
    if (op == SUMO_OP_AVERAGE) s32 /= (float)p;
    return round_to(dtype, s32);
}

int bench_check_sum(sumo_dtype dtype, int op, int p, const void *buf, size_t n, char *why,
                    size_t whylen)
{
    bool exact = true;
    size_t bad = 0, first_bad = 0;
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        double abs_sum, ref = reference_sum(dtype, op, p, i, &abs_sum);
        double got = load(dtype, buf, i);
        if (got == ref) continue;
        exact = false;
        double scale = op == SUMO_OP_AVERAGE ? abs_sum / p : abs_sum;
        double tol = p * acc_eps_of(dtype) * scale + eps_of(dtype) * fabs(ref) + 1e-30;
        double err = fabs(got - ref);
        if (!(err <= tol)) {
            if (bad++ == 0) first_bad = i;
            worst = fmax(worst, err / tol);
        }
    }
    if (bad) {
        snprintf(why, whylen, "%zu of %zu elements off (first at %zu, worst %.3g x tolerance)", bad,
                 n, first_bad, worst);
        return BENCH_CHECK_FAIL;
    }
    return exact ? BENCH_CHECK_EXACT : BENCH_CHECK_OK;
}

/* ---- Adasum ------------------------------------------------------------------------------- */

/* Adasum(a, b) into a, per adasum.md: dot and norms in double; the combine in double for
 * fp32/fp64, in fp32 with an FMA for fp16/bf16; the result rounded to the dtype. */
static void adasum_pair(sumo_dtype dtype, double *a, const double *b, size_t n)
{
    double d = 0, na = 0, nb = 0;
    for (size_t i = 0; i < n; i++) {
        d += a[i] * b[i];
        na += a[i] * a[i];
        nb += b[i] * b[i];
    }
    double tiny = sqrt(DBL_MIN);
    double ca = na < tiny ? 1.0 : 1.0 - d / (2 * na);
    double cb = nb < tiny ? 1.0 : 1.0 - d / (2 * nb);
    for (size_t i = 0; i < n; i++) {
        if (dtype == SUMO_FLOAT32 || dtype == SUMO_FLOAT64) a[i] = round_to(dtype, ca * a[i] + cb * b[i]);
        else a[i] = round_to(dtype, fmaf((float)ca, (float)a[i], (float)cb * (float)b[i]));
    }
}

/*
 * The tree sumo.h defines for any P, written here independently: with P2 the largest power of
 * two <= P and R = P - P2, the 2R leading ranks first combine in pairs (w_i = A(u_2i, u_2i+1)
 * for i < R, w_i = u_(i+R) after), then the balanced binary tree over w_0 .. w_(P2-1) in order
 * (for powers of two: the rank-order tree of docs/design/adasum.md). Combines in place in v and
 * returns the vector holding the result.
 */
static const double *adasum_tree(sumo_dtype dtype, int p, double **v, double **w, size_t n)
{
    int p2 = 1;
    while (p2 * 2 <= p) p2 *= 2;
    int rem = p - p2;
    for (int i = 0; i < p2; i++) {
        if (i < rem) adasum_pair(dtype, v[2 * i], v[2 * i + 1], n);
        w[i] = i < rem ? v[2 * i] : v[i + rem];
    }
    for (int step = 1; step < p2; step *= 2)
        for (int i = 0; i + step < p2; i += 2 * step) adasum_pair(dtype, w[i], w[i + step], n);
    return w[0];
}

/* Tolerance is Horovod's: relative L2 error below 100 epsilon of the dtype. */
static int compare_adasum(sumo_dtype dtype, const void *buf, const double *ref, size_t n,
                          char *why, size_t whylen)
{
    double e2 = 0, r2 = 0;
    bool exact = true;
    for (size_t i = 0; i < n; i++) {
        double got = load(dtype, buf, i), diff = got - ref[i];
        exact = exact && got == ref[i];
        e2 += diff * diff;
        r2 += ref[i] * ref[i];
    }
    double rel = r2 > 0 ? sqrt(e2 / r2) : sqrt(e2);
    if (exact) return BENCH_CHECK_EXACT;
    if (rel < 100 * eps_of(dtype)) return BENCH_CHECK_OK;
    snprintf(why, whylen, "relative L2 error %.3g against the reference tree (limit %.3g)", rel,
             100 * eps_of(dtype));
    return BENCH_CHECK_FAIL;
}

/* Every rank's input in double, or false when there is no memory for them. */
static bool load_inputs(sumo_dtype dtype, int p, size_t n, double **v)
{
    for (int r = 0; r < p; r++) {
        v[r] = malloc(n * sizeof **v + 1);
        if (v[r] == NULL) return false;
        for (size_t i = 0; i < n; i++) v[r][i] = stored_value(dtype, r, i);
    }
    return true;
}

size_t bench_tensor_count(size_t n, size_t ntensors, size_t t)
{
    return n / ntensors + (t < n % ntensors ? 1 : 0);
}

/* The tree on each tensor of the layout, into ref. */
static void adasum_tensors(sumo_dtype dtype, int p, double **v, double **w, double **at,
                           size_t n, size_t ntensors, double *ref)
{
    for (size_t t = 0, off = 0; t < ntensors; t++) {
        size_t len = bench_tensor_count(n, ntensors, t);
        for (int r = 0; r < p; r++) at[r] = v[r] + off;
        const double *res = adasum_tree(dtype, p, at, w, len);
        for (size_t i = 0; i < len; i++) ref[off + i] = res[i];
        off += len;
    }
}

int bench_check_adasum(sumo_dtype dtype, int p, const void *buf, size_t n, size_t ntensors,
                       char *why, size_t whylen)
{
    /* The reference holds every rank's vector in double. malloc succeeds beyond the memory
     * (overcommit) and the OOM killer would end the run while filling it: skip instead. */
    double need = (double)p * (double)n * sizeof(double);
    double free_bytes = (double)sysconf(_SC_AVPHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
    if (need > free_bytes / 2) {
        snprintf(why, whylen, "the reference needs %.1f GiB, more than half the free memory",
                 need / (1 << 30));
        return BENCH_CHECK_NA;
    }
    double **v = calloc((size_t)p, sizeof *v);
    double **w = calloc((size_t)p, sizeof *w), **at = calloc((size_t)p, sizeof *at);
    double *ref = malloc(n * sizeof *ref + 1);
    int verdict = BENCH_CHECK_NA;
    if (v == NULL || w == NULL || at == NULL || ref == NULL || !load_inputs(dtype, p, n, v)) {
        snprintf(why, whylen, "no memory for the reference");
    } else {
        adasum_tensors(dtype, p, v, w, at, n, ntensors ? ntensors : 1, ref);
        verdict = compare_adasum(dtype, buf, ref, n, why, whylen);
    }
    for (int r = 0; v && r < p; r++) free(v[r]);
    free(v);
    free(w);
    free(at);
    free(ref);
    return verdict;
}

/* ---- agreement across ranks --------------------------------------------------------------- */

/* FNV-1a, 64 bits, with the standard offset basis; only compared across ranks, never printed. */
double bench_hash(const void *buf, size_t bytes)
{
    const unsigned char *p = buf;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < bytes; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return (double)(uint32_t)(h ^ (h >> 32));
}
