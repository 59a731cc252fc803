#include "common/common.h"

#include <errno.h>
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

const char *sumo__dtype_name(sumo_dtype dtype)
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

int sumo__log_level_from_env(void)
{
    const char *v = getenv("SUMO_DEBUG");
    if (v == NULL || *v == '\0') return SUMO__LOG_NONE;
    if (strcmp(v, "INFO") == 0 || strcmp(v, "info") == 0) return SUMO__LOG_INFO;
    if (strcmp(v, "WARN") == 0 || strcmp(v, "warn") == 0) return SUMO__LOG_WARN;
    return SUMO__LOG_NONE;
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

double sumo__timeout_from_env(double fallback)
{
    const char *v = getenv("SUMO_TIMEOUT");
    if (v == NULL || *v == '\0') return fallback;
    char *end = NULL;
    errno = 0;
    double s = strtod(v, &end);
    /* The bound keeps deadlines (now + timeout in int64 nanoseconds) from overflowing. */
    if (errno != 0 || end == v || *end != '\0' || !(s > 0) || s > 1e8) return fallback;
    return s;
}
