#include "bench_sweep.h"

#include "bench_reference.h"
#include "sumo_aggregation.h"

#ifdef SUMO_HAVE_MPI
#include <mpi.h>
#endif

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

/* ---- one call ----------------------------------------------------------------------------- */

typedef struct coll_call {
    void *buf;
    void *out; /* the result's buffer (--shared-outputs); NULL: in place in buf */
    size_t count;
    sumo_dtype dtype;
    int op;
    bool peer;             /* MPI_Allreduce instead of sumo */
    size_t ntensors;       /* adasum: the layout's tensors (--tensors; > 1: op is `layout`) */
    sumo_op layout;
    sumo_aggregator *acga; /* op BENCH_OP_ACGA */
} coll_call;

static void *result_of(const coll_call *c)
{
    return c->out ? c->out : c->buf;
}

static int call_collective(bench_group *g, void *arg)
{
    coll_call *c = arg;
    if (c->op == BENCH_OP_ACGA)
        return (int)sumo_aggregator_apply_into(c->acga, c->buf, result_of(c), c->count, c->dtype);
    if (!c->peer)
        return (int)sumo_allreduce(c->buf, result_of(c), c->count, c->dtype,
                                   c->ntensors > 1 ? c->layout : (sumo_op)c->op, g->comm);
#ifdef SUMO_HAVE_MPI
    MPI_Datatype t = c->dtype == SUMO_FLOAT64 ? MPI_DOUBLE : MPI_FLOAT;
    int r = MPI_Allreduce(MPI_IN_PLACE, c->buf, (int)c->count, t, MPI_SUM, MPI_COMM_WORLD);
    return r == MPI_SUCCESS ? 0 : (int)SUMO_ERR_INTERNAL;
#else
    return (int)SUMO_ERR_INVALID_USAGE;
#endif
}

static bench_timed timed_call(bench_group *g, coll_call *call)
{
    return (bench_timed){.active = g->size, .from_last_start = true, .fn = call_collective,
                         .arg = call};
}

/* Warm-up, then the timed iterations; median and minimum in microseconds. */
static int measure_collective(bench_group *g, const bench_opts *o, coll_call *call,
                              double *med_us, double *min_us)
{
    bench_timed run = timed_call(g, call);
    int st = 0;
    if (o->warmup > 0) st = bench_time_runs(g, &run, o->warmup, g->durations);
    if (st == 0) st = bench_time_runs(g, &run, o->iters, g->durations);
    double mn = NAN, med = st == 0 ? bench_median(g->durations, o->iters, &mn) : NAN;
    *med_us = med / 1e3;
    *min_us = mn / 1e3;
    return st;
}

/* One allreduce on fresh data, then the reference on the printing rank and a hash on all. */
static int check_collective(bench_group *g, const bench_report *rep, coll_call *call, char *why,
                            size_t whylen)
{
    bench_fill(call->dtype, call->buf, 0, call->count, g->rank);
    double v[3] = {(double)call_collective(g, call), 0, 0};
    void *res = result_of(call);
    double h = bench_hash(res, call->count * bench_dtype_bytes(call->dtype));
    /* max(h) == -max(-h) exactly when every rank holds the same h. */
    v[1] = h;
    v[2] = -h;
    g->max(g, v, 3);
    if (v[0] != 0) return BENCH_CHECK_NONE; /* the timed run reports the failure */
    if (!rep->printer || g->rank != 0) return BENCH_CHECK_NONE;
    if (v[1] != -v[2]) {
        snprintf(why, whylen, "ranks ended with different bits");
        return BENCH_CHECK_FAIL;
    }
    if (call->op == SUMO_OP_ADASUM)
        return bench_check_adasum(call->dtype, g->size, res, call->count, call->ntensors, why,
                                  whylen);
    if (call->op == BENCH_OP_ACGA) {
        snprintf(why, whylen,
                 "acga: ranks agree bit for bit; its values are checked by test_acga_*");
        return BENCH_CHECK_NA;
    }
    return bench_check_sum(call->dtype, call->op, g->size, res, call->count, why, whylen);
}

static bool breaks_comm(int status)
{
    return status == SUMO_ERR_TIMEOUT || status == SUMO_ERR_PEER_FAILURE || status == SUMO_ERR_INTERNAL;
}

/* ---- the sweep ---------------------------------------------------------------------------- */

typedef struct sweep_state {
    bench_report *rep;
    void *buf, *out; /* out: --shared-outputs only */
    bool told[BENCH_NOPS]; /* the library's detail is printed on an op's first failure only */
} sweep_state;

/* MPI_Allreduce at this size, the reference every op's row is printed against. */
static void measure_peer(bench_group *g, sweep_state *s, bench_row *base)
{
    const bench_opts *o = s->rep->o;
    size_t count = base->bytes / bench_dtype_bytes(o->dtype);
    if (!s->rep->peer || count > (size_t)INT32_MAX) return;
    coll_call peer = {.buf = s->buf, .count = count, .dtype = o->dtype, .op = SUMO_OP_SUM,
                      .peer = true};
    bench_fill(o->dtype, s->buf, 0, count, g->rank);
    int st = measure_collective(g, o, &peer, &base->peer_med_us, &base->peer_min_us);
    base->has_peer = st == 0;
}

/* One op at one size: checked (--check), then timed on fresh data, then printed. */
static void measure_op(bench_group *g, sweep_state *s, bench_row *r)
{
    const bench_opts *o = s->rep->o;
    size_t count = r->bytes / bench_dtype_bytes(o->dtype);
    coll_call call = {.buf = s->buf, .out = s->out, .count = count, .dtype = o->dtype,
                      .op = r->op};
    char why[256] = "";
    if (r->op == SUMO_OP_ADASUM && o->tensors > 1) {
        /* The layout is the call's: made per row, since the count changes. */
        size_t *counts = malloc(o->tensors * sizeof *counts);
        if (counts == NULL) r->status = SUMO_ERR_SYSTEM;
        for (size_t t = 0; counts && t < o->tensors; t++)
            counts[t] = bench_tensor_count(count, o->tensors, t);
        sumo_adasum_options ao;
        sumo_adasum_options_default(&ao);
        ao.tensor_counts = counts;
        ao.ntensors = o->tensors;
        if (r->status == 0) r->status = sumo_op_create_adasum(g->comm, &ao, &call.layout);
        free(counts);
        if (r->status == 0) call.ntensors = o->tensors;
    }
    if (r->op == BENCH_OP_ACGA) {
        sumo_aggregator_options acga_opts;
        sumo_aggregator_options_default(SUMO_AGGREGATE_ACGA, &acga_opts);
        r->status = sumo_aggregator_create(g->comm, &acga_opts, &call.acga);
    }
    if (r->status == 0 && o->check) r->check = check_collective(g, s->rep, &call, why, sizeof why);
    bench_fill(o->dtype, s->buf, 0, count, g->rank);
    if (r->status == 0) r->status = measure_collective(g, o, &call, &r->med_us, &r->min_us);
    sumo_aggregator_destroy(call.acga);
    if (call.ntensors > 1) sumo_op_destroy(g->comm, call.layout);
    const char *detail = NULL;
    if (r->status != 0 && g->comm) sumo_comm_error_message(g->comm, &detail);
    if (!s->rep->printer || g->rank != 0) return;
    bench_report_row(s->rep, r, r->status != 0 && !s->told[r->op] ? detail : NULL, why);
    if (r->status != 0) s->told[r->op] = true;
}

/* A buffer of the largest size on every member, or 1 on all when one could not. Shared, it
 * comes from sumo_mem_alloc (collective: every member calls it). */
static int alloc_buffer(bench_group *g, bool shared, size_t max_bytes, void **buf)
{
    *buf = NULL;
    if (shared && g->comm) {
        sumo_result r = sumo_mem_alloc(g->comm, max_bytes, buf);
        if (r != SUMO_SUCCESS) {
            const char *detail = "";
            sumo_comm_error_message(g->comm, &detail);
            if (g->rank == 0) fprintf(stderr, "sumo bench: sumo_mem_alloc: %s\n", detail);
            return 1;
        }
        return 0;
    }
    *buf = aligned_alloc(4096, (max_bytes + 4095) / 4096 * 4096);
    double failed = *buf == NULL;
    g->max(g, &failed, 1);
    if (failed == 0) return 0;
    if (*buf == NULL)
        fprintf(stderr, "sumo bench: rank %d: cannot allocate %zu bytes\n", g->rank, max_bytes);
    free(*buf);
    return 1;
}

static void free_buffer(bench_group *g, bool shared, void *buf)
{
    if (buf == NULL) return;
    if (shared && g->comm) sumo_mem_free(g->comm, buf);
    else free(buf);
}

/* The input buffer, and with --shared-outputs the output buffer (else NULL); 1 on failure,
 * nothing allocated. */
static int alloc_buffers(bench_group *g, const bench_opts *o, size_t max_bytes, void **buf,
                         void **out)
{
    *out = NULL;
    if (alloc_buffer(g, o->shared_buffers, max_bytes, buf) != 0) return 1;
    if (!o->shared_outputs || alloc_buffer(g, true, max_bytes, out) == 0) return 0;
    free_buffer(g, o->shared_buffers, *buf);
    return 1;
}

static void free_buffers(bench_group *g, const bench_opts *o, void *buf, void *out)
{
    free_buffer(g, o->shared_buffers, buf);
    free_buffer(g, true, out);
}

int bench_sweep_body(bench_group *g, void *report)
{
    sweep_state s = {.rep = report};
    const bench_opts *o = s.rep->o;
    if (alloc_buffers(g, o, s.rep->sizes[s.rep->nsizes - 1], &s.buf, &s.out) != 0) return 1;
    if (s.rep->printer && g->rank == 0) bench_print_table_header(s.rep, g->size);
    for (int si = 0; si < s.rep->nsizes; si++) {
        bench_row base = {.ranks = g->size, .bytes = s.rep->sizes[si]};
        measure_peer(g, &s, &base);
        for (int oi = 0; oi < o->nops; oi++) {
            bench_row r = base;
            r.op = o->ops[oi];
            measure_op(g, &s, &r);
            if (!breaks_comm(r.status) || g->renew == NULL) continue;
            /* Shared buffers belong to the broken communicator. */
            bool any_shared = o->shared_buffers || o->shared_outputs;
            sumo_result rr = any_shared ? SUMO_ERR_INVALID_USAGE : g->renew(g);
            if (rr != SUMO_SUCCESS) {
                if (s.rep->printer && g->rank == 0)
                    printf("# cannot replace the broken communicator: %s\n", sumo_result_name(rr));
                if (!o->shared_buffers) free(s.buf);
                return 1;
            }
        }
    }
    free_buffers(g, o, s.buf, s.out);
    return 0;
}

/* ---- the floor ---------------------------------------------------------------------------- */

int bench_floor_body(bench_group *g, void *floor)
{
    bench_floor *f = floor;
    const bench_opts *o = f->o;
    void *buf, *out;
    if (alloc_buffers(g, o, f->bytes, &buf, &out) != 0) return 1;
    size_t count = f->bytes / bench_dtype_bytes(o->dtype);
    bench_fill(o->dtype, buf, 0, count, g->rank);
    coll_call call = {.buf = buf, .out = out, .count = count, .dtype = o->dtype,
                      .op = SUMO_OP_SUM};
    bench_job add = bench_stream_add_job(f->ma, g->size);
    bench_job_fill_part(&add, g->rank, 7 * g->rank);
    bench_timed sum_run = timed_call(g, &call);
    bench_timed add_run = {.active = add.active, .from_last_start = false,
                           .fn = bench_job_run_part, .arg = &add};
    double t_sum, t_add;
    bench_time_alternating(g, o->iters, &sum_run, &t_sum, &add_run, &t_add);
    if (g->rank == 0) {
        f->us = t_sum / 1e3;
        f->bw = add.bytes / t_add;
    }
    free_buffers(g, o, buf, out);
    return 0;
}

void bench_record_floor(bench_mem_results *m, int p, const bench_floor *f)
{
    if (m->nf == BENCH_MAX_RANK_LIST) return;
    m->f_bytes = f->bytes;
    m->franks[m->nf] = p;
    m->f_us[m->nf] = f->us;
    m->f_bw[m->nf++] = f->bw;
}
