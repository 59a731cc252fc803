#include "args.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

static bool fail(sumo_args_error *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static bool fail(sumo_args_error *err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof err->message, fmt, ap);
    va_end(ap);
    return false;
}

/* strtoll/strtoull accept leading blanks and a sign we may not want; be strict. */
static bool starts_like_number(const char *v, bool allow_minus)
{
    if (v == NULL || *v == '\0') return false;
    if (*v == '-') return allow_minus && v[1] >= '0' && v[1] <= '9';
    if (*v == '+') return v[1] >= '0' && v[1] <= '9';
    return *v >= '0' && *v <= '9';
}

bool sumo_args_int64(const char *flag, const char *value, int64_t lo, int64_t hi, int64_t *out,
                     sumo_args_error *err)
{
    if (!starts_like_number(value, true))
        return fail(err, "%s: '%s' is not an integer", flag, value ? value : "");
    errno = 0;
    char *end;
    long long v = strtoll(value, &end, 10);
    if (*end != '\0') return fail(err, "%s: '%s' is not an integer", flag, value);
    if (errno == ERANGE || v < lo || v > hi)
        return fail(err, "%s: %s is out of range (%" PRId64 " to %" PRId64 ")", flag, value, lo, hi);
    *out = (int64_t)v;
    return true;
}

bool sumo_args_int(const char *flag, const char *value, int lo, int hi, int *out,
                   sumo_args_error *err)
{
    int64_t v;
    if (!sumo_args_int64(flag, value, lo, hi, &v, err)) return false;
    *out = (int)v;
    return true;
}

bool sumo_args_uint64(const char *flag, const char *value, uint64_t *out, sumo_args_error *err)
{
    if (!starts_like_number(value, false))
        return fail(err, "%s: '%s' is not a non-negative integer", flag, value ? value : "");
    errno = 0;
    char *end;
    unsigned long long v = strtoull(value, &end, 10);
    if (*end != '\0') return fail(err, "%s: '%s' is not a non-negative integer", flag, value);
    if (errno == ERANGE) return fail(err, "%s: %s is out of range (0 to %" PRIu64 ")", flag, value, UINT64_MAX);
    *out = (uint64_t)v;
    return true;
}

bool sumo_args_double(const char *flag, const char *value, double lo, bool lo_open, double hi,
                      bool hi_open, double *out, sumo_args_error *err)
{
    if (value == NULL || *value == '\0' || *value == ' ')
        return fail(err, "%s: '%s' is not a number", flag, value ? value : "");
    errno = 0;
    char *end;
    double v = strtod(value, &end);
    if (*end != '\0') return fail(err, "%s: '%s' is not a number", flag, value);
    bool below = lo_open ? !(v > lo) : !(v >= lo);
    bool above = hi_open ? !(v < hi) : !(v <= hi);
    if (!isfinite(v) || errno == ERANGE || below || above)
        return fail(err, "%s: %s is out of range (%s%g to %g%s)", flag, value,
                    lo_open ? "above " : "", lo, hi, hi_open ? ", exclusive" : "");
    *out = v;
    return true;
}

bool sumo_args_bytes(const char *flag, const char *value, size_t lo, size_t hi, size_t *out,
                     sumo_args_error *err)
{
    if (!starts_like_number(value, false))
        return fail(err, "%s: '%s' is not a size (bytes, with an optional K, M or G)", flag,
                    value ? value : "");
    errno = 0;
    char *end;
    unsigned long long v = strtoull(value, &end, 10);
    unsigned shift = 0;
    if (*end == 'K' || *end == 'k') shift = 10, end++;
    else if (*end == 'M' || *end == 'm') shift = 20, end++;
    else if (*end == 'G' || *end == 'g') shift = 30, end++;
    if (shift && (*end == 'i' && end[1] == 'B')) end += 2;
    else if (shift && *end == 'B') end++;
    if (*end != '\0')
        return fail(err, "%s: '%s' is not a size (bytes, with an optional K, M or G)", flag, value);
    if (errno == ERANGE || (shift && v > (SIZE_MAX >> shift)) || (v << shift) < lo || (v << shift) > hi)
        return fail(err, "%s: %s is out of range (%zu to %zu bytes)", flag, value, lo, hi);
    *out = (size_t)(v << shift);
    return true;
}
