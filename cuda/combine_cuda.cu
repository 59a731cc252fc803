/*
 * The device combine's weights (kernels_cuda.h, sumo_cuda__weights_args): Adasum's tree read in
 * coefficient space from each piece's Gram totals, on the device, with the host's own source
 * (src/kernels/adasum_weights.h), and its emulator.
 */
#include "kernels_cuda.cuh"
/* The weights' math, one source with the library's host path (it says why it is shared). */
#include "../src/kernels/adasum_weights.h"

namespace {

constexpr int GRAM_MAX_LEN = SUMO_CUDA__MAX_IN * (SUMO_CUDA__MAX_IN + 1) / 2;

/* Piece p's weights, wide flag and flags; returns the flags. Each thread works on copies in
 * its own memory (the tree rewrites its weights many times), then stores them once. */
HD unsigned char weights_piece(const sumo_cuda__weights_args &a, size_t p)
{
    const int P = a.nin;
    const size_t L = (size_t)P * (size_t)(P + 1) / 2;
    double G[GRAM_MAX_LEN], w[SUMO_CUDA__MAX_IN];
    sumo__adasum_node slot[SUMO_CUDA__MAX_IN];
    /* The table's gram_partials adds totals into a zeroed array: 0.0 + x, the same bits. */
    for (size_t q = 0; q < L; q++) G[q] = 0.0 + a.totals[p * L + q];
    sumo__adasum_gram_params prm;
    prm.nranks = P;
    prm.group_size = a.group_size;
    prm.need = a.need;
    prm.gram_err = a.gram_err;
    const unsigned char f = sumo__adasum_gram_weights_one(&prm, G, w, slot);
    bool fits = true;
    for (int k = 0; k < P; k++) {
        a.w[p * (size_t)P + (size_t)k] = w[k];
        fits = fits && sumo__coef_fits_float(w[k]);
    }
    a.wide[p] = a.narrow && !fits;
    a.flags[p] = f;
    return f;
}

__global__ void __launch_bounds__(BLOCK) weights_kernel(const __grid_constant__ sumo_cuda__weights_args a)
{
    int any = 0;
    for (size_t p = threadIdx.x; p < a.npieces; p += BLOCK) any |= weights_piece(a, p) != 0;
    any = __syncthreads_or(any);
    if (threadIdx.x == 0) *a.accept = any ? 0u : 1u;
}

} // namespace

extern "C" {

int sumo_cuda__weights_launch(const sumo_cuda__weights_args *a, void *stream)
{
    if (a->nin < 1 || a->nin > SUMO_CUDA__MAX_IN) return (int)cudaErrorInvalidValue;
    /* One block whatever the count: the accept word is the block's OR, with no second pass;
     * a thread weighs npieces / 256 tensors, microseconds for thousands. */
    weights_kernel<<<1, BLOCK, 0, (cudaStream_t)stream>>>(*a);
    return (int)cudaGetLastError();
}

void sumo_cuda__weights_emulate(const sumo_cuda__weights_args *a)
{
    if (a->nin < 1 || a->nin > SUMO_CUDA__MAX_IN) return;
    int any = 0;
    for (size_t p = 0; p < a->npieces; p++) any |= weights_piece(*a, p) != 0;
    *a->accept = any ? 0u : 1u;
}

} // extern "C"
