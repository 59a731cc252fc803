#include "bench_report.h"

#include "bench_reference.h"
#include "machine.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- CSV ---------------------------------------------------------------------------------- */

int bench_report_open_csv(bench_report *rep)
{
    if (rep->o->csv_path == NULL || !rep->printer) return 0;
    rep->csv = fopen(rep->o->csv_path, "w");
    if (rep->csv == NULL) {
        fprintf(stderr, "sumo bench: cannot write %s: %s\n", rep->o->csv_path, strerror(errno));
        return -1;
    }
    fprintf(rep->csv, "section,transport,ranks,dtype,op,bytes,count,time_us,min_us,gbps,busbw_gbps,"
                      "ref_us,ratio,check,status\n");
    return 0;
}

void bench_report_close(bench_report *rep)
{
    if (rep->csv) fclose(rep->csv);
    rep->csv = NULL;
    free(rep->rows);
    rep->rows = NULL;
    rep->nrows = rep->cap = 0;
}

/* One CSV row's values after section, transport and ranks; the columns are described in the
 * usage text. */
typedef struct csv_values {
    const char *dtype, *op;
    double bytes;
    size_t count;
    double us, min_us, gbps, busbw, ref_us, ratio;
    const char *check, *status;
} csv_values;

static void csv_row(const bench_report *rep, const char *section, int ranks, const csv_values *v)
{
    if (rep->csv == NULL) return;
    fprintf(rep->csv, "%s,%s,%d,%s,%s,%.0f,%zu,%.3f,%.3f,%.4f,%.4f,%.3f,%.4f,%s,%s\n", section,
            rep->transport, ranks, v->dtype, v->op, v->bytes, v->count, v->us, v->min_us, v->gbps,
            v->busbw, v->ref_us, v->ratio, v->check, v->status);
}

/* The goals of docs/design/experiments.md are judged in a full run only: --quick is the test
 * suite's check that the benchmark works, and its few iterations on small arrays (on a machine
 * busy with other tests) say nothing about a goal, so a "NOT met" there would only mislead a
 * reader of the test log. The figures themselves are still printed. */
static bool judged(const bench_report *rep)
{
    return !rep->o->quick;
}

/* A row of the memory or floor sections: no minimum, no bus bandwidth, no check. */
static csv_values bandwidth_values(const char *dtype, const char *op, double bytes, size_t count,
                                   double us, double gbps, double ref_us, double ratio)
{
    return (csv_values){.dtype = dtype, .op = op, .bytes = bytes, .count = count, .us = us,
                        .min_us = NAN, .gbps = gbps, .busbw = NAN, .ref_us = ref_us,
                        .ratio = ratio, .check = "-", .status = "SUMO_SUCCESS"};
}

/* ---- the header ---------------------------------------------------------------------------- */

static void cpu_model(char *model, size_t len)
{
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (f == NULL) return;
    char line[512];
    while (fgets(line, sizeof line, f))
        if (strncmp(line, "model name", 10) == 0) {
            const char *p = strchr(line, ':');
            if (p) {
                snprintf(model, len, "%s", p + 2);
                model[strcspn(model, "\n")] = '\0';
            }
            break;
        }
    fclose(f);
}

static void print_transport(const bench_report *rep)
{
    const bench_opts *o = rep->o;
    printf("# transport: %s", rep->transport);
    if (o->transport == BENCH_TRANSPORT_THREADS) {
        printf(", P =");
        for (int i = 0; i < o->nranks; i++) printf("%s%d", i ? "," : " ", o->ranks[i]);
        printf(", threads %s\n", o->pin ? "pinned one per cpu (round robin)" : "not pinned");
    } else {
        const char *shm;
        sumo_setting("SUMO_MPI_SHM", &shm); /* the communicator refused it already if malformed */
        printf(", P = %d on %d machine(s), SUMO_MPI_SHM=%s\n", rep->world_size, rep->nodes,
               shm ? shm : "(malformed)");
    }
}

void bench_print_machine(const bench_report *rep)
{
    char host[256] = "?", model[256] = "?";
    gethostname(host, sizeof host - 1);
    cpu_model(model, sizeof model);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    double mem_gib = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE) / (1 << 30);
    const bench_opts *o = rep->o;
    printf("# sumo bench (sumo %d.%d.%d)\n", SUMO_VERSION_MAJOR, SUMO_VERSION_MINOR, SUMO_VERSION_PATCH);
    printf("# machine: %s, %s, %ld cpus, %.1f GiB\n", host, model, cores, mem_gib);
    /* What the CPU offers decides it: machine.h follows the library's dispatch rule. */
    printf("# kernels: %s (sumo dispatches on the CPU's instruction set)\n", sumo_tool_kernel_isa());
    print_transport(rep);
    printf("# dtype: %s, ops:", sumo_dtype_name(o->dtype));
    for (int i = 0; i < o->nops; i++) printf("%s%s", i ? "," : " ", bench_op_label(o->ops[i]));
    if (o->tensors > 1) printf(" (adasum: %zu tensors a call)", o->tensors);
    printf(", sizes %zu to %zu B (x%g)%s\n", rep->sizes[0], rep->sizes[rep->nsizes - 1], o->step,
           o->check ? ", results checked" : "");
    fflush(stdout);
}

void bench_print_mpi(const bench_report *rep, const char *version, int provided, int wanted,
                     int ranks_on_node)
{
    printf("# mpi: %s; thread level %d of %d; %d rank(s) per machine\n", version, provided, wanted,
           ranks_on_node);
    if (rep->o->ranks_set) printf("# (--ranks is for the threads transport; P is mpirun's -np)\n");
    fflush(stdout);
}

/* ---- memory -------------------------------------------------------------------------------- */

void bench_print_stream(const bench_report *rep, const bench_mem_results *m)
{
    const bench_opts *o = rep->o;
    printf("#\n# memory bandwidth: STREAM-like %s loops over fp64 arrays of %zu MiB, median of %d "
           "(bytes counted as STREAM does: no write-allocate); each %s on its own part\n",
           bench_stream_isa(), o->mem_bytes / BENCH_MIB, o->mem_reps,
           o->transport == BENCH_TRANSPORT_THREADS ? "thread" : "rank of this machine");
    printf("#%9s", "threads");
    for (int k = 0; k < BENCH_NSTREAM; k++) printf(" %9s(GB/s)", bench_stream_name(k));
    printf("\n");
    for (int i = 0; i < m->nt; i++) {
        printf("#%9d", m->threads[i]);
        for (int k = 0; k < BENCH_NSTREAM; k++) {
            printf(" %15.2f", m->stream[i][k]);
            double bytes = (double)bench_stream_passes(k) * (double)o->mem_bytes;
            csv_values v = bandwidth_values("fp64", bench_stream_name(k), bytes, 0, NAN,
                                            m->stream[i][k], NAN, NAN);
            csv_row(rep, "memory", m->threads[i], &v);
        }
        printf("\n");
    }
    fflush(stdout);
}

/* ---- the allreduce table ------------------------------------------------------------------- */

void bench_print_table_header(const bench_report *rep, int p)
{
    const bench_opts *o = rep->o;
    printf("#\n# allreduce, transport %s, P = %d, dtype %s, in place, algorithm %s\n"
           "# time = median of %d iterations after %d warm-up, from the last rank's start to the "
           "last rank's end%s\n",
           rep->transport, p, sumo_dtype_name(o->dtype), bench_algo_name(o->algo), o->iters,
           o->warmup,
           rep->nodes > 1 ? " (ranks on several machines: largest per-rank time instead)" : "");
    if (rep->peer)
        printf("# peer = MPI_Allreduce(MPI_IN_PLACE, MPI_SUM) on the same buffers (also for avg, "
               "which MPI lacks, and adasum); ratio = sumo time / peer time\n");
    printf("#\n#%11s %12s %6s %7s %11s %11s %12s %12s %6s", "size(B)", "count", "type", "redop",
           "time(us)", "min(us)", "algbw(GB/s)", "busbw(GB/s)", "check");
    if (rep->peer) printf(" %11s %7s", "peer(us)", "ratio");
    printf("\n");
    fflush(stdout);
}

static void print_row(const bench_report *rep, const bench_row *r, const char *err_detail)
{
    const bench_opts *o = rep->o;
    const char *dt = sumo_dtype_name(o->dtype), *check = bench_verdict_name(r->check);
    size_t count = r->bytes / bench_dtype_bytes(o->dtype);
    char peer[32] = "-", ratio[32] = "-";
    if (r->has_peer) {
        snprintf(peer, sizeof peer, "%.2f", r->peer_med_us);
        if (r->status == 0) snprintf(ratio, sizeof ratio, "%.3f", r->med_us / r->peer_med_us);
    }
    double algbw = r->bytes / (r->med_us * 1e3);
    double busbw = algbw * 2.0 * (r->ranks - 1) / r->ranks;
    if (r->status == 0)
        printf("%12zu %12zu %6s %7s %11.2f %11.2f %12.3f %12.3f %6s", r->bytes, count, dt,
               bench_op_label(r->op), r->med_us, r->min_us, algbw, busbw, check);
    else
        printf("%12zu %12zu %6s %7s %11s %11s %12s %12s %6s", r->bytes, count, dt,
               bench_op_label(r->op), "n/a", "n/a", "n/a", "n/a", check);
    if (rep->peer) printf(" %11s %7s", peer, ratio);
    if (r->status != 0)
        printf("  # %s%s%s", sumo_result_name((sumo_result)r->status),
               err_detail && *err_detail ? ": " : "", err_detail ? err_detail : "");
    printf("\n");
    fflush(stdout);
    bool ran = r->status == 0;
    csv_values v = {.dtype = dt, .op = bench_op_label(r->op), .bytes = (double)r->bytes,
                    .count = count, .us = ran ? r->med_us : NAN, .min_us = ran ? r->min_us : NAN,
                    .gbps = ran ? algbw : NAN, .busbw = ran ? busbw : NAN,
                    .ref_us = r->has_peer ? r->peer_med_us : NAN,
                    .ratio = r->has_peer && ran ? r->med_us / r->peer_med_us : NAN,
                    .check = check, .status = sumo_result_name((sumo_result)r->status)};
    csv_row(rep, "allreduce", r->ranks, &v);
}

static void keep_row(bench_report *rep, const bench_row *r)
{
    if (rep->nrows == rep->cap) {
        size_t cap = rep->cap ? 2 * rep->cap : 64;
        bench_row *p = realloc(rep->rows, cap * sizeof *p);
        if (p == NULL) return; /* the row is printed; only the derived figures lose it */
        rep->rows = p;
        rep->cap = cap;
    }
    rep->rows[rep->nrows++] = *r;
}

void bench_report_row(bench_report *rep, const bench_row *r, const char *err_detail,
                      const char *why)
{
    print_row(rep, r, err_detail);
    if (r->check == BENCH_CHECK_FAIL || r->check == BENCH_CHECK_NA)
        printf("#   check %s: %s\n", bench_verdict_name(r->check), why);
    /* An op the library refuses is reported, not a failure of the run. */
    bool refused = r->status == SUMO_ERR_INVALID_ARGUMENT || r->status == SUMO_ERR_INVALID_USAGE;
    bool optional = r->op == SUMO_OP_ADASUM || r->op == BENCH_OP_ACGA;
    if (r->check == BENCH_CHECK_FAIL || (r->status != 0 && !(refused && optional))) rep->failures++;
    keep_row(rep, r);
}

static const bench_row *find_row(const bench_report *rep, int ranks, size_t bytes, int op)
{
    for (size_t i = 0; i < rep->nrows; i++)
        if (rep->rows[i].ranks == ranks && rep->rows[i].bytes == bytes && rep->rows[i].op == op)
            return &rep->rows[i];
    return NULL;
}

/* ---- derived figures ----------------------------------------------------------------------- */

/* The floor measured with p ranks, or NULL. */
static int floor_index(const bench_mem_results *m, int p)
{
    for (int i = 0; i < m->nf; i++)
        if (m->franks[i] == p) return i;
    return -1;
}

/* Microseconds to move `passes` x P x S bytes at the P-worker a+=b bandwidth of floor fi. */
static double floor_us(const bench_mem_results *m, int fi, int passes)
{
    return passes * (double)m->franks[fi] * (double)m->f_bytes / m->f_bw[fi] / 1e3;
}

/*
 * The floors of an in-place allreduce on shared memory, P buffers of S bytes, at the
 * bandwidth of a+=b with P workers measured in alternation with the sum:
 *   the sum's: each buffer read once and written once, 2 P S bytes;
 *   the two-pass floor of Adasum and ACGA in Gram form: each input read twice (the Gram
 *   partials, then the weighted sum) and each output written once, 3 P S bytes, 1.5 x the
 *   sum's. That, not the sum's own time, is what their form can at best reach here.
 */
static void print_floors(const bench_report *rep, const bench_mem_results *m, int p)
{
    int fi = floor_index(m, p);
    if (fi < 0) return;
    const bench_opts *o = rep->o;
    const char *dt = sumo_dtype_name(o->dtype);
    double sum_floor = floor_us(m, fi, 2), ratio = m->f_us[fi] / sum_floor;
    printf("#   floor, P=%d %zu B %s sum: %.1f us; its %d buffers read and written once at "
           "the %d-worker a+=b bandwidth (%.2f GB/s, measured in alternation) take %.1f us: "
           "%.2fx",
           p, m->f_bytes, dt, m->f_us[fi], p, p, m->f_bw[fi], sum_floor, ratio);
    if (o->transport == BENCH_TRANSPORT_THREADS && p == 2 && judged(rep))
        printf(" (goal <= 1.5x: %s)", ratio <= 1.5 ? "met" : "NOT met");
    printf("\n");
    printf("#   two-pass floor, P=%d %zu B: every input read twice and every output written once "
           "(Adasum's and ACGA's Gram form) at the same bandwidth: %.1f us\n",
           p, m->f_bytes, floor_us(m, fi, 3));
    csv_values v = bandwidth_values(dt, "sum", (double)m->f_bytes,
                                    m->f_bytes / bench_dtype_bytes(o->dtype), m->f_us[fi],
                                    m->f_bw[fi], sum_floor, ratio);
    csv_row(rep, "floor", p, &v);
}

/* An op's time against its plain reduction's in this run and, at the floor's size, against
 * the two-pass floor; the floor section's CSV row carries the latter. */
static void print_cost(const bench_report *rep, const bench_mem_results *m, const bench_row *x,
                       const bench_row *base, const char *name, const char *base_name)
{
    if (!x || !base || x->status != 0 || base->status != 0) return;
    printf("#   P=%d %9zu B %s: %.1f us = %.2fx %s (%.1f us)", x->ranks, x->bytes, name, x->med_us,
           x->med_us / base->med_us, base_name, base->med_us);
    int fi = floor_index(m, x->ranks);
    if (fi >= 0 && x->bytes == m->f_bytes) {
        double two_pass = floor_us(m, fi, 3), ratio = x->med_us / two_pass;
        printf(", %.2fx the two-pass floor (%.1f us)", ratio, two_pass);
        const char *dt = sumo_dtype_name(rep->o->dtype);
        csv_values v = bandwidth_values(dt, name, (double)x->bytes,
                                        x->bytes / bench_dtype_bytes(rep->o->dtype), x->med_us,
                                        m->f_bw[fi], two_pass, ratio);
        csv_row(rep, "floor", x->ranks, &v);
    }
    printf("\n");
}

/* sumo against MPI_Allreduce, Adasum and ACGA against the plain reductions, at one size. */
static void print_ratios_at(const bench_report *rep, const bench_mem_results *m, int p, size_t bytes)
{
    const bench_row *s = find_row(rep, p, bytes, SUMO_OP_SUM);
    if (rep->peer && s && s->status == 0 && s->has_peer) {
        double ratio = s->med_us / s->peer_med_us;
        printf("#   P=%d %9zu B sum: sumo %.2f us, MPI_Allreduce %.2f us, ratio %.3f", p, bytes,
               s->med_us, s->peer_med_us, ratio);
        if (bytes == BENCH_GOAL_BYTES && judged(rep))
            printf(" (goal <= 0.4: %s)", ratio <= 0.4 ? "met" : "NOT met");
        printf("\n");
    }
    print_cost(rep, m, find_row(rep, p, bytes, SUMO_OP_ADASUM), s, "adasum", "sum");
    print_cost(rep, m, find_row(rep, p, bytes, BENCH_OP_ACGA),
               find_row(rep, p, bytes, SUMO_OP_AVERAGE), "acga", "avg");
}

void bench_print_derived(const bench_report *rep, const bench_mem_results *m)
{
    const bench_opts *o = rep->o;
    size_t gs = bench_goal_size(rep->sizes, rep->nsizes);
    printf("#\n# derived figures, all from this run%s\n",
           gs == BENCH_GOAL_BYTES ? "" : " (64 MiB not swept: read at the largest size)");
    bool threads = o->transport == BENCH_TRANSPORT_THREADS;
    int nps = threads ? o->nranks : 1;
    for (int pi = 0; pi < nps; pi++) {
        int p = threads ? o->ranks[pi] : rep->world_size;
        print_floors(rep, m, p);
        size_t probe[3] = {4 << 10, BENCH_MIB, gs};
        for (int k = 0; k < 3; k++)
            if (k == 0 || probe[k] != probe[k - 1]) print_ratios_at(rep, m, p, probe[k]);
    }
    fflush(stdout);
}
