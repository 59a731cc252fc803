#include "common/common.h"
#include "common/settings.h"
#include "sumo_aggregation.h"
#include "sumo_bootstrap.h"
#include "sumo_diloco.h"
#include "sumo_distributed.h"
#include "sumo_elastic.h"
#include "sumo_gossip.h"
#include "sumo_optim.h"
#include "sumo_shm.h"
#include "sumo_tcp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *const result_messages[SUMO_RESULT_COUNT] = {
    [SUMO_SUCCESS] = "success",
    [SUMO_ERR_INVALID_ARGUMENT] = "invalid argument (NULL or overlapping buffer, unknown dtype "
                                  "or op, rank out of range)",
    [SUMO_ERR_INVALID_USAGE] = "invalid usage (the call is not allowed in this state)",
    [SUMO_ERR_MISMATCH] = "ranks disagree on the collective's arguments (count, dtype, op, root "
                          "or layout)",
    [SUMO_ERR_TIMEOUT] = "a peer did not arrive before the deadline (see sumo_comm_set_timeout)",
    [SUMO_ERR_PEER_FAILURE] = "a peer failed, left or timed out; the communicator is unusable",
    [SUMO_ERR_SYSTEM] = "system error (memory, threads or shared memory)",
    [SUMO_ERR_INTERNAL] = "internal error in sumo or the transport below it",
    [SUMO_IN_PROGRESS] = "the request is still in progress",
    [SUMO_ERR_NONFINITE] = "NaN or Inf in a tensor: its result is NaN, the others are exact "
                           "(sumo_comm_error_message names it)",
};

static const char *const result_names[SUMO_RESULT_COUNT] = {
    [SUMO_SUCCESS] = "SUMO_SUCCESS",
    [SUMO_ERR_INVALID_ARGUMENT] = "SUMO_ERR_INVALID_ARGUMENT",
    [SUMO_ERR_INVALID_USAGE] = "SUMO_ERR_INVALID_USAGE",
    [SUMO_ERR_MISMATCH] = "SUMO_ERR_MISMATCH",
    [SUMO_ERR_TIMEOUT] = "SUMO_ERR_TIMEOUT",
    [SUMO_ERR_PEER_FAILURE] = "SUMO_ERR_PEER_FAILURE",
    [SUMO_ERR_SYSTEM] = "SUMO_ERR_SYSTEM",
    [SUMO_ERR_INTERNAL] = "SUMO_ERR_INTERNAL",
    [SUMO_IN_PROGRESS] = "SUMO_IN_PROGRESS",
    [SUMO_ERR_NONFINITE] = "SUMO_ERR_NONFINITE",
};

const char *sumo_strerror(sumo_result r)
{
    if ((unsigned)r >= SUMO_RESULT_COUNT) return "unknown sumo_result value";
    return result_messages[r];
}

const char *sumo_result_name(sumo_result r)
{
    if ((unsigned)r >= SUMO_RESULT_COUNT) return "SUMO_RESULT_UNKNOWN";
    return result_names[r];
}

sumo_result sumo_dtype_size(sumo_dtype dtype, size_t *size)
{
    if (size == NULL || !sumo__dtype_valid(dtype)) return SUMO_ERR_INVALID_ARGUMENT;
    *size = sumo__dtype_bytes(dtype);
    return SUMO_SUCCESS;
}

const char *sumo_dtype_name(sumo_dtype dtype)
{
    switch (dtype) {
    case SUMO_FLOAT32: return "fp32";
    case SUMO_FLOAT64: return "fp64";
    case SUMO_FLOAT16: return "fp16";
    case SUMO_BFLOAT16: return "bf16";
    default: return "unknown-dtype";
    }
}

const char *sumo__op_name(sumo_op op)
{
    switch (op) {
    case SUMO_OP_SUM: return "sum";
    case SUMO_OP_AVERAGE: return "average";
    case SUMO_OP_ADASUM: return "adasum";
    default: return "created-op";
    }
}

const char *sumo__struct_size_problem(size_t given, size_t expected, const char *sentence,
                                      char *why, size_t why_bytes)
{
    if (given == expected) return NULL;
    if (why == NULL || why_bytes == 0) return sentence;
    snprintf(why, why_bytes, "%s (%zu given, %zu here)", sentence, given, expected);
    return why;
}

sumo_result sumo__env_read(sumo__env *env, char *why, size_t why_bytes)
{
    sumo__setting_value v;
    SUMO__CHECK(sumo__setting_read(SUMO__SETTING_DEBUG, &v, why, why_bytes));
    env->log_level = (int)v.integer;
    SUMO__CHECK(sumo__setting_read(SUMO__SETTING_TIMEOUT, &v, why, why_bytes));
    env->timeout_s = v.number;
    /* Read by each kernel call; refused here, where a constructor can still say why. */
    SUMO__CHECK(sumo__setting_read(SUMO__SETTING_KERNEL_ISA, &v, why, why_bytes));
    return SUMO_SUCCESS;
}

sumo_result sumo__env_for_create(sumo__env *env)
{
    char why[256];
    sumo_result r = sumo__env_read(env, why, sizeof why);
    if (r != SUMO_SUCCESS) fprintf(stderr, "sumo: %s\n", why);
    return r;
}

sumo_result sumo__log_level_for_create(int *level)
{
    char why[256];
    sumo__setting_value v;
    sumo_result r = sumo__setting_read(SUMO__SETTING_DEBUG, &v, why, sizeof why);
    if (r != SUMO_SUCCESS) fprintf(stderr, "sumo: %s\n", why);
    *level = r == SUMO_SUCCESS ? (int)v.integer : SUMO__LOG_NONE;
    return r;
}

void sumo__log(int threshold, int level, const char *file, int line, const char *fmt, ...)
{
    if (level > threshold || level == SUMO__LOG_NONE) return;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    /* One fprintf so concurrent ranks do not interleave within a line. */
    fprintf(stderr, "sumo %s %s:%d %s\n", level == SUMO__LOG_WARN ? "WARN" : "INFO", file, line,
            msg);
}

int64_t sumo__now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

sumo_result sumo_version(int *major, int *minor, int *patch)
{
    if (major) *major = SUMO_VERSION_MAJOR;
    if (minor) *minor = SUMO_VERSION_MINOR;
    if (patch) *patch = SUMO_VERSION_PATCH;
    return SUMO_SUCCESS;
}

/* The tables a binding checks its hand-made mirror of the headers against: a struct's size or
 * a constant's value, under its C name, as this build compiled it. */
typedef struct abi_entry {
    const char *name;
    int64_t value;
} abi_entry;

static bool abi_find(const abi_entry *table, size_t n, const char *name, int64_t *value)
{
    for (size_t i = 0; name != NULL && i < n; i++)
        if (strcmp(table[i].name, name) == 0) {
            *value = table[i].value;
            return true;
        }
    return false;
}

sumo_result sumo_struct_size(const char *name, size_t *bytes)
{
#define SIZE_OF(type) {#type, (int64_t)sizeof(type)}
    static const abi_entry sizes[] = {
        SIZE_OF(sumo_adasum_options), SIZE_OF(sumo_acga_options), SIZE_OF(sumo_aggregator_options),
        SIZE_OF(sumo_comm_stats), SIZE_OF(sumo_optimizer_options), SIZE_OF(sumo_lr_schedule),
        SIZE_OF(sumo_distributed_options),
        SIZE_OF(sumo_kernel_table), SIZE_OF(sumo_collective), SIZE_OF(sumo_transport_ops),
        SIZE_OF(sumo_transport_desc), SIZE_OF(sumo_shm_options), SIZE_OF(sumo_store),
        SIZE_OF(sumo_compression), SIZE_OF(sumo_diloco_options), SIZE_OF(sumo_gossip_options), SIZE_OF(sumo_outer_step),
        SIZE_OF(sumo_shrink_options), SIZE_OF(sumo_shrink_info), SIZE_OF(sumo_agree_options),
        SIZE_OF(sumo_tcp_options), SIZE_OF(sumo_bootstrap_options), SIZE_OF(sumo_bootstrap),
        SIZE_OF(sumo_heart_options), SIZE_OF(sumo_commit_options), SIZE_OF(sumo_elastic_options),
        SIZE_OF(sumo_elastic_making), SIZE_OF(sumo_hier_options),
    };
#undef SIZE_OF
    int64_t v;
    if (bytes == NULL || !abi_find(sizes, sizeof sizes / sizeof sizes[0], name, &v))
        return SUMO_ERR_INVALID_ARGUMENT;
    *bytes = (size_t)v;
    return SUMO_SUCCESS;
}

sumo_result sumo_enum_value(const char *name, int64_t *value)
{
#define VALUE(constant) {#constant, (int64_t)(constant)}
    static const abi_entry values[] = {
        VALUE(SUMO_SUCCESS), VALUE(SUMO_ERR_INVALID_ARGUMENT), VALUE(SUMO_ERR_INVALID_USAGE),
        VALUE(SUMO_ERR_MISMATCH), VALUE(SUMO_ERR_TIMEOUT), VALUE(SUMO_ERR_PEER_FAILURE),
        VALUE(SUMO_ERR_SYSTEM), VALUE(SUMO_ERR_INTERNAL), VALUE(SUMO_IN_PROGRESS),
        VALUE(SUMO_ERR_NONFINITE),
        VALUE(SUMO_FLOAT32), VALUE(SUMO_FLOAT64), VALUE(SUMO_FLOAT16), VALUE(SUMO_BFLOAT16),
        VALUE(SUMO_OP_SUM), VALUE(SUMO_OP_AVERAGE), VALUE(SUMO_OP_ADASUM),
        VALUE(SUMO_PARAM_ALGORITHM), VALUE(SUMO_PARAM_RESTORE_ON_FAILURE),
        VALUE(SUMO_ALGORITHM_AUTO), VALUE(SUMO_ALGORITHM_SHARED_MEMORY),
        VALUE(SUMO_ALGORITHM_RING), VALUE(SUMO_ALGORITHM_RECURSIVE_DOUBLING),
        VALUE(SUMO_ALGORITHM_PEER), VALUE(SUMO_ALGORITHM_RANKED), VALUE(SUMO_ALGORITHM_CHAIN),
        VALUE(SUMO_ALGORITHM_TWO_LEVEL),
        VALUE(SUMO_COMPRESS_NONE), VALUE(SUMO_COMPRESS_BF16), VALUE(SUMO_COMPRESS_FP8_E4M3),
        VALUE(SUMO_COMPRESS_E3M0),
        VALUE(SUMO_AGGREGATE_SUM), VALUE(SUMO_AGGREGATE_AVERAGE), VALUE(SUMO_AGGREGATE_ADASUM),
        VALUE(SUMO_AGGREGATE_ACGA),
        VALUE(SUMO_OUTER_NESTEROV), VALUE(SUMO_OUTER_HEAVY_BALL),
        VALUE(SUMO_COMBINE_AVERAGE), VALUE(SUMO_COMBINE_ADASUM), VALUE(SUMO_COMBINE_ACGA),
        VALUE(SUMO_DILOCO_PRESET_DILOCO), VALUE(SUMO_DILOCO_PRESET_STREAMING),
        VALUE(SUMO_DILOCO_PRESET_LOCALSGD), VALUE(SUMO_DILOCO_PRESET_SLOWMO),
        VALUE(SUMO_DILOCO_PRESET_BMUF), VALUE(SUMO_DILOCO_PRESET_SGP), VALUE(SUMO_DILOCO_PRESET_OSGP),
        VALUE(SUMO_DILOCO_PRESET_DPSGD), VALUE(SUMO_DILOCO_PRESET_SLOWMO_SGP), VALUE(SUMO_BASE_LOCAL),
        VALUE(SUMO_BASE_SGP), VALUE(SUMO_BASE_OSGP), VALUE(SUMO_BASE_DPSGD),
        VALUE(SUMO_GOSSIP_PUSH_SUM), VALUE(SUMO_GOSSIP_SYMMETRIC),
        VALUE(SUMO_DILOCO_LOCAL), VALUE(SUMO_DILOCO_APPLY), VALUE(SUMO_DILOCO_START),
        VALUE(SUMO_DILOCO_AVERAGE), VALUE(SUMO_SPLIT_TENSORS), VALUE(SUMO_SPLIT_RANGES),
        VALUE(SUMO_UPDATE_GRADIENT), VALUE(SUMO_UPDATE_DELTA), VALUE(SUMO_UPDATE_OUTER),
        VALUE(SUMO_BUFFERS_KEEP), VALUE(SUMO_BUFFERS_RESET), VALUE(SUMO_BUFFERS_AVERAGE),
        VALUE(SUMO_OPTIM_SGD), VALUE(SUMO_OPTIM_ADAM), VALUE(SUMO_OPTIM_ADAMW),
        VALUE(SUMO_OPTIM_LAMB),
        VALUE(SUMO_LR_CONSTANT), VALUE(SUMO_LR_STEP), VALUE(SUMO_LR_COSINE),
        VALUE(SUMO_COLLECTIVE_ALLREDUCE), VALUE(SUMO_COLLECTIVE_BROADCAST),
        VALUE(SUMO_COLLECTIVE_ALLGATHER), VALUE(SUMO_COLLECTIVE_REDUCE_SCATTER),
        VALUE(SUMO_COLLECTIVE_BARRIER),
        VALUE(SUMO_LAUNCHER_NONE), VALUE(SUMO_LAUNCHER_OPEN_MPI), VALUE(SUMO_LAUNCHER_PMI),
        VALUE(SUMO_LAUNCHER_PMIX), VALUE(SUMO_LAUNCHER_SRUN), VALUE(SUMO_LAUNCHER_TORCHRUN),
        VALUE(SUMO_LAUNCHER_ENV), VALUE(SUMO_LAUNCHER_STORE), VALUE(SUMO_LAUNCHER_UNSUPPORTED),
        VALUE(SUMO_ELASTIC_TCP), VALUE(SUMO_ELASTIC_SHM),
    };
#undef VALUE
    if (value == NULL || !abi_find(values, sizeof values / sizeof values[0], name, value))
        return SUMO_ERR_INVALID_ARGUMENT;
    return SUMO_SUCCESS;
}
