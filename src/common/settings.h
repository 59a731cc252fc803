/*
 * Every environment variable sumo reads, in one table: its type, range, default and meaning,
 * read through one parser that refuses a malformed value by name ("SUMO_X='...' is not ...:
 * expected ..."). A value is read where it is used (a constructor, a transport's creation) and
 * kept in the handle that uses it, never in a global. `sumo environment` and docs/settings.md
 * list this table; tests/unit/test_tool.c holds the two together.
 *
 * Only sumo.h and plugin_api.h are included: common.c includes this header, so it cannot
 * include common.h.
 */
#ifndef SUMO_SETTINGS_H
#define SUMO_SETTINGS_H

#include "sumo.h"
#include "common/plugin_api.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum sumo__setting_id {
    SUMO__SETTING_TIMEOUT,
    SUMO__SETTING_DEBUG,
    SUMO__SETTING_SHM_STAGE_BYTES,
    SUMO__SETTING_SHM_NAMED,
    SUMO__SETTING_MPI_SHM,
    SUMO__SETTING_NCCL_LIBRARY,
    SUMO__SETTING_FUSION_THRESHOLD,
    SUMO__SETTING_TEST_EXIT_DURING_SAVE,
    SUMO__SETTING_LOCAL_SIZE,
    SUMO__SETTING_LIVENESS_TIMEOUT,
    SUMO__SETTING_SOCKET_IFNAME,
    SUMO__SETTING_KERNEL_ISA,
    SUMO__SETTING_HIER_CHUNK_BYTES,
    SUMO__SETTING_COUNT
} sumo__setting_id;

typedef enum sumo__setting_type {
    SUMO__SETTING_NUMBER,  /* a decimal number with min < x <= max */
    SUMO__SETTING_INTEGER, /* a whole number, min <= x <= max, rounded down to a multiple of step */
    SUMO__SETTING_SWITCH,  /* 0 or 1 */
    SUMO__SETTING_CHOICE,  /* one of choices, in any case; the value is its index */
    SUMO__SETTING_TEXT     /* anything (a path): never refused */
} sumo__setting_type;

typedef struct sumo__setting {
    const char *name;
    sumo__setting_type type;
    const char *noun;           /* what a value is ("a deadline"): a refused one "is not" that */
    const char *unit;           /* what the number counts, or what the text names */
    double min, max;            /* NUMBER, INTEGER */
    int64_t step;               /* INTEGER: 0 or 1 for none */
    const char *const *choices; /* CHOICE: upper case, NULL-terminated */
    const char *fallback;       /* the value when unset or empty, as written; NULL: none */
    const char *alias;          /* another framework's name for it, read in its place when it
                                   is unset or empty (refused by that name); NULL: none */
    const char *doc;            /* what it does and what reads it */
} sumo__setting;

typedef struct sumo__setting_value {
    bool set;         /* the environment gives it (set and not empty) */
    double number;    /* NUMBER */
    int64_t integer;  /* INTEGER (rounded), SWITCH, CHOICE (the index) */
    const char *text; /* as written (a CHOICE as the table spells it), the fallback, or NULL */
} sumo__setting_value;

const sumo__setting *sumo__setting_info(sumo__setting_id id);

/* The widest of SUMO_KERNEL_ISA's choices this CPU and OS run: 0 portable, 1 AVX2 (with FMA
 * and F16C), 2 AVX-512F; the kernels' sumo__isa counts alike. Asked of libgcc's CPU model on
 * every call (a few loads), so that no state of ours is kept. A choice above it is refused. */
int sumo__cpu_isa_level(void);

/* What a value must be, as the refusal and the lists say it ("seconds, a number > 0 and <=
 * 100000000"). */
void sumo__setting_accepts(const sumo__setting *s, char *out, size_t bytes);

/* Reads setting id from the environment (its alias where it is unset or empty), or its
 * fallback when both are. A malformed or out-of-range value is SUMO_ERR_INVALID_ARGUMENT with
 * a sentence in why (may be NULL) naming the variable read, its value and what is accepted. */
SUMO__PLUGIN_API sumo_result sumo__setting_read(sumo__setting_id id, sumo__setting_value *value, char *why,
                                                size_t why_bytes);

#endif
