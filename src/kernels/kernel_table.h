/*
 * Kernel tables (sumo_ext.h's sumo_kernel_table): how the layers above reach data. The host
 * memory's table (kernel_table.c) wraps the vectorised kernels of kernels.h; a table for
 * another memory (a device's) is added from outside with the same meaning.
 */
#ifndef SUMO_KERNEL_TABLE_H
#define SUMO_KERNEL_TABLE_H

#include "kernels/kernels.h"

/*
 * The kernels of kernels.h, and the data touches of the layers above (copies, fills, the
 * optimizers' element-wise updates), as the host memory's kernel table (sumo_ext.h's sumo_kernel_table,
 * which says what each entry does). The collectives and the layers above reach data only
 * through a table: the one for the memory the buffers live in, so buffers in another memory (a
 * device's) get that memory's kernels with the same meaning, never a host loop over a device
 * pointer.
 */
const sumo_kernel_table *sumo__host_kernels(void);

/* A kernel table and the execution context (stream) its kernels run on. */
typedef struct sumo__exec {
    const sumo_kernel_table *k;
    void *stream;
} sumo__exec;

static inline sumo__exec sumo__host_exec(void)
{
    return (sumo__exec){.k = sumo__host_kernels(), .stream = NULL};
}

/* The calls, one per entry (the table's ctx and the stream filled in). */
static inline sumo_result sumo__k_copy(const sumo__exec *x, void *dst, const void *src,
                                       size_t bytes)
{
    if (bytes == 0 || dst == src) return SUMO_SUCCESS;
    return x->k->copy(x->k->ctx, x->stream, dst, src, bytes);
}
static inline sumo_result sumo__k_fill(const sumo__exec *x, sumo_dtype dtype, void *dst,
                                       double value, size_t n)
{
    return n ? x->k->fill(x->k->ctx, x->stream, dtype, dst, value, n) : SUMO_SUCCESS;
}
static inline sumo_result sumo__k_first_nonfinite(const sumo__exec *x, sumo_dtype dtype,
                                                  const void *src, size_t n, size_t *first)
{
    *first = SIZE_MAX;
    return n ? x->k->first_nonfinite(x->k->ctx, x->stream, dtype, src, n, first) : SUMO_SUCCESS;
}
static inline sumo_result sumo__k_reduce(const sumo__exec *x, sumo_dtype dtype, void *const *outs,
                                         int nout, const void *const *ins, int nin, size_t n,
                                         int divisor)
{
    return n ? x->k->reduce(x->k->ctx, x->stream, dtype, outs, nout, ins, nin, n, divisor)
             : SUMO_SUCCESS;
}
/* dst = a + b. */
static inline sumo_result sumo__k_add(const sumo__exec *x, sumo_dtype dtype, void *dst,
                                      const void *a, const void *b, size_t n)
{
    const void *ins[2] = {a, b};
    return sumo__k_reduce(x, dtype, &dst, 1, ins, 2, n, 1);
}
/* dst = src / divisor (a copy when divisor is 1). */
static inline sumo_result sumo__k_divide(const sumo__exec *x, sumo_dtype dtype, void *dst,
                                         const void *src, size_t n, int divisor)
{
    if (divisor == 1) return sumo__k_copy(x, dst, src, n * sumo__dtype_bytes(dtype));
    return sumo__k_reduce(x, dtype, &dst, 1, &src, 1, n, divisor);
}
static inline sumo_result sumo__k_convert(const sumo__exec *x, sumo_dtype dst_dtype, void *dst,
                                          sumo_dtype src_dtype, const void *src, size_t n)
{
    return n ? x->k->convert(x->k->ctx, x->stream, dst_dtype, dst, src_dtype, src, n)
             : SUMO_SUCCESS;
}
static inline sumo_result sumo__k_dot_norms(const sumo__exec *x, sumo_dtype dtype, const void *a,
                                            const void *b, size_t n, double out[3])
{
    return x->k->dot_norms(x->k->ctx, x->stream, dtype, a, b, n, out);
}
static inline sumo_result sumo__k_scaled_add(const sumo__exec *x, sumo_dtype dtype, void *a,
                                             double ca, const void *b, double cb, size_t n)
{
    return n ? x->k->scaled_add(x->k->ctx, x->stream, dtype, a, ca, b, cb, n) : SUMO_SUCCESS;
}
static inline sumo_result sumo__k_gram_partials(const sumo__exec *x, sumo_dtype dtype,
                                                const void *const *ins, int nin,
                                                const size_t *offsets, size_t ntensors,
                                                size_t lo, size_t hi, double *gram)
{
    return hi > lo ? x->k->gram_partials(x->k->ctx, x->stream, dtype, ins, nin, offsets,
                                         ntensors, lo, hi, gram)
                   : SUMO_SUCCESS;
}
static inline sumo_result sumo__k_weighted_sum(const sumo__exec *x, sumo_dtype dtype,
                                               void *const *outs, int nout,
                                               const void *const *ins, int nin,
                                               const size_t *offsets, size_t ntensors,
                                               size_t lo, size_t hi, const double *w)
{
    return hi > lo ? x->k->weighted_sum(x->k->ctx, x->stream, dtype, outs, nout, ins, nin,
                                        offsets, ntensors, lo, hi, w)
                   : SUMO_SUCCESS;
}
static inline sumo_result sumo__k_delta(const sumo__exec *x, sumo_dtype dtype, void *delta,
                                        const void *now, const void *start, size_t n)
{
    return n ? x->k->delta(x->k->ctx, x->stream, dtype, delta, now, start, n) : SUMO_SUCCESS;
}
static inline sumo_result sumo__k_apply_delta(const sumo__exec *x, sumo_dtype dtype, void *params,
                                              const void *start, const void *delta, size_t n,
                                              size_t *first)
{
    *first = SIZE_MAX;
    return n ? x->k->apply_delta(x->k->ctx, x->stream, dtype, params, start, delta, n, first)
             : SUMO_SUCCESS;
}
static inline sumo_result sumo__k_quantize(const sumo__exec *x, sumo_compression_format format,
                                           size_t block, void *dst, const float *src, size_t n,
                                           size_t *first)
{
    *first = SIZE_MAX;
    return n ? x->k->quantize(x->k->ctx, x->stream, format, block, dst, src, n, first)
             : SUMO_SUCCESS;
}
static inline sumo_result sumo__k_dequantize(const sumo__exec *x, sumo_compression_format format,
                                             size_t block, float *dst, const void *src, size_t n)
{
    return n ? x->k->dequantize(x->k->ctx, x->stream, format, block, dst, src, n) : SUMO_SUCCESS;
}
static inline sumo_result sumo__k_outer_update(const sumo__exec *x, sumo_dtype dtype, void *p,
                                               const void *c, void *v, void *x0, size_t n,
                                               const sumo_outer_step *step)
{
    return n ? x->k->outer_update(x->k->ctx, x->stream, dtype, p, c, v, x0, n, step)
             : SUMO_SUCCESS;
}
static inline sumo_result sumo__k_synchronize(const sumo__exec *x)
{
    return x->k->synchronize(x->k->ctx, x->stream);
}

/* The entries of a table that are missing (NULL), or NULL when it is complete: what
 * sumo_comm_add_kernels refuses a table for. */
const char *sumo__kernel_table_missing(const sumo_kernel_table *table);

/* The size of a table of the sumo before the share entries: still accepted, and read no
 * further. */
#define SUMO__KERNEL_TABLE_SIZE_NO_SHARE offsetof(sumo_kernel_table, share)

/* Whether the table shares its memory between processes (its share entries are there). */
static inline bool sumo__kernels_share(const sumo_kernel_table *k)
{
    return k->struct_size >= sizeof(sumo_kernel_table) && k->share != NULL;
}

#endif
