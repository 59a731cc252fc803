/*
 * sumo_bootstrap_detect and Slurm's hostlists (include/sumo_bootstrap.h). Everything is read
 * through one lookup over the envp array given, so a test hands it an environment of its own
 * and two threads may detect at once.
 */
#include "common/common.h"

#include "sumo_bootstrap.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

extern char **environ;

/* Where the derived Slurm ports lie: below Linux's ephemeral range (32768-60999), so a port the
 * kernel handed to an outgoing connection is not what rank 0 asks for. Changing either moves
 * every step's port: tasks of one step must compute the same one, whichever sumo they run. */
#define SLURM_PORT_BASE 12000
#define SLURM_PORT_SPAN 20000
/* Slurm's job and step ids are 32-bit. */
#define SLURM_ID_MAX 4294967295LL

typedef struct reader {
    const char *const *envp;
    char *error;
    size_t error_bytes;
} reader;

static sumo_result refuse(const reader *r, sumo_result code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static sumo_result refuse(const reader *r, sumo_result code, const char *fmt, ...)
{
    if (r->error && r->error_bytes) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(r->error, r->error_bytes, fmt, ap);
        va_end(ap);
    }
    return code;
}

/* The value of name, NULL when unset or empty. */
static const char *look(const reader *r, const char *name)
{
    size_t n = strlen(name);
    for (const char *const *e = r->envp; e && *e; e++)
        if (strncmp(*e, name, n) == 0 && (*e)[n] == '=') return (*e)[n + 1] ? *e + n + 1 : NULL;
    return NULL;
}

/* A decimal number without sign, spaces or more than 18 digits, from lo to hi. */
static bool parse_int(const char *s, long long lo, long long hi, long long *v)
{
    long long x = 0;
    size_t n = 0;
    for (; s[n]; n++) {
        if (s[n] < '0' || s[n] > '9' || n >= 18) return false;
        x = x * 10 + (s[n] - '0');
    }
    if (n == 0 || x < lo || x > hi) return false;
    *v = x;
    return true;
}

/* name as a number from lo to hi into *v; absent: *v = dflt, or a refusal when required. */
static sumo_result read_int(const reader *r, const char *name, long long lo, long long hi,
                            bool required, long long dflt, long long *v)
{
    const char *s = look(r, name);
    if (!s) {
        *v = dflt;
        return required ? refuse(r, SUMO_ERR_INVALID_ARGUMENT, "%s is not set", name) : SUMO_SUCCESS;
    }
    if (!parse_int(s, lo, hi, v))
        return refuse(r, SUMO_ERR_INVALID_ARGUMENT, "%s=%.40s%s is not a number from %lld to %lld", name, s,
                      strlen(s) > 40 ? "..." : "", lo, hi);
    return SUMO_SUCCESS;
}

/* A host name or address as given (MASTER_ADDR, a hostlist's): printable, no space. */
static bool host_ok(const char *s, size_t n)
{
    if (n == 0 || n >= SUMO_BOOTSTRAP_HOST_BYTES) return false;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] <= ' ' || (unsigned char)s[i] >= 127) return false;
    return true;
}

static sumo_result read_host(const reader *r, const char *name, char *host)
{
    const char *s = look(r, name);
    if (!s) return refuse(r, SUMO_ERR_INVALID_ARGUMENT, "%s is not set", name);
    if (!host_ok(s, strlen(s)))
        return refuse(r, SUMO_ERR_INVALID_ARGUMENT,
                      "%s=%.40s%s is not a host name: printable, without spaces, at most %d bytes", name, s,
                      strlen(s) > 40 ? "..." : "", SUMO_BOOTSTRAP_HOST_BYTES - 1);
    strcpy(host, s);
    return SUMO_SUCCESS;
}

/* rank, size, local rank and local size, each -1 when unknown, consistent with each other;
 * what is wrong is named by the variables the values came from. */
static sumo_result check_place(const reader *r, const sumo_bootstrap *b, const char *rank_var,
                               const char *size_var, const char *local_rank_var, const char *local_size_var)
{
    if (b->rank >= 0 && b->size >= 0 && b->rank >= b->size)
        return refuse(r, SUMO_ERR_INVALID_ARGUMENT, "%s=%d is not a rank of %s=%d", rank_var, b->rank, size_var,
                      b->size);
    if (b->local_size >= 0 && b->size >= 0 && b->local_size > b->size)
        return refuse(r, SUMO_ERR_INVALID_ARGUMENT, "%s=%d is more than %s=%d", local_size_var, b->local_size,
                      size_var, b->size);
    if (b->local_rank >= 0 && b->local_size >= 0 && b->local_rank >= b->local_size)
        return refuse(r, SUMO_ERR_INVALID_ARGUMENT, "%s=%d is not a rank of %s=%d", local_rank_var, b->local_rank,
                      local_size_var, b->local_size);
    return SUMO_SUCCESS;
}

/* Reads four numbers into rank, size, local rank and local size (a NULL name: -1). */
static sumo_result read_place(const reader *r, sumo_bootstrap *b, const char *rank_var, const char *size_var,
                              const char *local_rank_var, const char *local_size_var, bool required)
{
    const long long max = SUMO_BOOTSTRAP_MAX_SIZE;
    long long rank = -1, size = -1, lrank = -1, lsize = -1;
    SUMO__CHECK(read_int(r, size_var, 1, max, required, -1, &size));
    if (rank_var) SUMO__CHECK(read_int(r, rank_var, 0, max - 1, required, -1, &rank));
    if (local_rank_var) SUMO__CHECK(read_int(r, local_rank_var, 0, max - 1, false, -1, &lrank));
    if (local_size_var) SUMO__CHECK(read_int(r, local_size_var, 1, max, false, -1, &lsize));
    b->rank = (int)rank;
    b->size = (int)size;
    b->local_rank = (int)lrank;
    b->local_size = (int)lsize;
    return check_place(r, b, rank_var, size_var, local_rank_var, local_size_var);
}

/* ---- hostlists ------------------------------------------------------------------------ */

typedef struct hostlist_err {
    const char *list;
    char *error;
    size_t error_bytes;
} hostlist_err;

static sumo_result hl_refuse(const hostlist_err *h, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static sumo_result hl_refuse(const hostlist_err *h, const char *fmt, ...)
{
    if (h->error && h->error_bytes) {
        size_t n = strlen(h->list);
        int w = snprintf(h->error, h->error_bytes, "hostlist '%.60s%s': ", h->list, n > 60 ? "..." : "");
        if (w >= 0 && (size_t)w < h->error_bytes) {
            va_list ap;
            va_start(ap, fmt);
            vsnprintf(h->error + w, h->error_bytes - (size_t)w, fmt, ap);
            va_end(ap);
        }
    }
    return SUMO_ERR_INVALID_ARGUMENT;
}

static bool is_space(char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

/* One piece of a bracket group, "07" or "01-03", surrounding spaces allowed: its bounds and
 * the width of the first. */
typedef struct piece {
    unsigned long long lo, hi;
    int width;
} piece;

static bool parse_bound(const char *s, size_t n, unsigned long long *v)
{
    if (n == 0 || n > 18) return false;
    unsigned long long x = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return false;
        x = x * 10 + (unsigned)(s[i] - '0');
    }
    *v = x;
    return true;
}

static sumo_result parse_piece(const hostlist_err *h, const char *s, size_t n, piece *p)
{
    const char *t = s;
    size_t m = n;
    while (m && is_space(*t)) t++, m--;
    while (m && is_space(t[m - 1])) m--;
    const char *dash = memchr(t, '-', m);
    size_t first = dash ? (size_t)(dash - t) : m;
    if (!parse_bound(t, first, &p->lo) || (dash && !parse_bound(dash + 1, m - first - 1, &p->hi)))
        return hl_refuse(h, "'%.*s' is not a number or a range", (int)(n < 40 ? n : 40), s);
    if (!dash) p->hi = p->lo;
    if (p->hi < p->lo) return hl_refuse(h, "range %.*s runs backwards", (int)(m < 40 ? m : 40), t);
    p->width = (int)first;
    return SUMO_SUCCESS;
}

/* The hosts of one bracket group's body ("01-03,07"): the sum of its ranges. */
static sumo_result group_count(const hostlist_err *h, const char *body, size_t n, unsigned long long *count)
{
    unsigned long long total = 0;
    for (size_t start = 0;;) {
        const char *comma = memchr(body + start, ',', n - start);
        size_t end = comma ? (size_t)(comma - body) : n;
        piece p;
        SUMO__CHECK(parse_piece(h, body + start, end - start, &p));
        total += p.hi - p.lo + 1; /* each term is below 1e18: no overflow before the check */
        if (total > SUMO_HOSTLIST_MAX_HOSTS) return hl_refuse(h, "more than %d hosts", SUMO_HOSTLIST_MAX_HOSTS);
        if (!comma) break;
        start = end + 1;
    }
    *count = total;
    return SUMO_SUCCESS;
}

/* Value number index of a group's body, and its width. */
static void group_value(const char *body, size_t n, unsigned long long index, unsigned long long *v, int *width)
{
    for (size_t start = 0;;) {
        const char *comma = memchr(body + start, ',', n - start);
        size_t end = comma ? (size_t)(comma - body) : n;
        piece p = {0, 0, 0};
        hostlist_err quiet = {"", NULL, 0};
        parse_piece(&quiet, body + start, end - start, &p); /* checked by group_count */
        if (index <= p.hi - p.lo || !comma) {
            *v = p.lo + index;
            *width = p.width;
            return;
        }
        index -= p.hi - p.lo + 1;
        start = end + 1;
    }
}

/* One name of the list (no top-level comma): its host count, and with host != NULL host
 * number index written there. */
static sumo_result expand_name(const hostlist_err *h, const char *s, size_t n, unsigned long long index,
                               unsigned long long *count, char *host, size_t bytes)
{
    if (n == 0) return hl_refuse(h, "an empty name");
    /* Inside brackets parse_piece reads what is there (spaces around a number are allowed). */
    for (size_t i = 0, inside = 0; i < n; i++) {
        inside = s[i] == '[' ? 1 : s[i] == ']' ? 0 : inside;
        if (!inside && ((unsigned char)s[i] <= ' ' || (unsigned char)s[i] >= 127))
            return hl_refuse(h, "a name holds a space or a byte that is not printable");
    }
    /* Count first: the groups' sizes are the digits of index, the first group the slowest. */
    unsigned long long total = 1, sizes[64];
    int ngroups = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '[') continue;
        const char *close = memchr(s + i, ']', n - i);
        if (ngroups == 64) return hl_refuse(h, "more than 64 bracket groups in one name");
        SUMO__CHECK(group_count(h, s + i + 1, (size_t)(close - s) - i - 1, &sizes[ngroups]));
        total *= sizes[ngroups++];
        if (total > SUMO_HOSTLIST_MAX_HOSTS) return hl_refuse(h, "more than %d hosts", SUMO_HOSTLIST_MAX_HOSTS);
        i = (size_t)(close - s);
    }
    *count = total;
    if (!host) return SUMO_SUCCESS;
    unsigned long long digit[64];
    for (int g = ngroups - 1; g >= 0; g--) {
        digit[g] = index % sizes[g];
        index /= sizes[g];
    }
    size_t out = 0;
    int g = 0;
    for (size_t i = 0; i < n; i++) {
        char text[48];
        size_t len;
        if (s[i] == '[') {
            const char *close = memchr(s + i, ']', n - i);
            unsigned long long v;
            int width;
            group_value(s + i + 1, (size_t)(close - s) - i - 1, digit[g++], &v, &width);
            len = (size_t)snprintf(text, sizeof text, "%0*llu", width, v);
            i = (size_t)(close - s);
        } else {
            text[0] = s[i];
            len = 1;
        }
        if (out + len >= bytes)
            return hl_refuse(h, "a host name longer than %zu bytes", bytes ? bytes - 1 : 0);
        memcpy(host + out, text, len);
        out += len;
    }
    host[out] = '\0';
    return SUMO_SUCCESS;
}

sumo_result sumo_hostlist_get(const char *list, size_t index, char *host, size_t bytes, size_t *count, char *error,
                              size_t error_bytes)
{
    if (error && error_bytes) error[0] = '\0';
    hostlist_err h = {list ? list : "", error, error_bytes};
    if (!list || (!host && bytes) || (host && !bytes)) return hl_refuse(&h, "no list, or no room for the host");
    size_t n = strnlen(list, SUMO_HOSTLIST_MAX_BYTES + 1);
    if (n > SUMO_HOSTLIST_MAX_BYTES) return hl_refuse(&h, "longer than %d bytes", SUMO_HOSTLIST_MAX_BYTES);
    while (n && is_space(*list)) list++, n--;
    while (n && is_space(list[n - 1])) n--;
    /* The brackets first, over the whole list, as Slurm's own parser reads them. */
    int depth = 0;
    for (size_t i = 0; i < n; i++) {
        if (list[i] == '[' && ++depth > 1) return hl_refuse(&h, "nested brackets");
        if (list[i] == ']' && --depth < 0) return hl_refuse(&h, "']' without '['");
    }
    if (depth) return hl_refuse(&h, "'[' without ']'");
    unsigned long long total = 0;
    bool found = false;
    for (size_t start = 0;;) {
        size_t end = start;
        for (depth = 0; end < n && (list[end] != ',' || depth); end++)
            depth += list[end] == '[' ? 1 : list[end] == ']' ? -1 : 0;
        unsigned long long c;
        SUMO__CHECK(expand_name(&h, list + start, end - start, 0, &c, NULL, 0));
        if (!found && host && index < total + c) {
            SUMO__CHECK(expand_name(&h, list + start, end - start, index - total, &c, host, bytes));
            found = true;
        }
        total += c;
        if (total > SUMO_HOSTLIST_MAX_HOSTS) return hl_refuse(&h, "more than %d hosts", SUMO_HOSTLIST_MAX_HOSTS);
        if (end == n) break;
        start = end + 1;
    }
    if (count) *count = (size_t)total;
    if (host && !found) return hl_refuse(&h, "no host number %zu: it has %llu", index, total);
    return SUMO_SUCCESS;
}

/* ---- the launchers -------------------------------------------------------------------- */

static const char *const other_launchers[][2] = {
    {"SLURM_NTASKS", "a Slurm batch script or salloc's shell, outside an srun step"},
    {"PBS_NP", "PBS"},
    {"LSB_DJOB_NUMPROC", "LSF"},
};

/* A task of an srun step of more than one task. A batch script or salloc's shell has the job's
 * variables but no step, and a step of one task has nobody to meet. */
static sumo_result in_srun_step(const reader *r, bool *yes)
{
    *yes = false;
    if (!look(r, "SLURM_STEP_ID") && !look(r, "SLURM_STEP_NODELIST")) return SUMO_SUCCESS;
    long long ntasks;
    /* Unset in a step is a broken step, named below, not a step of one. */
    SUMO__CHECK(read_int(r, "SLURM_NTASKS", 1, SUMO_BOOTSTRAP_MAX_SIZE, false, 2, &ntasks));
    *yes = ntasks > 1;
    return SUMO_SUCCESS;
}

static sumo_result detect_srun(const reader *r, sumo_bootstrap *b)
{
    static const char *const required[] = {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID",
                                           "SLURM_STEP_NODELIST", "SLURM_JOB_ID", "SLURM_STEP_ID"};
    char missing[256] = "";
    int nmissing = 0;
    for (size_t i = 0; i < sizeof required / sizeof required[0]; i++)
        if (!look(r, required[i])) {
            size_t used = strlen(missing);
            snprintf(missing + used, sizeof missing - used, "%s%s", nmissing++ ? ", " : "", required[i]);
        }
    if (nmissing)
        return refuse(r, SUMO_ERR_INVALID_ARGUMENT,
                      "started by srun, but %s %s not set: cannot join the job step (run the tasks with srun, "
                      "or set them)",
                      missing, nmissing == 1 ? "is" : "are");
    SUMO__CHECK(read_place(r, b, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", NULL, true));
    long long job, step, nodes, srun_port;
    SUMO__CHECK(read_int(r, "SLURM_JOB_ID", 0, SLURM_ID_MAX, true, 0, &job));
    SUMO__CHECK(read_int(r, "SLURM_STEP_ID", 0, SLURM_ID_MAX, true, 0, &step));
    SUMO__CHECK(read_int(r, "SLURM_SRUN_COMM_PORT", 1, 65535, false, 0, &srun_port));
    char why[200];
    size_t hosts;
    if (sumo_hostlist_get(look(r, "SLURM_STEP_NODELIST"), 0, b->host, sizeof b->host, &hosts, why, sizeof why) !=
        SUMO_SUCCESS)
        return refuse(r, SUMO_ERR_INVALID_ARGUMENT, "SLURM_STEP_NODELIST: %s", why);
    SUMO__CHECK(read_int(r, "SLURM_STEP_NUM_NODES", 1, SUMO_HOSTLIST_MAX_HOSTS, false, (long long)hosts, &nodes));
    b->nodes = (int)nodes;
    /* Python's arithmetic on the same numbers: (job * 64 + step) mod span, never overflowing. */
    b->port = SLURM_PORT_BASE + (int)((job % SLURM_PORT_SPAN * 64 + step % SLURM_PORT_SPAN) % SLURM_PORT_SPAN);
    snprintf(b->run_id, sizeof b->run_id, "%lld.%lld-%lld", job, step, srun_port);
    if (look(r, "MASTER_ADDR")) SUMO__CHECK(read_host(r, "MASTER_ADDR", b->host));
    long long port;
    SUMO__CHECK(read_int(r, "MASTER_PORT", 1, 65535, false, b->port, &port));
    b->port = (int)port;
    return SUMO_SUCCESS;
}

/* torchrun and a rendezvous by hand: torch's env:// variables. */
static sumo_result detect_env(const reader *r, sumo_bootstrap *b)
{
    static const char *const required[] = {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"};
    for (size_t i = 0; i < sizeof required / sizeof required[0]; i++)
        if (!look(r, required[i]))
            return refuse(r, SUMO_ERR_INVALID_ARGUMENT,
                          "started by torchrun (TORCHELASTIC_RUN_ID or TORCHELASTIC_RESTART_COUNT is set), but "
                          "%s is not set: cannot meet the other ranks",
                          required[i]);
    SUMO__CHECK(read_place(r, b, "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", true));
    SUMO__CHECK(read_host(r, "MASTER_ADDR", b->host));
    long long port, nodes, restart;
    SUMO__CHECK(read_int(r, "MASTER_PORT", 1, 65535, true, 0, &port));
    b->port = (int)port;
    /* torchrun's agents: one per host. */
    SUMO__CHECK(read_int(r, "GROUP_WORLD_SIZE", 1, SUMO_BOOTSTRAP_MAX_SIZE, false, -1, &nodes));
    b->nodes = (int)nodes;
    SUMO__CHECK(read_int(r, "TORCHELASTIC_RESTART_COUNT", 0, 1000000000, false, 0, &restart));
    const char *run = look(r, "TORCHELASTIC_RUN_ID");
    if (b->launcher == SUMO_LAUNCHER_TORCHRUN) {
        if (run && !host_ok(run, strlen(run)))
            return refuse(r, SUMO_ERR_INVALID_ARGUMENT,
                          "TORCHELASTIC_RUN_ID=%.40s%s is not a run id: printable, without spaces, at most %d bytes",
                          run, strlen(run) > 40 ? "..." : "", SUMO_BOOTSTRAP_HOST_BYTES - 1);
        snprintf(b->run_id, sizeof b->run_id, "%s.%lld", run ? run : "run", restart);
    }
    return SUMO_SUCCESS;
}

static sumo_result detect_mpi(const reader *r, sumo_bootstrap *b)
{
    switch (b->launcher) {
    case SUMO_LAUNCHER_OPEN_MPI:
        return read_place(r, b, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                          "OMPI_COMM_WORLD_LOCAL_SIZE", false);
    case SUMO_LAUNCHER_PMI:
        return read_place(r, b, "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS", false);
    default: { /* PMIx: the rank alone; the size is the step's under srun */
        long long rank;
        SUMO__CHECK(read_int(r, "PMIX_RANK", 0, SUMO_BOOTSTRAP_MAX_SIZE - 1, true, -1, &rank));
        if (b->slurm_step) {
            SUMO__CHECK(read_place(r, b, NULL, "SLURM_NTASKS", "SLURM_LOCALID", NULL, false));
            b->rank = (int)rank;
            return check_place(r, b, "PMIX_RANK", "SLURM_NTASKS", "SLURM_LOCALID", NULL);
        }
        b->rank = (int)rank;
        return SUMO_SUCCESS;
    }
    }
}

static sumo_result detect_store(const reader *r, const sumo_bootstrap_options *o, sumo_bootstrap *b)
{
    b->launcher = SUMO_LAUNCHER_STORE;
    if (o->size < 1 || o->size > SUMO_BOOTSTRAP_MAX_SIZE || o->rank < 0 || o->rank >= o->size)
        return refuse(r, SUMO_ERR_INVALID_ARGUMENT,
                      "rank %d of size %d: the size must be 1 to %d and the rank 0 to size - 1", o->rank, o->size,
                      SUMO_BOOTSTRAP_MAX_SIZE);
    b->rank = o->rank;
    b->size = o->size;
    const char *s = o->store;
    size_t n = strlen(s);
    if (strncmp(s, "tcp://", 6) == 0) {
        const char *colon = strrchr(s + 6, ':');
        long long port;
        if (!colon || !host_ok(s + 6, (size_t)(colon - s - 6)) || !parse_int(colon + 1, 1, 65535, &port))
            return refuse(r, SUMO_ERR_INVALID_ARGUMENT,
                          "store %.60s%s: tcp://HOST:PORT wants a host name and a port from 1 to 65535", s,
                          n > 60 ? "..." : "");
        memcpy(b->host, s + 6, (size_t)(colon - s - 6));
        b->host[colon - s - 6] = '\0';
        b->port = (int)port;
    } else {
        if (n == 0 || n >= sizeof b->store)
            return refuse(r, SUMO_ERR_INVALID_ARGUMENT, "store '%.60s%s': a path of 1 to %zu bytes", s,
                          n > 60 ? "..." : "", sizeof b->store - 1);
        memcpy(b->store, s, n + 1);
    }
    /* Where a launcher started the processes (torchrun's agent), its place on the host. */
    long long v;
    SUMO__CHECK(read_int(r, "LOCAL_WORLD_SIZE", 1, b->size, false, -1, &v));
    b->local_size = (int)v;
    SUMO__CHECK(read_int(r, "LOCAL_RANK", 0, b->size - 1, false, -1, &v));
    b->local_rank = (int)v;
    return check_place(r, b, "the rank", "the size", "LOCAL_RANK", "LOCAL_WORLD_SIZE");
}

static sumo_result detect(const reader *r, const sumo_bootstrap_options *o, sumo_bootstrap *b)
{
    if (o->store) return detect_store(r, o, b);
    /* What an MPI library itself starts from. Hydra's MPI_LOCALNRANKS comes with PMI_SIZE and
     * is read as the host's share of a PMI launch, never alone as a launch: a process with it
     * and no PMI_* would be taken for a rank that MPI_Init then makes a world of one. */
    static const char *const mpi[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"};
    static const sumo_launcher kinds[] = {SUMO_LAUNCHER_OPEN_MPI, SUMO_LAUNCHER_PMI, SUMO_LAUNCHER_PMIX};
    for (int i = 0; i < 3; i++)
        if (look(r, mpi[i])) {
            b->launcher = kinds[i];
            b->slurm_step = look(r, "SLURM_STEP_ID") != NULL;
            return detect_mpi(r, b);
        }
    if (look(r, "TORCHELASTIC_RUN_ID") || look(r, "TORCHELASTIC_RESTART_COUNT")) {
        b->launcher = SUMO_LAUNCHER_TORCHRUN;
        return detect_env(r, b);
    }
    if (look(r, "RANK") && look(r, "WORLD_SIZE") && look(r, "MASTER_ADDR") && look(r, "MASTER_PORT")) {
        b->launcher = SUMO_LAUNCHER_ENV;
        return detect_env(r, b);
    }
    bool step;
    SUMO__CHECK(in_srun_step(r, &step));
    if (step) {
        b->launcher = SUMO_LAUNCHER_SRUN;
        b->slurm_step = 1;
        return detect_srun(r, b);
    }
    long long n;
    SUMO__CHECK(read_int(r, "WORLD_SIZE", 1, SUMO_BOOTSTRAP_MAX_SIZE, false, 1, &n));
    if (n > 1) {
        b->launcher = SUMO_LAUNCHER_UNSUPPORTED;
        return refuse(r, SUMO_ERR_INVALID_USAGE,
                      "started by a launcher that set WORLD_SIZE=%lld without MASTER_ADDR and MASTER_PORT, which "
                      "sumo does not join (set RANK, MASTER_ADDR and MASTER_PORT too, as torchrun does)",
                      n);
    }
    for (size_t i = 0; i < sizeof other_launchers / sizeof other_launchers[0]; i++) {
        SUMO__CHECK(read_int(r, other_launchers[i][0], 1, SUMO_BOOTSTRAP_MAX_SIZE, false, 1, &n));
        if (n > 1) {
            b->launcher = SUMO_LAUNCHER_UNSUPPORTED;
            return refuse(r, SUMO_ERR_INVALID_USAGE,
                          "started by %s (%s=%lld), which sumo does not join: start the processes with srun, "
                          "mpirun or torchrun rather than train as independent worlds of one",
                          other_launchers[i][1], other_launchers[i][0], n);
        }
    }
    b->rank = 0;
    b->size = 1;
    b->local_rank = 0;
    b->local_size = 1;
    b->nodes = 1;
    return SUMO_SUCCESS;
}

sumo_result sumo_bootstrap_options_default(sumo_bootstrap_options *options)
{
    if (!options) return SUMO_ERR_INVALID_ARGUMENT;
    memset(options, 0, sizeof *options);
    options->struct_size = sizeof *options;
    return SUMO_SUCCESS;
}

sumo_result sumo_bootstrap_detect(const sumo_bootstrap_options *options, sumo_bootstrap *out)
{
    if (!options || !out) return SUMO_ERR_INVALID_ARGUMENT;
    reader r = {options->envp, options->error, options->error_bytes};
    if (r.error && r.error_bytes) r.error[0] = '\0';
    const char *bad = SUMO__STRUCT_SIZE_PROBLEM(options, sumo_bootstrap_options, NULL, 0);
    if (bad) {
        r.envp = NULL;
        return refuse(&r, SUMO_ERR_INVALID_ARGUMENT, "%s", bad);
    }
    if (!r.envp) r.envp = (const char *const *)environ;
    memset(out, 0, sizeof *out);
    out->struct_size = sizeof *out;
    out->rank = out->size = out->local_rank = out->local_size = out->nodes = -1;
    return detect(&r, options, out);
}

const char *sumo_launcher_name(sumo_launcher launcher)
{
    switch (launcher) {
    case SUMO_LAUNCHER_NONE: return "none";
    case SUMO_LAUNCHER_OPEN_MPI: return "mpirun";
    case SUMO_LAUNCHER_PMI: return "an MPI launcher (PMI)";
    case SUMO_LAUNCHER_PMIX: return "an MPI launcher (PMIx)";
    case SUMO_LAUNCHER_SRUN: return "srun";
    case SUMO_LAUNCHER_TORCHRUN: return "torchrun";
    case SUMO_LAUNCHER_ENV: return "RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT";
    case SUMO_LAUNCHER_STORE: return "a store";
    case SUMO_LAUNCHER_UNSUPPORTED: return "a launcher sumo does not join";
    }
    return "an unknown launcher";
}
