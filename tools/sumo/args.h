/*
 * Flag values of every `sumo` subcommand, parsed one way: the whole string must be a number
 * in the flag's range, or the parse fails with a message that names the flag, the value and
 * the range. Nothing wraps, nothing is silently clamped.
 */
#ifndef SUMO_TOOL_ARGS_H
#define SUMO_TOOL_ARGS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Where a parse failure is described; print it with the subcommand's name in front. */
typedef struct sumo_args_error {
    char message[256];
} sumo_args_error;

/* A decimal integer in [lo, hi]. */
bool sumo_args_int64(const char *flag, const char *value, int64_t lo, int64_t hi, int64_t *out,
                     sumo_args_error *err);
bool sumo_args_int(const char *flag, const char *value, int lo, int hi, int *out,
                   sumo_args_error *err);
/* A decimal unsigned 64-bit integer (seeds: every value is valid, but only digits are). */
bool sumo_args_uint64(const char *flag, const char *value, uint64_t *out, sumo_args_error *err);
/* A finite number in [lo, hi]; lo_open / hi_open exclude the bound itself. */
bool sumo_args_double(const char *flag, const char *value, double lo, bool lo_open, double hi,
                      bool hi_open, double *out, sumo_args_error *err);
/* A size in bytes with an optional binary suffix K, M or G (also KiB-style "4K"), in [lo, hi]. */
bool sumo_args_bytes(const char *flag, const char *value, size_t lo, size_t hi, size_t *out,
                     sumo_args_error *err);

#endif
