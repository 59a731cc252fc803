/*
 * Adasum's weights from the Gram matrix (adasum_gram.h), tensor by tensor: the tree's math is
 * kernels/adasum_weights.h's, one source with the CUDA plugin's device combine.
 */
#include "collectives/adasum_gram.h"

#include <stdint.h>

size_t sumo__adasum_gram_weights(const sumo__adasum_gram_params *p, const double *gram,
                                 size_t ntensors, double *w, unsigned char *flags, double *work)
{
    const int P = p->nranks;
    const size_t len = sumo__gram_len(P);
    size_t first_bad = SIZE_MAX;
    /* 2 doubles per slot, at most P slots */
    sumo__adasum_node *slot = (sumo__adasum_node *)(void *)work;
    for (size_t t = 0; t < ntensors; t++) {
        unsigned char f = sumo__adasum_gram_weights_one(p, gram + t * len, w + t * (size_t)P, slot);
        if ((f & SUMO__GRAM_NONFINITE) && first_bad == SIZE_MAX) first_bad = t;
        if (flags) flags[t] = f;
    }
    return first_bad;
}
