/* ACGA's weights: one group's from its coefficients (both forms), and from Gram matrices
 * (acga_gram.h); the steps are numbered as in acga.c. */
#include "aggregation/acga_gram.h"
#include "collectives/adasum_gram.h"

#include <math.h>
#include <stdint.h>

/* A coefficient sum at or below this fraction of sum|a'| makes the weights uniform; both of
 * ACGA's forms decide it in sumo__acga_group_weights alone. */
#define SUM_REL_TINY 1e-6

typedef struct entry {
    double v;
    int rank;
} entry;

/* The sort and the mapped values of sumo__acga_group_weights; one_group's den and a follow. */
static size_t group_work_bytes(int nranks) { return (size_t)nranks * (sizeof(entry) + sizeof(double)); }

size_t sumo__acga_gram_work_bytes(int nranks)
{
    return group_work_bytes(nranks) + 2 * (size_t)nranks * sizeof(double);
}

/* Ascending by value, ties by rank: acga.c's total order (no NaN reaches it). Insertion sort:
 * N is a rank count, and a stable in-place sort needs no allocation. */
static void sort_entries(entry *e, int n)
{
    for (int i = 1; i < n; i++) {
        entry x = e[i];
        int j = i - 1;
        while (j >= 0 && (e[j].v > x.v || (e[j].v == x.v && e[j].rank > x.rank))) {
            e[j + 1] = e[j];
            j--;
        }
        e[j + 1] = x;
    }
}

int sumo__acga_group_weights(const sumo_acga_options *o, int n, const double *a,
                             const double *mold, int initialised, double *mk, double *w,
                             double *sum_out, double *l1_out, void *work)
{
    entry *sorted = work;
    double *mapped = (double *)(void *)(sorted + n);
    for (int r = 0; r < n; r++) {
        if (!isfinite(a[r])) return SUMO__ACGA_NONFINITE;
        sorted[r] = (entry){.v = a[r], .rank = r};
    }
    sort_entries(sorted, n);
    for (int i = 0; i < n; i++)
        mk[i] = initialised ? o->beta * mold[i] + (1.0 - o->beta) * sorted[i].v : sorted[i].v;
    for (int i = 0; i < n; i++) {
        if (o->reference_permutation) mapped[i] = mk[sorted[i].rank];
        else mapped[sorted[i].rank] = mk[i];
    }
    double mn = mapped[0];
    for (int i = 1; i < n; i++) mn = mapped[i] < mn ? mapped[i] : mn;
    if (o->negative_guard && mn < 0)
        for (int i = 0; i < n; i++) mapped[i] -= mn;
    double sum = 0, l1 = 0;
    for (int i = 0; i < n; i++) {
        sum += mapped[i];
        l1 += fabs(mapped[i]);
    }
    *sum_out = sum;
    *l1_out = l1;
    if (!(sum > SUM_REL_TINY * l1)) return SUMO__ACGA_UNIFORM;
    for (int r = 0; r < n; r++) w[r] = mapped[r] / sum;
    return SUMO__ACGA_WEIGHTED;
}

static int one_group(const sumo_acga_options *o, int n, const double *G, const double *mold,
                     int initialised, double *mk, double *coef, void *work)
{
    double *den = (double *)((unsigned char *)work + group_work_bytes(n)), *a = den + n;
    for (size_t e = 0; e < sumo__gram_len(n); e++)
        if (!isfinite(G[e])) return SUMO__ACGA_NONFINITE;
    /* 2. a_r = <g_r, s> / (|g_r| + eps) / N. */
    for (int r = 0; r < n; r++) {
        double dot = 0;
        for (int j = 0; j < n; j++) dot += G[sumo__gram_index(n, r, j)];
        den[r] = sqrt(G[sumo__gram_index(n, r, r)]) + o->eps;
        a[r] = den[r] == 0 ? 0.0 : dot / den[r] / n;
    }
    /* 4. Sort, EMA, map back, guard, normalise: the weights w (in coef for now). */
    double sum, l1;
    int kind = sumo__acga_group_weights(o, n, a, mold, initialised, mk, coef, &sum, &l1, work);
    if (kind == SUMO__ACGA_NONFINITE) return kind;
    /* 5. The coefficients of the unit-normalised gradients. */
    for (int r = 0; r < n; r++) {
        double wr = kind == SUMO__ACGA_WEIGHTED ? coef[r] : 1.0 / n;
        coef[r] = den[r] == 0 ? 0.0 : wr / den[r];
    }
    /* 6. Rescale: |G|^2 = c^T G c, |s|^2 = sum of all entries. */
    if (o->rescale) {
        double ss = 0, gg = 0;
        for (int i = 0; i < n; i++) {
            double rs = 0, rg = 0;
            for (int j = 0; j < n; j++) {
                double gij = G[sumo__gram_index(n, i, j)];
                rs += gij;
                rg += coef[j] * gij;
            }
            ss += rs;
            gg += coef[i] * rg;
        }
        /* gg <= 0 only when the combination cancels to rounding noise: acga.c's vector norm
         * is then noise too; keep the coefficients, as acga.c keeps a zero G. */
        if (gg > 0 && ss >= 0) {
            double f = (sqrt(ss) / n) / sqrt(gg);
            for (int r = 0; r < n; r++) coef[r] *= f;
        }
    }
    return kind;
}

size_t sumo__acga_gram_weights(const sumo_acga_options *o, int nranks, size_t ngroups,
                               const double *gram, const double *m, int initialised,
                               double *m_next, double *coef, unsigned char *kind, void *work)
{
    const size_t n = (size_t)nranks, len = sumo__gram_len(nranks);
    size_t first_bad = SIZE_MAX;
    for (size_t k = 0; k < ngroups; k++) {
        double *ck = coef + k * n;
        int r = one_group(o, nranks, gram + k * len, m + k * n, initialised, m_next + k * n, ck,
                          work);
        kind[k] = (unsigned char)r;
        if (r == SUMO__ACGA_NONFINITE) {
            for (size_t i = 0; i < n; i++) ck[i] = NAN;
            if (first_bad == SIZE_MAX) first_bad = k;
        }
    }
    return first_bad;
}
