#include "bench_options.h"

#include "args.h"
#include "launch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *out)
{
    fprintf(out,
        "usage: sumo bench [options]\n"
        "\n"
        "Times allreduce for each message size, rank count and op, and prints time, algorithm\n"
        "bandwidth and bus bandwidth (busbw = algbw * 2(P-1)/P) in nccl-tests' layout, with the\n"
        "machine's memory bandwidth and, over MPI, MPI_Allreduce measured in the same run.\n"
        "Lines starting with '#' are comments; the others are the table.\n"
        "\n"
        "  --transport threads|mpi  default: mpi when launched by mpirun (OMPI_COMM_WORLD_SIZE,\n"
        "                           PMI_SIZE or PMIX_RANK set), else threads\n"
        "  --ranks 2,4              rank counts for the threads transport (default 2,4)\n"
        "  --min SIZE --max SIZE    message sizes in bytes, K/M/G suffixes are binary\n"
        "                           (default 4K to 256M)\n"
        "  --step F                 size factor between rows (default 2)\n"
        "  --dtype fp32|fp64|fp16|bf16       (default fp32)\n"
        "  --ops sum,avg,adasum,acga  (default sum,avg,adasum; acga is the ACGA aggregator\n"
        "                           with its defaults, fp32 only; an op the library refuses\n"
        "                           prints n/a)\n"
        "  --tensors K              adasum over a layout of K tensors of nearly equal\n"
        "                           counts (sumo_op_create_adasum), as a fused bucket of K\n"
        "                           gradients; default 1, the whole buffer one tensor\n"
        "  --iters N --warmup W     timed and untimed iterations per row (default 20, 5);\n"
        "                           time is the median over iterations, min also shown\n"
        "  --algo auto|shm|ring|rd|native   force sumo's sum/avg algorithm (default auto)\n"
        "  --check                  verify each size and op once against a sequential reference\n"
        "                           and that all ranks hold identical bits\n"
        "  --quick                  few sizes and iterations, smaller arrays: seconds, for CI;\n"
        "                           its figures are not judged against the goals\n"
        "  --mem-size SIZE          bytes per array of the memory-bandwidth runs (default 256M)\n"
        "  --mem-reps N             repeats of each memory-bandwidth run (default 10)\n"
        "  --skip-mem               no memory-bandwidth section (nor the floors, which need it)\n"
        "  --no-pin                 do not pin rank threads to cores (threads transport)\n"
        "  --shared-buffers         buffers from sumo_mem_alloc: over MPI on one node, sumo's\n"
        "                           collectives then read and write the peers' buffers\n"
        "                           directly instead of staging copies\n"
        "  --shared-outputs         out of place, from private buffers into buffers from\n"
        "                           sumo_mem_alloc (DDP's buckets into mapped ones): over\n"
        "                           MPI on one node the outputs are then the staging areas\n"
        "  --csv FILE               also write every measurement as a CSV row: section\n"
        "                           (allreduce, memory, floor), transport, ranks (or\n"
        "                           threads), dtype, op, bytes, count, time_us, min_us, gbps,\n"
        "                           busbw_gbps, ref_us, ratio, check, status. ref_us is\n"
        "                           MPI_Allreduce's time (allreduce) or the floor's (floor);\n"
        "                           ratio is time/ref_us\n"
        "\n"
        "Environment: SUMO_MPI_SHM=0 disables the MPI transport's shared-memory path (see\n"
        "scripts/bench-net.sh); SUMO_DEBUG=INFO logs each algorithm choice.\n");
}

static bool bad_value(const char *flag, const char *value)
{
    fprintf(stderr, "sumo bench: bad value '%s' for %s\n", value, flag);
    return false;
}

static bool parse_dtype(const char *s, sumo_dtype *out)
{
    static const struct { const char *name; sumo_dtype dtype; } names[] = {
        {"fp32", SUMO_FLOAT32}, {"float", SUMO_FLOAT32}, {"float32", SUMO_FLOAT32},
        {"fp64", SUMO_FLOAT64}, {"double", SUMO_FLOAT64}, {"float64", SUMO_FLOAT64},
        {"fp16", SUMO_FLOAT16}, {"half", SUMO_FLOAT16}, {"float16", SUMO_FLOAT16},
        {"bf16", SUMO_BFLOAT16}, {"bfloat16", SUMO_BFLOAT16},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strcmp(s, names[i].name) == 0) {
            *out = names[i].dtype;
            return true;
        }
    return false;
}

static bool parse_op(const char *s, int *out)
{
    if (strcmp(s, "sum") == 0) *out = SUMO_OP_SUM;
    else if (strcmp(s, "avg") == 0 || strcmp(s, "average") == 0) *out = SUMO_OP_AVERAGE;
    else if (strcmp(s, "adasum") == 0) *out = SUMO_OP_ADASUM;
    else if (strcmp(s, "acga") == 0) *out = BENCH_OP_ACGA;
    else return false;
    return true;
}

static bool parse_algo(const char *s, sumo_algorithm *out)
{
    for (int a = 0; a < SUMO_ALGORITHM_COUNT; a++)
        if (strcmp(s, bench_algo_name((sumo_algorithm)a)) == 0) {
            *out = (sumo_algorithm)a;
            return true;
        }
    return false;
}

static bool parse_transport(const char *s, int *out)
{
    if (strcmp(s, "threads") == 0) *out = BENCH_TRANSPORT_THREADS;
    else if (strcmp(s, "mpi") == 0) *out = BENCH_TRANSPORT_MPI;
    else return false;
    return true;
}

/* A comma-separated list of at most max items, each read by item (which prints its own
 * error, as the rank counts do through args.h); returns the count, or -1 after an error. */
typedef bool (*list_item_parser)(const char *flag, const char *item, int *out);

static int parse_list(const char *flag, const char *s, int max, int *items, list_item_parser item)
{
    char copy[256];
    if (strlen(s) >= sizeof copy) {
        bad_value(flag, s);
        return -1;
    }
    strcpy(copy, s);
    int n = 0;
    /* Not strtok, which skips empty items: "2,,4" is a typo to refuse, not the list 2,4. */
    for (char *tok = copy, *next; tok; tok = next) {
        next = strchr(tok, ',');
        if (next) *next++ = '\0';
        if (*tok == '\0') {
            fprintf(stderr, "sumo bench: %s '%s': an empty entry\n", flag, s);
            return -1;
        }
        if (n == max) {
            fprintf(stderr, "sumo bench: %s takes at most %d values\n", flag, max);
            return -1;
        }
        if (!item(flag, tok, &items[n])) return -1;
        n++;
    }
    return n;
}

static bool parse_op_item(const char *flag, const char *item, int *out)
{
    return parse_op(item, out) || bad_value(flag, item);
}

/* The threads transport's own limit: a larger team could not get a communicator. */
static bool parse_rank_item(const char *flag, const char *item, int *out)
{
    sumo_args_error err;
    if (sumo_args_int(flag, item, 1, SUMO_THREADS_MAX_RANKS, out, &err)) return true;
    fprintf(stderr, "sumo bench: %s\n", err.message);
    return false;
}

/* The numeric flags, read by args.h; *matched tells whether flag is one of them. Returns
 * false after printing why the value is refused. */
static bool parse_numeric_flag(bench_opts *o, const char *flag, const char *val, bool *matched)
{
    sumo_args_error err;
    bool ok;
    *matched = true;
    if (strcmp(flag, "--min") == 0) {
        ok = sumo_args_bytes(flag, val, 1, SIZE_MAX, &o->min_bytes, &err);
        o->min_set = true;
    } else if (strcmp(flag, "--max") == 0) {
        ok = sumo_args_bytes(flag, val, 1, SIZE_MAX, &o->max_bytes, &err);
        o->max_set = true;
    } else if (strcmp(flag, "--step") == 0) {
        ok = sumo_args_double(flag, val, 1.01, false, 1024, false, &o->step, &err);
        o->step_set = true;
    } else if (strcmp(flag, "--iters") == 0) {
        ok = sumo_args_int(flag, val, 1, 100000, &o->iters, &err);
        o->iters_set = true;
    } else if (strcmp(flag, "--warmup") == 0) {
        ok = sumo_args_int(flag, val, 0, 100000, &o->warmup, &err);
        o->warmup_set = true;
    } else if (strcmp(flag, "--tensors") == 0) {
        int k = 0;
        ok = sumo_args_int(flag, val, 1, 1 << 20, &k, &err);
        o->tensors = (size_t)k;
    } else if (strcmp(flag, "--mem-size") == 0) {
        ok = sumo_args_bytes(flag, val, BENCH_MIB, SIZE_MAX, &o->mem_bytes, &err);
        o->mem_set = true;
    } else if (strcmp(flag, "--mem-reps") == 0) {
        ok = sumo_args_int(flag, val, 1, 10000, &o->mem_reps, &err);
        o->mem_reps_set = true;
    } else {
        *matched = false;
        return false;
    }
    if (!ok) fprintf(stderr, "sumo bench: %s\n", err.message);
    return ok;
}

/* The flags whose value is a name, a list or a path. Returns false after printing why the
 * value is refused. */
static bool parse_named_flag(bench_opts *o, const char *flag, const char *val)
{
    if (strcmp(flag, "--transport") == 0) {
        o->transport_set = true;
        return parse_transport(val, &o->transport) || bad_value(flag, val);
    }
    if (strcmp(flag, "--ranks") == 0) {
        o->ranks_set = true;
        o->nranks = parse_list(flag, val, BENCH_MAX_RANK_LIST, o->ranks, parse_rank_item);
        return o->nranks > 0;
    }
    if (strcmp(flag, "--ops") == 0) {
        o->nops = parse_list(flag, val, BENCH_NOPS, o->ops, parse_op_item);
        return o->nops > 0;
    }
    if (strcmp(flag, "--dtype") == 0) return parse_dtype(val, &o->dtype) || bad_value(flag, val);
    if (strcmp(flag, "--algo") == 0) return parse_algo(val, &o->algo) || bad_value(flag, val);
    if (strcmp(flag, "--csv") == 0) {
        o->csv_path = val;
        return true;
    }
    return bad_value(flag, val); /* a flag takes_value() lists but no parser knows */
}

/* A flag that takes_value(). Returns false after printing why the value is refused. */
static bool parse_value_flag(bench_opts *o, const char *flag, const char *val)
{
    bool numeric;
    bool ok = parse_numeric_flag(o, flag, val, &numeric);
    return numeric ? ok : parse_named_flag(o, flag, val);
}

/* The flags without a value; false when flag is none of them. */
static bool parse_switch(bench_opts *o, const char *flag)
{
    if (strcmp(flag, "--check") == 0) o->check = true;
    else if (strcmp(flag, "--quick") == 0) o->quick = true;
    else if (strcmp(flag, "--skip-mem") == 0) o->skip_mem = true;
    else if (strcmp(flag, "--no-pin") == 0) o->pin = false;
    else if (strcmp(flag, "--shared-buffers") == 0) o->shared_buffers = true;
    else if (strcmp(flag, "--shared-outputs") == 0) o->shared_outputs = true;
    else return false;
    return true;
}

static void set_defaults(bench_opts *o)
{
    *o = (bench_opts){.ranks = {2, 4}, .nranks = 2, .min_bytes = 4 << 10,
                      .max_bytes = 256 * BENCH_MIB, .step = 2, .dtype = SUMO_FLOAT32,
                      .ops = {SUMO_OP_SUM, SUMO_OP_AVERAGE, SUMO_OP_ADASUM}, .nops = 3,
                      .iters = 20, .warmup = 5, .pin = true, .mem_bytes = 256 * BENCH_MIB,
                      .mem_reps = 10, .algo = SUMO_ALGORITHM_AUTO, .tensors = 1};
    o->transport = launch_under_mpi() ? BENCH_TRANSPORT_MPI : BENCH_TRANSPORT_THREADS;
}

/* --quick only changes what was not given explicitly. */
static void apply_quick(bench_opts *o)
{
    if (!o->ranks_set) o->ranks[0] = 2, o->nranks = 1;
    if (!o->max_set) o->max_bytes = BENCH_GOAL_BYTES;
    if (!o->step_set) o->step = 4;
    if (!o->iters_set) o->iters = 5;
    if (!o->warmup_set) o->warmup = 2;
    if (!o->mem_set) o->mem_bytes = 64 * BENCH_MIB;
    if (!o->mem_reps_set) o->mem_reps = 3;
}

static bool takes_value(const char *flag)
{
    static const char *const flags[] = {"--transport", "--ranks", "--min", "--max", "--step",
                                        "--dtype", "--ops", "--iters", "--warmup", "--algo", "--tensors",
                                        "--mem-size", "--mem-reps", "--csv"};
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++)
        if (strcmp(flag, flags[i]) == 0) return true;
    return false;
}

/* One argument at *i ("--flag", "--flag value" or "--flag=value"); advances *i past a
 * separate value. */
static bench_parse_result parse_argument(int argc, char **argv, int *i, bench_opts *o)
{
    const char *arg = argv[*i], *val = NULL;
    char name[32];
    const char *eq = strchr(arg, '=');
    if (strncmp(arg, "--", 2) == 0 && eq && (size_t)(eq - arg) < sizeof name) {
        memcpy(name, arg, (size_t)(eq - arg));
        name[eq - arg] = '\0';
        val = eq + 1;
        arg = name;
    }
    if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
        usage(stdout);
        return BENCH_PARSE_HELP;
    }
    if (parse_switch(o, arg)) return BENCH_PARSE_RUN;
    if (!takes_value(arg)) {
        fprintf(stderr, "sumo bench: unknown option '%s' (see sumo bench --help)\n", argv[*i]);
        return BENCH_PARSE_USAGE;
    }
    if (val == NULL) {
        if (*i + 1 >= argc) {
            fprintf(stderr, "sumo bench: %s needs a value\n", arg);
            return BENCH_PARSE_USAGE;
        }
        val = argv[++*i];
    }
    return parse_value_flag(o, arg, val) ? BENCH_PARSE_RUN : BENCH_PARSE_USAGE;
}

bench_parse_result bench_parse_options(int argc, char **argv, bench_opts *o)
{
    set_defaults(o);
    for (int i = 1; i < argc; i++) {
        bench_parse_result r = parse_argument(argc, argv, &i, o);
        if (r != BENCH_PARSE_RUN) return r;
    }
    if (o->quick) apply_quick(o);
    if (o->shared_buffers && o->shared_outputs) {
        fprintf(stderr, "sumo bench: --shared-buffers and --shared-outputs exclude each other\n");
        return BENCH_PARSE_USAGE;
    }
    if (o->min_bytes > o->max_bytes) {
        fprintf(stderr, "sumo bench: --min %zu is above --max %zu\n", o->min_bytes, o->max_bytes);
        return BENCH_PARSE_USAGE;
    }
    return BENCH_PARSE_RUN;
}

int bench_make_sizes(const bench_opts *o, size_t *sizes)
{
    size_t esz = bench_dtype_bytes(o->dtype);
    size_t s = o->min_bytes / esz * esz;
    if (s < esz) s = esz;
    int n = 0;
    while (s <= o->max_bytes && n < BENCH_MAX_SIZES) {
        sizes[n++] = s;
        double next = (double)s * o->step;
        size_t rounded = (size_t)next / esz * esz;
        if (next >= (double)SIZE_MAX / 2) break;
        s = rounded > s + esz ? rounded : s + esz;
    }
    return n;
}

size_t bench_goal_size(const size_t *sizes, int nsizes)
{
    for (int i = 0; i < nsizes; i++)
        if (sizes[i] == BENCH_GOAL_BYTES) return BENCH_GOAL_BYTES;
    return sizes[nsizes - 1];
}

int bench_max_reps(const bench_opts *o)
{
    int most = o->iters > o->warmup ? o->iters : o->warmup;
    return most > o->mem_reps ? most : o->mem_reps;
}

size_t bench_dtype_bytes(sumo_dtype dtype)
{
    size_t bytes = 0;
    return sumo_dtype_size(dtype, &bytes) == SUMO_SUCCESS ? bytes : 0;
}

const char *bench_op_label(int op)
{
    switch (op) {
    case SUMO_OP_SUM: return "sum";
    case SUMO_OP_AVERAGE: return "avg";
    case SUMO_OP_ADASUM: return "adasum";
    case BENCH_OP_ACGA: return "acga";
    default: return "created-op";
    }
}

const char *bench_algo_name(sumo_algorithm algo)
{
    switch (algo) {
    case SUMO_ALGORITHM_AUTO: return "auto";
    case SUMO_ALGORITHM_SHARED_MEMORY: return "shm";
    case SUMO_ALGORITHM_RING: return "ring";
    case SUMO_ALGORITHM_RECURSIVE_DOUBLING: return "rd";
    case SUMO_ALGORITHM_PEER: return "native";
    default: return "?";
    }
}

const char *bench_transport_name(const bench_opts *o)
{
    /* Shared buffers change what the MPI transport does, so its rows carry them in the name. */
    if (o->transport == BENCH_TRANSPORT_MPI)
        return o->shared_buffers ? "mpi-shared" : o->shared_outputs ? "mpi-shared-out" : "mpi";
    return o->shared_buffers   ? "threads-shared"
           : o->shared_outputs ? "threads-shared-out"
                               : "threads";
}
