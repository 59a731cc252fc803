/*
 * The sumo_kernel_table of CUDA device memory: every entry of sumo_ext.h over the kernels of
 * kernels_cuda.h, with the host table's meaning entry by entry (src/kernels/kernel_table.c).
 *
 * Each entry queues its work on the call's stream (`exec`, the stream of sumo_collective;
 * NULL: the legacy default stream) and waits for it before returning. sumo orders its ranks
 * with host-side barriers and hands device buffers to transports that run on their own
 * streams; neither orders device work, so an entry's effects must be complete when it returns
 * (the cost: one synchronisation per entry, a few microseconds; a collective makes few calls,
 * one Gram pass and one weighted sum for Adasum on ranks that share a device).
 *
 * Small results (Gram partials, dot products, a first non-finite index) go to host memory
 * through a pageable copy, which returns once the data is there. The scratch of a call (the
 * layout's pieces, the block partials) comes from the kernels object's memory pool, ordered
 * on the stream.
 *
 * The same glue drives the emulated kernels (host memory, host loops of the device's code) for
 * the host tests: only the memory calls and the launch differ (the `em` branches).
 */
#include "cuda_internal.h"
#include "device_cuda.h"
#include "stage_cuda.h"
#include "kernels_cuda.h"
/* The library's codec and conversions (it says why this one header is shared): the fill
 * patterns, the wide-path test and the codec's checks are the host table's own. */
#include "../src/kernels/codec.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MEMORY_NAME "cuda"

static sumo_cuda_kernels *of(void *ctx) { return ctx; }

#define CU(call)                                                       \
    do {                                                               \
        cudaError_t cu_e_ = (call);                                    \
        if (cu_e_ != cudaSuccess) return SUMO_CUDA__FAIL(cu_e_, #call); \
    } while (0)

/* ---- memory: the device's, or the emulator's (host) ----------------------------------------- */

/* The dtypes the library knows (sumo_dtype_size refuses the others). */
static bool dtype_ok(sumo_dtype dt)
{
    size_t bytes;
    return sumo_dtype_size(dt, &bytes) == SUMO_SUCCESS;
}

static sumo_result scratch_alloc(sumo_cuda_kernels *k, size_t bytes, cudaStream_t s, void **p)
{
    bytes = bytes ? (bytes + 63) / 64 * 64 : 64;
    if (k->emulated) {
        *p = aligned_alloc(64, bytes);
        return *p ? SUMO_SUCCESS : SUMO_ERR_SYSTEM;
    }
    if (k->pool) CU(cudaMallocFromPoolAsync(p, bytes, k->pool, s));
    else CU(cudaMalloc(p, bytes));
    return SUMO_SUCCESS;
}

static void scratch_free(sumo_cuda_kernels *k, void *p, cudaStream_t s)
{
    if (p == NULL) return;
    if (k->emulated) free(p);
    else if (k->pool) (void)cudaFreeAsync(p, s);
    else (void)cudaFree(p);
}

/* Host to kernel-visible memory. From pageable memory the runtime stages the copy (the source
 * may be freed on return); from a pinned staging block it is queued, and the block is kept
 * until the entry's wait. */
static sumo_result upload(sumo_cuda_kernels *k, void *dst, const void *src, size_t bytes,
                          cudaStream_t s)
{
    if (bytes == 0) return SUMO_SUCCESS;
    if (k->emulated) memcpy(dst, src, bytes);
    else CU(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, s));
    return SUMO_SUCCESS;
}

/* Kernel-visible to host memory: into pageable memory complete on return (the host waits
 * for the copy, and for the work queued before it); into a pinned staging block complete at
 * the entry's wait (finish). */
static sumo_result download(sumo_cuda_kernels *k, void *dst, const void *src, size_t bytes,
                            cudaStream_t s)
{
    if (bytes == 0) return SUMO_SUCCESS;
    if (k->emulated) memcpy(dst, src, bytes);
    else CU(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s));
    return SUMO_SUCCESS;
}

static sumo_result finish(sumo_cuda_kernels *k, cudaStream_t s)
{
    if (!k->emulated) CU(cudaStreamSynchronize(s));
    return SUMO_SUCCESS;
}

static sumo_result launched(int e, const char *what)
{
    return e == 0 ? SUMO_SUCCESS : SUMO_CUDA__FAIL((cudaError_t)e, what);
}

/* ---- layouts ------------------------------------------------------------------------------ */

/* The first tensor that ends after pos (common.h's sumo__first_tensor: this plugin builds on the
 * public headers alone, so it keeps its own copy). */
static size_t first_tensor(const size_t *offsets, size_t ntensors, size_t pos)
{
    size_t lo = 0, hi = ntensors;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (offsets[mid + 1] > pos) hi = mid;
        else lo = mid + 1;
    }
    return lo;
}

size_t sumo_cuda__plan(const size_t *offsets, size_t ntensors, size_t lo, size_t hi,
                       size_t chunk, sumo_cuda__piece *out, size_t cap, size_t *nitems)
{
    size_t np = 0, items = 0;
    for (size_t t = hi > lo ? first_tensor(offsets, ntensors, lo) : ntensors;
         t < ntensors && offsets[t] < hi; t++) {
        size_t s = offsets[t] > lo ? offsets[t] : lo;
        size_t e = offsets[t + 1] < hi ? offsets[t + 1] : hi;
        if (e <= s) continue;
        if (np < cap)
            out[np] = (sumo_cuda__piece){.start = s - lo, .len = e - s, .first_item = items,
                                         .tensor = t};
        items += (e - s + chunk - 1) / chunk;
        np++;
    }
    if (nitems) *nitems = items;
    return np;
}

/* The pieces of a call in host memory (malloc'd). */
static sumo_result plan_pieces(const size_t *offsets, size_t ntensors, size_t lo, size_t hi,
                               size_t chunk, sumo_cuda__piece **pieces, size_t *np, size_t *nitems)
{
    *np = sumo_cuda__plan(offsets, ntensors, lo, hi, chunk, NULL, 0, nitems);
    *pieces = NULL;
    if (*np == 0) return SUMO_SUCCESS;
    *pieces = malloc(*np * sizeof **pieces);
    if (*pieces == NULL) return SUMO_ERR_SYSTEM;
    sumo_cuda__plan(offsets, ntensors, lo, hi, chunk, *pieces, *np, nitems);
    return SUMO_SUCCESS;
}

/* ---- the entries ---------------------------------------------------------------------------- */

static bool k_claims(void *ctx, const void *ptr, size_t bytes)
{
    sumo_cuda_kernels *k = of(ctx);
    if (k->emulated) return k->claims_fn(k->claims_ctx, ptr, bytes);
    /* Device (or managed) memory of this device at both ends of the range. Host memory,
     * pinned or not, is the host table's: the host reaches it. */
    const unsigned char *ends[2] = {ptr, (const unsigned char *)ptr + (bytes ? bytes - 1 : 0)};
    for (int i = 0; i < 2; i++) {
        struct cudaPointerAttributes attr;
        if (cudaPointerGetAttributes(&attr, ends[i]) != cudaSuccess) {
            (void)cudaGetLastError(); /* no driver, or a pointer it does not know */
            return false;
        }
        if ((attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged) ||
            attr.device != k->device)
            return false;
    }
    return true;
}

static sumo_result k_alloc(void *ctx, size_t bytes, void **ptr)
{
    sumo_cuda_kernels *k = of(ctx);
    /* Shared emulated memory: the compressed allreduce's peers read its scratch. */
    if (k->emulated && k->emulated_ipc) return sumo_cuda__emu_shared_alloc(k, bytes, ptr);
    if (k->emulated) {
        *ptr = aligned_alloc(64, bytes ? (bytes + 63) / 64 * 64 : 64);
        return *ptr ? SUMO_SUCCESS : SUMO_ERR_SYSTEM;
    }
    sumo_cuda__device_guard g;
    CU(sumo_cuda__device_enter(k, &g));
    /* cudaMalloc's memory is 256-byte aligned, more than the 64 asked for. */
    cudaError_t e = cudaMalloc(ptr, bytes ? bytes : 1);
    sumo_cuda__device_leave(&g);
    if (e != cudaSuccess) return SUMO_CUDA__FAIL(e, "cudaMalloc");
    return SUMO_SUCCESS;
}

static void k_release(void *ctx, void *ptr)
{
    sumo_cuda_kernels *k = of(ctx);
    if (k->emulated && k->emulated_ipc) {
        sumo_cuda__emu_shared_free(k, ptr);
        return;
    }
    if (k->emulated) {
        free(ptr);
        return;
    }
    sumo_cuda__device_guard g;
    if (sumo_cuda__device_enter(k, &g) != cudaSuccess) {
        (void)cudaGetLastError();
        return;
    }
    (void)cudaFree(ptr);
    sumo_cuda__device_leave(&g);
}

/* Every entry below: checks, the device guard, the body, the guard's end. */
#define ENTER(k)                                            \
    sumo_cuda__device_guard guard_;                         \
    do {                                                    \
        cudaError_t ge_ = sumo_cuda__device_enter((k), &guard_); \
        if (ge_ != cudaSuccess) return SUMO_CUDA__FAIL(ge_, "cudaSetDevice"); \
    } while (0)
#define LEAVE(r)                            \
    do {                                    \
        sumo_cuda__device_leave(&guard_);   \
        return (r);                         \
    } while (0)

static sumo_result k_synchronize(void *ctx, void *exec)
{
    sumo_cuda_kernels *k = of(ctx);
    ENTER(k);
    LEAVE(finish(k, exec));
}

static sumo_result copy_body(sumo_cuda_kernels *k, cudaStream_t s, void *dst, const void *src,
                             size_t bytes)
{
    if (dst == src || bytes == 0) return SUMO_SUCCESS;
    if (k->emulated) {
        memcpy(dst, src, bytes);
        return SUMO_SUCCESS;
    }
    /* cudaMemcpyDefault: either side may be host memory (staging areas), the runtime knows
     * which from the addresses. */
    CU(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s));
    return finish(k, s);
}

static sumo_result k_copy(void *ctx, void *exec, void *dst, const void *src, size_t bytes)
{
    sumo_cuda_kernels *k = of(ctx);
    ENTER(k);
    LEAVE(copy_body(k, exec, dst, src, bytes));
}

/* One element-wise launch, waited for; `first` (may be NULL) receives the kernel's first
 * non-finite index. */
static sumo_result ew_body(sumo_cuda_kernels *k, cudaStream_t s, sumo_cuda__ew_args *a,
                           size_t *first)
{
    unsigned long long *dfirst = NULL, hfirst = ~0ull;
    sumo_result r = SUMO_SUCCESS;
    if (first) {
        r = scratch_alloc(k, sizeof *dfirst, s, (void **)&dfirst);
        if (r == SUMO_SUCCESS) r = upload(k, dfirst, &hfirst, sizeof hfirst, s);
        a->first = dfirst;
    }
    if (r == SUMO_SUCCESS) {
        if (k->emulated) sumo_cuda__ew_emulate(a);
        else r = launched(sumo_cuda__ew_launch(a, s), "element-wise kernel");
    }
    if (r == SUMO_SUCCESS && first) r = download(k, &hfirst, dfirst, sizeof hfirst, s);
    scratch_free(k, dfirst, s);
    if (r == SUMO_SUCCESS) r = finish(k, s);
    if (first) *first = hfirst == ~0ull ? SIZE_MAX : (size_t)hfirst;
    return r;
}

static sumo_result k_fill(void *ctx, void *exec, sumo_dtype dtype, void *dst, double value,
                          size_t n)
{
    sumo_cuda_kernels *k = of(ctx);
    if (!dtype_ok(dtype)) return SUMO_ERR_INVALID_ARGUMENT;
    if (n == 0) return SUMO_SUCCESS;
    sumo_cuda__ew_args a = {.op = SUMO_CUDA__EW_FILL, .dtype = dtype, .n = n, .dst = dst};
    switch (dtype) {
    case SUMO_FLOAT32: a.pattern = sumo__f32_bits((float)value); break;
    case SUMO_FLOAT64: a.pattern = sumo__f64_bits(value); break;
    case SUMO_FLOAT16: a.pattern = sumo__double_to_half(value); break;
    default: a.pattern = sumo__double_to_bf16(value); break;
    }
    ENTER(k);
    LEAVE(ew_body(k, exec, &a, NULL));
}

static sumo_result k_first_nonfinite(void *ctx, void *exec, sumo_dtype dtype, const void *src,
                                     size_t n, size_t *first)
{
    sumo_cuda_kernels *k = of(ctx);
    *first = SIZE_MAX;
    if (!dtype_ok(dtype)) return SUMO_ERR_INVALID_ARGUMENT;
    if (n == 0) return SUMO_SUCCESS;
    sumo_cuda__ew_args a = {.op = SUMO_CUDA__EW_SCAN, .dtype = dtype, .n = n, .a = src};
    ENTER(k);
    LEAVE(ew_body(k, exec, &a, first));
}

/* The reduce's pointers: in the launch's arguments up to SUMO_CUDA__INLINE_PTRS, else in a
 * kernel-visible array (*far, freed by the caller). */
static sumo_result reduce_pointers(sumo_cuda_kernels *k, cudaStream_t s, sumo_cuda__ew_args *a,
                                   void *const *outs, int nout, const void *const *ins, int nin,
                                   void **far)
{
    *far = NULL;
    if (nin <= SUMO_CUDA__INLINE_PTRS && nout <= SUMO_CUDA__INLINE_PTRS) {
        for (int j = 0; j < nin; j++) a->ins[j] = ins[j];
        for (int o = 0; o < nout; o++) a->outs[o] = outs[o];
        return SUMO_SUCCESS;
    }
    size_t bytes = ((size_t)nin + (size_t)nout) * sizeof(void *);
    const void **host = malloc(bytes);
    if (host == NULL) return SUMO_ERR_SYSTEM;
    memcpy(host, ins, (size_t)nin * sizeof(void *));
    memcpy(host + nin, outs, (size_t)nout * sizeof(void *));
    sumo_result r = scratch_alloc(k, bytes, s, far);
    if (r == SUMO_SUCCESS) r = upload(k, *far, host, bytes, s);
    free(host);
    a->ins_far = (const void *const *)*far;
    a->outs_far = (void *const *)((const void **)*far + nin);
    return r;
}

static sumo_result k_reduce(void *ctx, void *exec, sumo_dtype dtype, void *const *outs, int nout,
                            const void *const *ins, int nin, size_t n, int divisor)
{
    sumo_cuda_kernels *k = of(ctx);
    if (!dtype_ok(dtype) || nin < 1 || nout < 1 || divisor < 1) return SUMO_ERR_INVALID_ARGUMENT;
    if (n == 0) return SUMO_SUCCESS;
    sumo_cuda__ew_args a = {.op = SUMO_CUDA__EW_REDUCE, .dtype = dtype, .n = n, .nin = nin,
                            .nout = nout, .divisor = divisor};
    ENTER(k);
    void *far;
    sumo_result r = reduce_pointers(k, exec, &a, outs, nout, ins, nin, &far);
    if (r == SUMO_SUCCESS) r = ew_body(k, exec, &a, NULL);
    scratch_free(k, far, exec);
    LEAVE(r);
}

static sumo_result k_convert(void *ctx, void *exec, sumo_dtype dst_dtype, void *dst,
                             sumo_dtype src_dtype, const void *src, size_t n)
{
    sumo_cuda_kernels *k = of(ctx);
    size_t esz;
    if (sumo_dtype_size(dst_dtype, &esz) != SUMO_SUCCESS || !dtype_ok(src_dtype))
        return SUMO_ERR_INVALID_ARGUMENT;
    if (n == 0) return SUMO_SUCCESS;
    ENTER(k);
    if (dst_dtype == src_dtype) LEAVE(copy_body(k, exec, dst, src, n * esz));
    sumo_cuda__ew_args a = {.op = SUMO_CUDA__EW_CONVERT, .dtype = dst_dtype,
                            .src_dtype = src_dtype, .n = n, .dst = dst, .a = src};
    LEAVE(ew_body(k, exec, &a, NULL));
}

static sumo_result k_scaled_add(void *ctx, void *exec, sumo_dtype dtype, void *a_, double ca,
                                const void *b, double cb, size_t n)
{
    sumo_cuda_kernels *k = of(ctx);
    if (!dtype_ok(dtype)) return SUMO_ERR_INVALID_ARGUMENT;
    if (n == 0) return SUMO_SUCCESS;
    sumo_cuda__ew_args a = {.op = SUMO_CUDA__EW_SCALED_ADD, .dtype = dtype, .n = n, .dst = a_,
                            .a = b, .ca = ca, .cb = cb,
                            .wide = !sumo__coef_fits_float(ca) ||
                                    !sumo__coef_fits_float(cb)};
    ENTER(k);
    LEAVE(ew_body(k, exec, &a, NULL));
}

/* The pieces of a call: up to INLINE_PIECES into `local` (no allocation), else malloc'd
 * (*heap, freed by the caller). */
static sumo_result plan_some(const size_t *offsets, size_t ntensors, size_t lo, size_t hi,
                             size_t chunk, sumo_cuda__piece *local, sumo_cuda__piece **pieces,
                             sumo_cuda__piece **heap, size_t *np, size_t *nitems)
{
    *heap = NULL;
    *pieces = local;
    *np = sumo_cuda__plan(offsets, ntensors, lo, hi, chunk, local, SUMO_CUDA__INLINE_PIECES, nitems);
    if (*np <= SUMO_CUDA__INLINE_PIECES) return SUMO_SUCCESS;
    sumo_result r = plan_pieces(offsets, ntensors, lo, hi, chunk, heap, np, nitems);
    *pieces = *heap;
    return r;
}

/* The Gram partials of [lo, hi): the pieces in the launch's arguments (or uploaded), two
 * launches, the pieces' totals down, one wait, added into gram per tensor (the host table's
 * +=). */
static sumo_result gram_body(sumo_cuda_kernels *k, cudaStream_t s, sumo_dtype dtype,
                             const void *const *ins, int nin, const size_t *offsets,
                             size_t ntensors, size_t lo, size_t hi, double *gram)
{
    sumo_cuda__piece local[SUMO_CUDA__INLINE_PIECES], *pieces, *heap;
    size_t np, nitems, L = sumo_cuda__gram_len(nin);
    sumo_result r = plan_some(offsets, ntensors, lo, hi, sumo_cuda__gram_chunk(dtype), local,
                              &pieces, &heap, &np, &nitems);
    if (r != SUMO_SUCCESS || np == 0) return r;
    const bool far = np > SUMO_CUDA__INLINE_PIECES;
    size_t pieces_bytes = far ? (np * sizeof *pieces + 63) / 64 * 64 : 0;
    size_t partial_bytes = (nitems * L * sizeof(double) + 63) / 64 * 64;
    size_t total_bytes = np * L * sizeof(double);
    /* Host side: the pieces to upload, then the totals to download (pinned where they fit). */
    struct sumo_cuda__stage *st = sumo_cuda__stage_take(k, pieces_bytes + total_bytes);
    unsigned char *host = st ? st->mem : malloc(pieces_bytes + total_bytes);
    unsigned char *scratch = NULL;
    if (host == NULL) r = SUMO_ERR_SYSTEM;
    if (r == SUMO_SUCCESS) r = scratch_alloc(k, pieces_bytes + partial_bytes + total_bytes, s, (void **)&scratch);
    sumo_cuda__gram_args a = {.dtype = dtype, .nin = nin, .npieces = np, .nitems = nitems};
    double *totals = (double *)(void *)(host + pieces_bytes);
    if (r == SUMO_SUCCESS) {
        for (int i = 0; i < nin; i++) a.ins[i] = ins[i];
        a.partials = (double *)(void *)(scratch + pieces_bytes);
        a.totals = (double *)(void *)(scratch + pieces_bytes + partial_bytes);
        if (far) {
            memcpy(host, pieces, np * sizeof *pieces);
            a.pieces = (const sumo_cuda__piece *)(const void *)scratch;
            r = upload(k, scratch, host, np * sizeof *pieces, s);
        } else {
            memcpy(a.inl, pieces, np * sizeof *pieces);
        }
    }
    if (r == SUMO_SUCCESS) {
        if (k->emulated) sumo_cuda__gram_emulate(&a);
        else r = launched(sumo_cuda__gram_launch(&a, s), "Gram partials kernel");
    }
    if (r == SUMO_SUCCESS) r = download(k, totals, a.totals, total_bytes, s);
    scratch_free(k, scratch, s);
    if (r == SUMO_SUCCESS) r = finish(k, s);
    if (r == SUMO_SUCCESS)
        for (size_t p = 0; p < np; p++)
            for (size_t q = 0; q < L; q++) gram[pieces[p].tensor * L + q] += totals[p * L + q];
    if (st) sumo_cuda__stage_give_after(k, st, r, s);
    else free(host);
    free(heap);
    return r;
}

static sumo_result k_gram_partials(void *ctx, void *exec, sumo_dtype dtype, const void *const *ins,
                                   int nin, const size_t *offsets, size_t ntensors, size_t lo,
                                   size_t hi, double *gram)
{
    sumo_cuda_kernels *k = of(ctx);
    if (!dtype_ok(dtype) || nin < 1 || nin > SUMO_CUDA__MAX_IN) return SUMO_ERR_INVALID_ARGUMENT;
    if (hi <= lo) return SUMO_SUCCESS;
    ENTER(k);
    LEAVE(gram_body(k, exec, dtype, ins, nin, offsets, ntensors, lo, hi, gram));
}

static sumo_result k_dot_norms(void *ctx, void *exec, sumo_dtype dtype, const void *a,
                               const void *b, size_t n, double *out)
{
    sumo_cuda_kernels *k = of(ctx);
    out[0] = out[1] = out[2] = 0.0;
    if (!dtype_ok(dtype)) return SUMO_ERR_INVALID_ARGUMENT;
    if (n == 0) return SUMO_SUCCESS;
    /* The two-input Gram partials over one piece: (a.a, a.b, b.b). */
    const void *ins[2] = {a, b};
    const size_t offsets[2] = {0, n};
    double g[3] = {0, 0, 0};
    ENTER(k);
    sumo_result r = gram_body(k, exec, dtype, ins, 2, offsets, 1, 0, n, g);
    if (r == SUMO_SUCCESS) {
        out[0] = g[1];
        out[1] = g[0];
        out[2] = g[2];
    }
    LEAVE(r);
}

/* Each piece's weights (its tensor's) and wide flag (fp16/bf16 with a weight outside float:
 * the double path), into w (np x nin) and wide (np). */
static void piece_weights(const sumo_cuda__piece *pieces, size_t np, int nin, sumo_dtype dtype,
                          const double *w, double *pw, unsigned char *wide)
{
    bool narrow = dtype == SUMO_FLOAT16 || dtype == SUMO_BFLOAT16;
    for (size_t p = 0; p < np; p++) {
        const double *wt = w + pieces[p].tensor * (size_t)nin;
        bool fits = true;
        for (int i = 0; i < nin; i++) {
            pw[p * (size_t)nin + (size_t)i] = wt[i];
            fits = fits && sumo__coef_fits_float(wt[i]);
        }
        wide[p] = narrow && !fits;
    }
}

static sumo_result wsum_body(sumo_cuda_kernels *k, cudaStream_t s, sumo_dtype dtype,
                             void *const *outs, int nout, const void *const *ins, int nin,
                             const size_t *offsets, size_t ntensors, size_t lo, size_t hi,
                             const double *w)
{
    sumo_cuda__piece local[SUMO_CUDA__INLINE_PIECES], *pieces, *heap;
    size_t np, nitems;
    sumo_result r = plan_some(offsets, ntensors, lo, hi, sumo_cuda__wsum_chunk(dtype), local,
                              &pieces, &heap, &np, &nitems);
    if (r != SUMO_SUCCESS || np == 0) return r;
    sumo_cuda__wsum_args a = {.dtype = dtype, .nin = nin, .nout = nout, .npieces = np,
                              .nitems = nitems};
    for (int i = 0; i < nin; i++) a.ins[i] = ins[i];
    for (int o = 0; o < nout; o++) a.outs[o] = outs[o];
    struct sumo_cuda__stage *st = NULL;
    unsigned char *host = NULL, *scratch = NULL;
    if (np <= SUMO_CUDA__INLINE_PIECES) {
        /* Everything in the launch's arguments: no upload, no scratch. */
        memcpy(a.inl, pieces, np * sizeof *pieces);
        piece_weights(pieces, np, nin, dtype, w, a.inl_w, a.inl_wide);
    } else {
        /* One upload: the pieces, each piece's weights, each piece's wide flag. */
        size_t pieces_bytes = np * sizeof *pieces, w_bytes = np * (size_t)nin * sizeof(double);
        size_t bytes = pieces_bytes + w_bytes + np;
        st = sumo_cuda__stage_take(k, bytes);
        host = st ? st->mem : malloc(bytes);
        if (host == NULL) r = SUMO_ERR_SYSTEM;
        if (r == SUMO_SUCCESS) {
            memcpy(host, pieces, pieces_bytes);
            piece_weights(pieces, np, nin, dtype, w, (double *)(void *)(host + pieces_bytes),
                          host + pieces_bytes + w_bytes);
            r = scratch_alloc(k, bytes, s, (void **)&scratch);
        }
        if (r == SUMO_SUCCESS) r = upload(k, scratch, host, bytes, s);
        a.pieces = (const sumo_cuda__piece *)(const void *)scratch;
        a.w = (const double *)(const void *)(scratch + pieces_bytes);
        a.wide = scratch + pieces_bytes + w_bytes;
    }
    if (r == SUMO_SUCCESS) {
        if (k->emulated) sumo_cuda__wsum_emulate(&a);
        else r = launched(sumo_cuda__wsum_launch(&a, s), "weighted-sum kernel");
    }
    scratch_free(k, scratch, s);
    if (r == SUMO_SUCCESS) r = finish(k, s);
    /* A pinned block goes back only after the wait: its upload may still be reading it. */
    if (st) sumo_cuda__stage_give_after(k, st, r, s);
    else free(host);
    free(heap);
    return r;
}

/* ---- the device combine: partials, weights, weighted sum, one wait ------------------------- */

/* Bytes rounded up to 64, for the parts of one scratch block. */
static size_t up64(size_t v) { return (v + 63) / 64 * 64; }

sumo_result sumo_cuda__combine(sumo_cuda_kernels *k, void *exec, sumo_dtype dtype,
                               void *const *outs, int nout, const void *const *ins, int nin,
                               const size_t *offsets, size_t ntensors,
                               const sumo_cuda__combine_params *prm, unsigned char *flags,
                               bool *applied)
{
    *applied = false;
    if (!dtype_ok(dtype) || nin < 1 || nin > SUMO_CUDA__MAX_IN || nout < 1 ||
        nout > SUMO_CUDA__MAX_IN || offsets == NULL || (ntensors > 0 && offsets[0] != 0))
        return SUMO_ERR_INVALID_ARGUMENT;
    if (flags) memset(flags, 0, ntensors);
    const size_t hi = ntensors ? offsets[ntensors] : 0;
    if (hi == 0) {
        *applied = true; /* nothing to weigh: every (empty) tensor's weights are accepted */
        return SUMO_SUCCESS;
    }
    cudaStream_t s = exec;
    ENTER(k);
    /* The whole range: one piece per non-empty tensor, in both plans (their chunks may differ,
     * their pieces do not), so piece p's weights are its tensor's in both kernels. */
    sumo_cuda__piece gl[SUMO_CUDA__INLINE_PIECES], wl[SUMO_CUDA__INLINE_PIECES];
    sumo_cuda__piece *gp, *wp, *gheap, *wheap = NULL;
    size_t np, gitems, wnp = 0, witems = 0, L = sumo_cuda__gram_len(nin);
    sumo_result r = plan_some(offsets, ntensors, 0, hi, sumo_cuda__gram_chunk(dtype), gl, &gp,
                              &gheap, &np, &gitems);
    if (r == SUMO_SUCCESS)
        r = plan_some(offsets, ntensors, 0, hi, sumo_cuda__wsum_chunk(dtype), wl, &wp, &wheap,
                      &wnp, &witems);
    if (r == SUMO_SUCCESS && wnp != np) r = SUMO_ERR_INTERNAL;
    if (r != SUMO_SUCCESS) {
        free(gheap);
        free(wheap);
        LEAVE(r);
    }
    const bool far = np > SUMO_CUDA__INLINE_PIECES;
    const size_t pb = far ? up64(np * sizeof(sumo_cuda__piece)) : 0;
    /* Device scratch: [gram pieces][wsum pieces][partials][totals][w][wide][flags][accept]. */
    const size_t o_wp = pb, o_part = o_wp + pb, o_tot = o_part + up64(gitems * L * sizeof(double));
    const size_t o_w = o_tot + up64(np * L * sizeof(double));
    const size_t o_wide = o_w + up64(np * (size_t)nin * sizeof(double));
    const size_t o_flags = o_wide + up64(np), o_accept = o_flags + up64(np);
    const size_t dev_bytes = o_accept + 64;
    /* Host side: both pieces' arrays up, the flags and the accept word down. */
    const size_t h_flags = 2 * pb, h_accept = h_flags + up64(np), host_bytes = h_accept + 64;
    struct sumo_cuda__stage *st = sumo_cuda__stage_take(k, host_bytes);
    unsigned char *host = st ? st->mem : malloc(host_bytes), *dev = NULL;
    if (host == NULL) r = SUMO_ERR_SYSTEM;
    if (r == SUMO_SUCCESS) r = scratch_alloc(k, dev_bytes, s, (void **)&dev);
    sumo_cuda__gram_args ga = {.dtype = dtype, .nin = nin, .npieces = np, .nitems = gitems};
    sumo_cuda__weights_args wa = {.nin = nin, .group_size = prm->group_size, .need = prm->need,
                                  .gram_err = prm->gram_err,
                                  .narrow = dtype == SUMO_FLOAT16 || dtype == SUMO_BFLOAT16,
                                  .npieces = np};
    sumo_cuda__wsum_args sa = {.dtype = dtype, .nin = nin, .nout = nout, .npieces = np,
                               .nitems = witems};
    if (r == SUMO_SUCCESS) {
        for (int i = 0; i < nin; i++) ga.ins[i] = sa.ins[i] = ins[i];
        for (int o = 0; o < nout; o++) sa.outs[o] = outs[o];
        if (far) {
            memcpy(host, gp, np * sizeof *gp);
            memcpy(host + pb, wp, np * sizeof *wp);
            ga.pieces = (const sumo_cuda__piece *)(const void *)dev;
            sa.pieces = (const sumo_cuda__piece *)(const void *)(dev + o_wp);
            r = upload(k, dev, host, 2 * pb, s);
        } else {
            memcpy(ga.inl, gp, np * sizeof *gp);
            memcpy(sa.inl, wp, np * sizeof *wp);
        }
        ga.partials = (double *)(void *)(dev + o_part);
        ga.totals = (double *)(void *)(dev + o_tot);
        wa.totals = ga.totals;
        wa.w = (double *)(void *)(dev + o_w);
        wa.wide = dev + o_wide;
        wa.flags = dev + o_flags;
        wa.accept = (unsigned int *)(void *)(dev + o_accept);
        sa.w = wa.w;
        sa.wide = wa.wide;
        sa.accept = wa.accept;
    }
    /* Three kernels in stream order, no wait between: the weights read the totals, the
     * weighted sum reads the weights and the accept word, and does nothing when declined. */
    if (r == SUMO_SUCCESS) {
        if (k->emulated) sumo_cuda__gram_emulate(&ga);
        else r = launched(sumo_cuda__gram_launch(&ga, s), "Gram partials kernel");
    }
    if (r == SUMO_SUCCESS) {
        if (k->emulated) sumo_cuda__weights_emulate(&wa);
        else r = launched(sumo_cuda__weights_launch(&wa, s), "Adasum weights kernel");
    }
    if (r == SUMO_SUCCESS) {
        if (k->emulated) sumo_cuda__wsum_emulate(&sa);
        else r = launched(sumo_cuda__wsum_launch(&sa, s), "weighted-sum kernel");
    }
    /* The flags and the accept word are adjacent in both memories: one copy down. */
    if (r == SUMO_SUCCESS)
        r = download(k, host + h_flags, dev + o_flags, o_accept - o_flags + sizeof(unsigned int), s);
    scratch_free(k, dev, s);
    if (r == SUMO_SUCCESS) r = finish(k, s);
    if (r == SUMO_SUCCESS) {
        unsigned int acc;
        memcpy(&acc, host + h_flags + (o_accept - o_flags), sizeof acc);
        *applied = acc != 0;
        if (flags)
            for (size_t p = 0; p < np; p++) flags[gp[p].tensor] = host[h_flags + p];
    }
    if (st) sumo_cuda__stage_give_after(k, st, r, s);
    else free(host);
    free(gheap);
    free(wheap);
    LEAVE(r);
}

static sumo_result k_weighted_sum(void *ctx, void *exec, sumo_dtype dtype, void *const *outs,
                                  int nout, const void *const *ins, int nin,
                                  const size_t *offsets, size_t ntensors, size_t lo, size_t hi,
                                  const double *w)
{
    sumo_cuda_kernels *k = of(ctx);
    if (!dtype_ok(dtype) || nin < 1 || nin > SUMO_CUDA__MAX_IN || nout < 1 ||
        nout > SUMO_CUDA__MAX_IN)
        return SUMO_ERR_INVALID_ARGUMENT;
    if (hi <= lo) return SUMO_SUCCESS;
    ENTER(k);
    LEAVE(wsum_body(k, exec, dtype, outs, nout, ins, nin, offsets, ntensors, lo, hi, w));
}

static sumo_result k_delta(void *ctx, void *exec, sumo_dtype dtype, void *delta, const void *now,
                           const void *start, size_t n)
{
    sumo_cuda_kernels *k = of(ctx);
    if (!dtype_ok(dtype)) return SUMO_ERR_INVALID_ARGUMENT;
    if (n == 0) return SUMO_SUCCESS;
    sumo_cuda__ew_args a = {.op = SUMO_CUDA__EW_DELTA, .dtype = dtype, .n = n, .dst = delta,
                            .a = now, .b = start};
    ENTER(k);
    LEAVE(ew_body(k, exec, &a, NULL));
}

static sumo_result k_apply_delta(void *ctx, void *exec, sumo_dtype dtype, void *params,
                                 const void *start, const void *delta, size_t n, size_t *first)
{
    sumo_cuda_kernels *k = of(ctx);
    *first = SIZE_MAX;
    if (!dtype_ok(dtype)) return SUMO_ERR_INVALID_ARGUMENT;
    if (n == 0) return SUMO_SUCCESS;
    sumo_cuda__ew_args a = {.op = SUMO_CUDA__EW_APPLY, .dtype = dtype, .n = n, .dst = params,
                            .a = start, .b = delta};
    ENTER(k);
    LEAVE(ew_body(k, exec, &a, first));
}

static sumo_result k_outer_update(void *ctx, void *exec, sumo_dtype dtype, void *x, const void *c,
                                  void *v, void *x0, size_t n, const sumo_outer_step *st)
{
    sumo_cuda_kernels *k = of(ctx);
    /* fp32 and fp64, as the host table. */
    if (dtype != SUMO_FLOAT32 && dtype != SUMO_FLOAT64) return SUMO_ERR_INVALID_ARGUMENT;
    if (n == 0) return SUMO_SUCCESS;
    sumo_cuda__ew_args a = {.op = SUMO_CUDA__EW_OUTER, .dtype = dtype, .n = n, .dst = x, .a = c,
                            .c = v, .d = x0, .gamma = st->gamma, .lr = st->lr, .mu = st->mu,
                            .merge = st->merge, .nesterov = st->nesterov,
                            .from_average = st->from_average};
    ENTER(k);
    LEAVE(ew_body(k, exec, &a, NULL));
}

/* The codec's checks: the host table's, the formats and block sizes codec.h defines. */
static bool codec_ok(sumo_compression_format format, size_t block)
{
    sumo__qformat q;
    return sumo__qformat_of(format, &q) && sumo__qblock_valid(block);
}

static sumo_result k_quantize(void *ctx, void *exec, sumo_compression_format format, size_t block,
                              void *dst, const float *src, size_t n, size_t *first)
{
    sumo_cuda_kernels *k = of(ctx);
    *first = SIZE_MAX;
    if (!codec_ok(format, block)) return SUMO_ERR_INVALID_ARGUMENT;
    if (n == 0) return SUMO_SUCCESS;
    ENTER(k);
    unsigned long long *dfirst = NULL, hfirst = ~0ull;
    sumo_result r = scratch_alloc(k, sizeof *dfirst, exec, (void **)&dfirst);
    if (r == SUMO_SUCCESS) r = upload(k, dfirst, &hfirst, sizeof hfirst, exec);
    sumo_cuda__q_args a = {.format = (int)format, .block = block, .n = n, .payload = dst,
                           .src = src, .first = dfirst};
    if (r == SUMO_SUCCESS) {
        if (k->emulated) sumo_cuda__quantize_emulate(&a);
        else r = launched(sumo_cuda__quantize_launch(&a, exec), "quantize kernel");
    }
    if (r == SUMO_SUCCESS) r = download(k, &hfirst, dfirst, sizeof hfirst, exec);
    scratch_free(k, dfirst, exec);
    if (r == SUMO_SUCCESS) r = finish(k, exec);
    *first = hfirst == ~0ull ? SIZE_MAX : (size_t)hfirst;
    LEAVE(r);
}

static sumo_result k_dequantize(void *ctx, void *exec, sumo_compression_format format,
                                size_t block, float *dst, const void *src, size_t n)
{
    sumo_cuda_kernels *k = of(ctx);
    if (!codec_ok(format, block)) return SUMO_ERR_INVALID_ARGUMENT;
    if (n == 0) return SUMO_SUCCESS;
    ENTER(k);
    sumo_cuda__q_args a = {.format = (int)format, .block = block, .n = n,
                           .payload = (void *)(uintptr_t)src, .dst = dst};
    sumo_result r = SUMO_SUCCESS;
    if (k->emulated) sumo_cuda__dequantize_emulate(&a);
    else r = launched(sumo_cuda__dequantize_launch(&a, exec), "dequantize kernel");
    if (r == SUMO_SUCCESS) r = finish(k, exec);
    LEAVE(r);
}

/* ---- the table --------------------------------------------------------------------------- */

void sumo_cuda__fill_table(sumo_cuda_kernels *k)
{
    k->table = (sumo_kernel_table){
        .struct_size = sizeof(sumo_kernel_table),
        .memory = MEMORY_NAME,
        .ctx = k,
        .claims = k_claims,
        .alloc = k_alloc,
        .release = k_release,
        .synchronize = k_synchronize,
        .copy = k_copy,
        .fill = k_fill,
        .first_nonfinite = k_first_nonfinite,
        .reduce = k_reduce,
        .convert = k_convert,
        .dot_norms = k_dot_norms,
        .scaled_add = k_scaled_add,
        .gram_partials = k_gram_partials,
        .weighted_sum = k_weighted_sum,
        .delta = k_delta,
        .apply_delta = k_apply_delta,
        .quantize = k_quantize,
        .dequantize = k_dequantize,
        .outer_update = k_outer_update,
    };
    sumo_cuda__fill_ipc(k);
}
