#include "common/settings.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const log_levels[] = {"NONE", "WARN", "INFO", NULL};
/* In the order of the kernels' sumo__isa (kernels_isa.h): a choice's index is its path. */
static const char *const kernel_isas[] = {"PORTABLE", "AVX2", "AVX512", NULL};

static const sumo__setting table[SUMO__SETTING_COUNT] = {
    [SUMO__SETTING_TIMEOUT] = {
        .name = "SUMO_TIMEOUT", .type = SUMO__SETTING_NUMBER, .noun = "a deadline",
        .unit = "seconds",
        /* The bound keeps deadlines (now + timeout in int64 nanoseconds) from overflowing. */
        .min = 0, .max = 1e8, .fallback = "300",
        .doc = "The deadline of every wait: a peer that has not arrived by then makes a "
               "collective, or a communicator's creation, fail with SUMO_ERR_TIMEOUT. Read by "
               "every communicator constructor, and by `sumo train` before its worker threads "
               "start (how long a joining thread waits for its step); sumo_comm_set_timeout "
               "changes it per handle."},
    [SUMO__SETTING_DEBUG] = {
        .name = "SUMO_DEBUG", .type = SUMO__SETTING_CHOICE, .noun = "a log level",
        .choices = log_levels, .fallback = "NONE",
        .doc = "WARN prints a file:line trail of each failure on stderr, INFO also each "
               "algorithm choice. Read by every communicator constructor, "
               "sumo_optimizer_create and the CUDA plugin."},
    [SUMO__SETTING_SHM_STAGE_BYTES] = {
        .name = "SUMO_SHM_STAGE_BYTES", .type = SUMO__SETTING_INTEGER, .noun = "a staging size",
        .unit = "bytes", .min = 8192, .max = 1 << 30, .step = 4096, .fallback = "524288",
        .doc = "Each rank's staging area in shared memory: the shm transport's where "
               "sumo_shm_options.stage_bytes is 0 (rank 0 reads it), the MPI transport's on "
               "one node (every rank reads it, rank 0's counts)."},
    [SUMO__SETTING_SHM_NAMED] = {
        .name = "SUMO_SHM_NAMED", .type = SUMO__SETTING_SWITCH, .noun = "a switch",
        .fallback = "0",
        .doc = "1: rank 0 of the shm transport makes a named POSIX shared-memory object instead "
               "of a memfd (the fallback where peers cannot open the memfd; for testing it)."},
    [SUMO__SETTING_MPI_SHM] = {
        .name = "SUMO_MPI_SHM", .type = SUMO__SETTING_SWITCH, .noun = "a switch",
        .fallback = "1",
        .doc = "0: the MPI transport keeps to point-to-point messages on one node, without a "
               "shared window (to measure the network path); the window is used only where "
               "every rank leaves it 1. Read by sumo_comm_create_mpi on every rank."},
    [SUMO__SETTING_NCCL_LIBRARY] = {
        .name = "SUMO_NCCL_LIBRARY", .type = SUMO__SETTING_TEXT, .noun = "a path",
        .unit = "a library's file name or path",
        .doc = "The NCCL the CUDA plugin loads when the process has none loaded yet; unset: "
               "libnccl.so.2 from the loader's path."},
    [SUMO__SETTING_FUSION_THRESHOLD] = {
        .name = "SUMO_FUSION_THRESHOLD", .type = SUMO__SETTING_INTEGER, .noun = "a byte count",
        .unit = "bytes", .min = 0, .max = 1099511627776.0, .fallback = "67108864",
        .alias = "HOROVOD_FUSION_THRESHOLD",
        .doc = "sumo.torch's tensor fusion: allreduce_async calls of one dtype and op are packed "
               "in order into buffers of up to this many bytes, each one collective; 0: each "
               "call is its own collective. Unset, HOROVOD_FUSION_THRESHOLD is read in its "
               "place. Set it alike on every rank (docs/torch.md, \"Tensor fusion\")."},
    [SUMO__SETTING_TEST_EXIT_DURING_SAVE] = {
        .name = "SUMO_TEST_EXIT_DURING_SAVE", .type = SUMO__SETTING_INTEGER, .noun = "a step",
        .unit = "a training step", .min = 0, .max = 1e9,
        .doc = "A test hook, only in the crash-test build of the sumo command (tests/cli): the "
               "process exits halfway through writing the checkpoint of this step."},
    [SUMO__SETTING_LOCAL_SIZE] = {
        .name = "SUMO_LOCAL_SIZE", .type = SUMO__SETTING_INTEGER, .noun = "a host size",
        .unit = "ranks per host", .min = 1, .max = 256,
        .doc = "sumo.torch over a process group: hosts of this many consecutive ranks (the "
               "last may hold fewer) instead of the hosts the ranks run on, so one machine "
               "runs the two-level communicator across hosts (docs/torch/launching.md). Read "
               "by sumo.torch.init on every rank; unset: the real hosts."},
    [SUMO__SETTING_LIVENESS_TIMEOUT] = {
        .name = "SUMO_LIVENESS_TIMEOUT", .type = SUMO__SETTING_NUMBER, .noun = "a deadline",
        .unit = "seconds", .min = 0, .max = 1e6, .fallback = "5",
        .doc = "Across hosts, where no process sees another's end: a process whose heartbeat "
               "in the store has not changed for this long is taken for dead by the survivors' "
               "agreement and by the TCP meeting of their next communicator (the alive_s of "
               "sumo_store_agree, sumo_tcp_options and sumo_elastic_options where 0; an elastic "
               "job's processes, sumo.torch's and sumo train --store's, beat every tenth of "
               "it). Shorter finds a "
               "lost process sooner and risks leaving out one that is only stalled."},
    [SUMO__SETTING_SOCKET_IFNAME] = {
        .name = "SUMO_SOCKET_IFNAME", .type = SUMO__SETTING_TEXT, .noun = "an interface name",
        .unit = "a network interface",
        .doc = "The network interface whose address sumo's TCP transport listens on and "
               "gives its peers, as `ip link` names it (ib0, eth1) or a prefix of the name "
               "(eth): its first IPv4 address, else its first IPv6 one, as "
               "NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME choose for their libraries. Read by "
               "sumo_comm_create_tcp where sumo_tcp_options.address is NULL; unset: the "
               "address through which the host reaches the store's (route_host), else the "
               "host name's first one that is not a loopback one."},
    [SUMO__SETTING_KERNEL_ISA] = {
        .name = "SUMO_KERNEL_ISA", .type = SUMO__SETTING_CHOICE, .noun = "an instruction set",
        .choices = kernel_isas,
        .doc = "The instruction set of sumo's host kernels, in place of the widest this CPU "
               "runs (unset): one the CPU lacks is refused by name. The order of the dot "
               "products and Gram sums of Adasum and ACGA follows the vector width, so a run "
               "forced to the set a result was recorded with gives that result's bits on "
               "another CPU (scripts/check-recorded); the other kernels give the same bits on "
               "every set. Read by every communicator constructor and by each kernel call."},
    [SUMO__SETTING_HIER_CHUNK_BYTES] = {
        .name = "SUMO_HIER_CHUNK_BYTES", .type = SUMO__SETTING_INTEGER, .noun = "a chunk size",
        .unit = "bytes", .min = 4096, .max = 1 << 30, .step = 64, .fallback = "4194304",
        .doc = "A two-level communicator's chain (SUMO_ALGORITHM_CHAIN): the bytes of the "
               "partial sum, in the accumulation type, that one node passes to the next at a "
               "time, while it adds the following chunk. Read by sumo_comm_create_hier."},
};

int sumo__cpu_isa_level(void)
{
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
    /* Idempotent and cheap; needed only when called before libgcc's own constructor ran. The
     * avx512f bit is set only when the OS saves zmm state, so this is also the XCR0 check. */
    __builtin_cpu_init();
#ifdef __clang__ /* knows no "f16c" here; every AVX2 CPU has F16C anyway */
    const int f16c = 1;
#else
    const int f16c = __builtin_cpu_supports("f16c");
#endif
    const int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
    if (avx2 && __builtin_cpu_supports("avx512f")) return 2;
    if (avx2) return 1;
#endif
    return 0;
}

const sumo__setting *sumo__setting_info(sumo__setting_id id)
{
    return (unsigned)id < SUMO__SETTING_COUNT ? &table[id] : NULL;
}

/* A bound as a person writes it: whole numbers in full (1073741824), others as %g. */
static void bound(double x, char *out, size_t bytes)
{
    if (x == (double)(long long)x && x < 1e15 && x > -1e15) snprintf(out, bytes, "%.0f", x);
    else snprintf(out, bytes, "%g", x);
}

void sumo__setting_accepts(const sumo__setting *s, char *out, size_t bytes)
{
    char lo[32], hi[32];
    bound(s->min, lo, sizeof lo);
    bound(s->max, hi, sizeof hi);
    switch (s->type) {
    case SUMO__SETTING_NUMBER:
        snprintf(out, bytes, "%s, a number > %s and <= %s", s->unit, lo, hi);
        return;
    case SUMO__SETTING_INTEGER:
        if (s->step > 1)
            snprintf(out, bytes, "%s, a whole number in %s .. %s, rounded down to a multiple of "
                     "%lld", s->unit, lo, hi, (long long)s->step);
        else snprintf(out, bytes, "%s, a whole number in %s .. %s", s->unit, lo, hi);
        return;
    case SUMO__SETTING_SWITCH: snprintf(out, bytes, "0 or 1"); return;
    case SUMO__SETTING_CHOICE: {
        size_t n = 0, used = 0;
        while (s->choices[n]) n++;
        out[0] = '\0';
        for (size_t i = 0; i < n && used < bytes; i++)
            used += (size_t)snprintf(out + used, bytes - used, "%s%s",
                                     i == 0 ? "" : i + 1 == n ? " or " : ", ", s->choices[i]);
        if (used < bytes) snprintf(out + used, bytes - used, ", in any case");
        return;
    }
    case SUMO__SETTING_TEXT: snprintf(out, bytes, "%s", s->unit); return;
    }
}

/* ASCII only: a locale must not change which names match. */
static bool same_letters(const char *a, const char *b)
{
    for (; *a && *b; a++, b++) {
        char x = *a >= 'a' && *a <= 'z' ? (char)(*a - 'a' + 'A') : *a;
        char y = *b >= 'a' && *b <= 'z' ? (char)(*b - 'a' + 'A') : *b;
        if (x != y) return false;
    }
    return *a == *b;
}

static bool parse(const sumo__setting *s, const char *text, sumo__setting_value *v)
{
    char *end = NULL;
    errno = 0;
    switch (s->type) {
    case SUMO__SETTING_NUMBER: {
        double x = strtod(text, &end);
        if (errno != 0 || end == text || *end != '\0' || !(x > s->min) || x > s->max) return false;
        v->number = x;
        return true;
    }
    case SUMO__SETTING_INTEGER: {
        long long x = strtoll(text, &end, 10);
        if (errno != 0 || end == text || *end != '\0' || (double)x < s->min || (double)x > s->max)
            return false;
        v->integer = s->step > 1 ? x / s->step * s->step : x;
        return true;
    }
    case SUMO__SETTING_SWITCH:
        if ((text[0] != '0' && text[0] != '1') || text[1] != '\0') return false;
        v->integer = text[0] - '0';
        return true;
    case SUMO__SETTING_CHOICE:
        for (int i = 0; s->choices[i]; i++)
            if (same_letters(text, s->choices[i])) {
                v->integer = i;
                v->text = s->choices[i];
                return true;
            }
        return false;
    case SUMO__SETTING_TEXT: return true;
    }
    return false;
}

sumo_result sumo__setting_read(sumo__setting_id id, sumo__setting_value *value, char *why,
                               size_t why_bytes)
{
    const sumo__setting *s = sumo__setting_info(id);
    *value = (sumo__setting_value){0};
    if (s == NULL) {
        if (why) snprintf(why, why_bytes, "setting %d is not in sumo's table", (int)id);
        return SUMO_ERR_INTERNAL;
    }
    const char *name = s->name, *text = getenv(name);
    value->set = text != NULL && *text != '\0';
    if (!value->set && s->alias) {
        name = s->alias;
        text = getenv(name);
        value->set = text != NULL && *text != '\0';
    }
    if (!value->set) text = s->fallback;
    if (text == NULL) return SUMO_SUCCESS;
    value->text = text;
    if (parse(s, text, value)) {
        if (id != SUMO__SETTING_KERNEL_ISA || value->integer <= sumo__cpu_isa_level())
            return SUMO_SUCCESS;
        if (why)
            snprintf(why, why_bytes, "%s='%.64s' is an instruction set this CPU lacks: it runs "
                     "%s (unset or empty: the widest of them)", name, text,
                     sumo__cpu_isa_level() == 2 ? "PORTABLE, AVX2 or AVX512"
                     : sumo__cpu_isa_level() == 1 ? "PORTABLE or AVX2" : "PORTABLE alone");
        return SUMO_ERR_INVALID_ARGUMENT;
    }
    if (why) {
        char accepts[160], unset[120];
        sumo__setting_accepts(s, accepts, sizeof accepts);
        if (name == s->alias)
            snprintf(unset, sizeof unset, "read where %s is unset; both unset or empty: %s",
                     s->name, s->fallback ? s->fallback : "none");
        else
            snprintf(unset, sizeof unset, "unset or empty: %s", s->fallback ? s->fallback : "none");
        snprintf(why, why_bytes, "%s='%.64s' is not %s: expected %s (%s)", name, text, s->noun,
                 accepts, unset);
    }
    return SUMO_ERR_INVALID_ARGUMENT;
}

sumo_result sumo_setting(const char *name, const char **value)
{
    if (value) *value = NULL;
    if (name == NULL || value == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    for (int id = 0; id < SUMO__SETTING_COUNT; id++) {
        if (strcmp(table[id].name, name) != 0) continue;
        sumo__setting_value v;
        sumo_result r = sumo__setting_read((sumo__setting_id)id, &v, NULL, 0);
        if (r == SUMO_SUCCESS) *value = v.text;
        return r;
    }
    return SUMO_ERR_INVALID_ARGUMENT;
}

sumo_result sumo_setting_describe(int index, const char **name, char *accepts, size_t bytes,
                                  const char **fallback, const char **doc)
{
    const sumo__setting *s = index >= 0 ? sumo__setting_info((sumo__setting_id)index) : NULL;
    if (s == NULL) return SUMO_ERR_INVALID_ARGUMENT;
    if (name) *name = s->name;
    if (accepts && bytes) sumo__setting_accepts(s, accepts, bytes);
    if (fallback) *fallback = s->fallback;
    if (doc) *doc = s->doc;
    return SUMO_SUCCESS;
}

sumo_result sumo_env_check(char *message, size_t bytes)
{
    char why[256] = "";
    sumo_result r = SUMO_SUCCESS;
    for (int id = 0; id < SUMO__SETTING_COUNT && r == SUMO_SUCCESS; id++) {
        sumo__setting_value v;
        r = sumo__setting_read((sumo__setting_id)id, &v, why, sizeof why);
    }
    if (message && bytes) snprintf(message, bytes, "%s", why);
    return r;
}
