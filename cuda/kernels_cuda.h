/*
 * The device kernels of sumo's CUDA plugin (kernels_cuda.cu, gram_cuda.cu, wsum_cuda.cu,
 * codec_cuda.cu; kernels_cuda.cuh says what they share) as the table glue (table_cuda.c)
 * calls them: one argument struct per kernel family, a launcher that queues the kernel on a
 * stream, and an emulator that runs the very same per-element and per-thread code on the
 * host, in the order the device runs it.
 *
 * The emulators exist so that every host-side part can be tested without a GPU: the index
 * arithmetic of the layout-aware launches (pieces, chunks, tails), the rounding of every
 * entry (compared bit for bit with sumo's host table) and the Gram partials' reduction order
 * (the device's result must equal the emulator's bit for bit, which the device tests check).
 *
 * Internal to the plugin: names carry sumo_cuda__, nothing here is exported from
 * libsumo_cuda.so.
 */
#ifndef SUMO_CUDA_KERNELS_CUDA_H
#define SUMO_CUDA_KERNELS_CUDA_H

#include "sumo.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Inputs of one Gram or weighted-sum launch: sumo's limit (kernels.h's SUMO__GRAM_MAX_IN). */
#define SUMO_CUDA__MAX_IN 16
/* Threads per block of every kernel. */
#define SUMO_CUDA__BLOCK 256
/* Pointers of a reduce that travel in the launch's arguments; more go through a device
 * array (threads ranks beyond 32 on one device). */
#define SUMO_CUDA__INLINE_PTRS 32
/* Pieces of a Gram or weighted-sum launch that travel in the launch's arguments (with the
 * weighted sum's weights and wide flags): a call over a few tensors, the common case of a
 * combine, then needs no upload, whose pageable copy costs the host a wait of its own. */
#define SUMO_CUDA__INLINE_PIECES 4

/*
 * A layout-aware call covers [lo, hi) of a buffer cut into tensors. Each tensor's part of the
 * range is a piece; each piece is cut into items of `chunk` elements (the last one shorter),
 * and one block runs one item. Items are numbered piece by piece, so an item's piece is found
 * by a binary search over first_item. The cut depends on the piece's length alone, so the
 * Gram partials' summation order does too (sumo_ext.h's contract), whatever the addresses.
 */
typedef struct sumo_cuda__piece {
    size_t start;      /* first element, relative to lo */
    size_t len;        /* > 0 */
    size_t first_item; /* items of the pieces before this one */
    size_t tensor;     /* index in the layout */
} sumo_cuda__piece;

/* The pieces of [lo, hi) in a layout of ntensors tensors (offsets: ntensors + 1 prefix sums),
 * in order, skipping tensors with nothing in the range (zero-length ones too), as sumo's host
 * table walks them. Writes at most `cap` pieces to out (out may be NULL with cap 0) and
 * returns how many there are; *nitems (may be NULL) receives the number of items. */
size_t sumo_cuda__plan(const size_t *offsets, size_t ntensors, size_t lo, size_t hi,
                       size_t chunk, sumo_cuda__piece *out, size_t cap, size_t *nitems);

/* Elements per item of the Gram and weighted-sum launches for a dtype (16-byte vectors per
 * thread, a fixed number of them per item). */
size_t sumo_cuda__gram_chunk(sumo_dtype dtype);
size_t sumo_cuda__wsum_chunk(sumo_dtype dtype);

/* Entries of the packed upper triangle of nin inputs: nin (nin + 1) / 2. */
static inline size_t sumo_cuda__gram_len(int nin) { return (size_t)nin * (size_t)(nin + 1) / 2; }

/* Row groups of one item: inputs above 8 split the triangle's rows over blocks, so that one
 * thread's accumulators stay in registers. */
int sumo_cuda__gram_groups(int nin);

/* ---- Gram partials ---------------------------------------------------------------------- */

typedef struct sumo_cuda__gram_args {
    sumo_dtype dtype;
    int nin;
    const void *ins[SUMO_CUDA__MAX_IN]; /* at element lo */
    const sumo_cuda__piece *pieces;     /* kernel-visible (device memory, or host for the
                                           emulator); NULL: inl */
    sumo_cuda__piece inl[SUMO_CUDA__INLINE_PIECES]; /* the pieces, up to INLINE_PIECES */
    size_t npieces, nitems;
    double *partials; /* nitems x gram_len(nin): one per item, packed */
    double *totals;   /* npieces x gram_len(nin): the items of each piece summed */
} sumo_cuda__gram_args;

/* Two launches: each item's partials (a fixed-order tree inside the block), then each piece's
 * items summed in item order. Returns a cudaError_t as int (0: queued). */
int sumo_cuda__gram_launch(const sumo_cuda__gram_args *a, void *stream);
void sumo_cuda__gram_emulate(const sumo_cuda__gram_args *a);

/* ---- weighted sum ----------------------------------------------------------------------- */

typedef struct sumo_cuda__wsum_args {
    sumo_dtype dtype;
    int nin, nout;
    const void *ins[SUMO_CUDA__MAX_IN];
    void *outs[SUMO_CUDA__MAX_IN];
    const sumo_cuda__piece *pieces;
    size_t npieces, nitems;
    const double *w;           /* npieces x nin: each piece's tensor's weights */
    const unsigned char *wide; /* npieces: 1 where a weight does not narrow to float (fp16,
                                  bf16: the double path, as sumo's host kernels) */
    /* Up to INLINE_PIECES pieces: the pieces, weights and wide flags in the arguments, each
     * used where its kernel-visible pointer above is NULL. */
    sumo_cuda__piece inl[SUMO_CUDA__INLINE_PIECES];
    double inl_w[SUMO_CUDA__INLINE_PIECES * SUMO_CUDA__MAX_IN];
    unsigned char inl_wide[SUMO_CUDA__INLINE_PIECES];
    /* Kernel-visible, or NULL: the combine's accept flag (sumo_cuda__weights_args), read
     * before anything is written; 0 leaves every output untouched. */
    const unsigned int *accept;
} sumo_cuda__wsum_args;

int sumo_cuda__wsum_launch(const sumo_cuda__wsum_args *a, void *stream);
void sumo_cuda__wsum_emulate(const sumo_cuda__wsum_args *a);

/* ---- the device combine's weights (kernels/adasum_weights.h on the device) --------------- */

/*
 * Adasum's weights of every piece from its Gram totals, on the device: between the Gram pass
 * and the weighted sum of a combine whose inputs one caller holds whole (one piece per
 * non-empty tensor), so that the Gram matrix and the weights stay on the device. Each piece's
 * Gram is 0.0 + its total, as the table's gram_partials adds totals into a zeroed host array,
 * and its weights are sumo__adasum_gram_weights_one's, so the bits are the host path's. One
 * block: a thread per piece, then the block's OR of the flags decides *accept (1: every piece's
 * flags are 0, the weights are applied; 0: the weighted sum, launched with this accept, writes
 * nothing and the caller takes another path on untouched inputs).
 */
typedef struct sumo_cuda__weights_args {
    int nin;        /* the ranks P */
    int group_size; /* sumo__adasum_gram_params' */
    double need, gram_err;
    int narrow; /* fp16 / bf16: a weight outside float sets the piece's wide flag */
    size_t npieces;
    const double *totals; /* npieces x gram_len(nin) */
    double *w;            /* npieces x nin */
    unsigned char *wide;  /* npieces */
    unsigned char *flags; /* npieces: sumo__adasum_gram_weights' flags */
    unsigned int *accept; /* one word */
} sumo_cuda__weights_args;

int sumo_cuda__weights_launch(const sumo_cuda__weights_args *a, void *stream);
void sumo_cuda__weights_emulate(const sumo_cuda__weights_args *a);

/* ---- element-wise kernels --------------------------------------------------------------- */

typedef enum sumo_cuda__ew_op {
    SUMO_CUDA__EW_FILL = 1,   /* dst = pattern (bits of the value rounded once to dtype) */
    SUMO_CUDA__EW_SCAN,       /* *first = first index of a NaN/Inf in a */
    SUMO_CUDA__EW_REDUCE,     /* outs = (ins[0] + .. + ins[nin-1]) / divisor */
    SUMO_CUDA__EW_CONVERT,    /* dst (dtype) = a (src_dtype) */
    SUMO_CUDA__EW_SCALED_ADD, /* dst = ca dst + cb a */
    SUMO_CUDA__EW_DELTA,      /* dst = a - b */
    SUMO_CUDA__EW_APPLY,      /* dst = a + b; *first = first non-finite result */
    SUMO_CUDA__EW_OUTER,      /* the outer loop's step: x = dst, combined = a, v = c, x0 = d */
} sumo_cuda__ew_op;

typedef struct sumo_cuda__ew_args {
    sumo_cuda__ew_op op;
    sumo_dtype dtype, src_dtype;
    size_t n;
    void *dst;
    const void *a, *b;
    void *c, *d;
    double ca, cb;                  /* scaled_add */
    double lr, mu, gamma, merge;    /* outer_update (sumo_outer_step) */
    int nesterov, from_average;
    uint64_t pattern;               /* fill: the value's bits in dtype */
    int wide;                       /* scaled_add fp16/bf16: a coefficient outside float */
    unsigned long long *first;      /* scan, apply: kernel-visible, set to ~0 before */
    /* reduce */
    int nin, nout, divisor;
    const void *ins[SUMO_CUDA__INLINE_PTRS];
    void *outs[SUMO_CUDA__INLINE_PTRS];
    const void *const *ins_far; /* kernel-visible arrays when nin or nout > INLINE_PTRS */
    void *const *outs_far;
} sumo_cuda__ew_args;

int sumo_cuda__ew_launch(const sumo_cuda__ew_args *a, void *stream);
void sumo_cuda__ew_emulate(const sumo_cuda__ew_args *a);

/* ---- the compressed allreduce's codec (src/kernels/codec.h's, compiled for the device) ---- */

/* One launch covers ceil(n / block) blocks of one call: one thread block per codec block (its
 * largest magnitude and first non-finite element found with shared-memory atomics, exact and
 * order-free), then every element (4-bit codes: every byte) coded by its own thread. */
typedef struct sumo_cuda__q_args {
    int format;                /* sumo_compression_format: BF16, FP8_E4M3 or E3M0 */
    size_t block, n;
    void *payload;             /* quantize: written; dequantize: read */
    const float *src;          /* quantize */
    float *dst;                /* dequantize */
    unsigned long long *first; /* quantize: kernel-visible, ~0 before */
} sumo_cuda__q_args;

int sumo_cuda__quantize_launch(const sumo_cuda__q_args *a, void *stream);
void sumo_cuda__quantize_emulate(const sumo_cuda__q_args *a);
int sumo_cuda__dequantize_launch(const sumo_cuda__q_args *a, void *stream);
void sumo_cuda__dequantize_emulate(const sumo_cuda__q_args *a);

#ifdef __cplusplus
}
#endif

#endif
