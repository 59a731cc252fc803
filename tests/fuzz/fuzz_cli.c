/*
 * libFuzzer harness for the command-line parser of `sumo train` (tools/sumo/train_options.c)
 * and the shared flag parsers of tools/sumo/args.c.
 *
 * Input: NUL-separated arguments. The first byte picks the target: even, `sumo train ARGS`
 * through train_parse_options(), which must accept or refuse without reading out of bounds,
 * overflowing or leaving an accepted value outside its documented range; odd, each argument
 * through every sumo_args_* function.
 */
#include "../../tools/sumo/args.h"
#include "../../tools/sumo/train_options.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_ARGS 64

static void check_accepted(const train_options *o)
{
    const sumo__train_config *c = &o->cfg;
    if (c->workers < 1 || c->workers > SUMO_THREADS_MAX_RANKS) __builtin_trap();
    if (c->batch < 1 || c->batch > MAX_BATCH || c->epochs < 1 || c->epochs > MAX_EPOCHS) __builtin_trap();
    if (!(c->lr > 0 && c->lr <= MAX_LR)) __builtin_trap();
    if (o->nmethods < 1 || o->nmethods > MAX_METHODS) __builtin_trap();
    if ((c->resume || c->keep != 2 || o->overwrite) && c->checkpoint_dir == NULL) __builtin_trap();
    /* A method's own flag is accepted only where a chosen method reads it. */
    int nflags;
    const sumo__method_flag *t = sumo__method_flags(&nflags);
    unsigned chosen = 0;
    for (int k = 0; k < o->nmethods; k++) chosen |= SUMO__METHOD_BIT(o->methods[k]);
    for (int f = 0; f < nflags; f++)
        if ((o->specific_given >> f & 1) && !(t[f].methods & chosen)) __builtin_trap();
    for (int k = 0; k < o->nmethods; k++) {
        sumo__train_config mc;
        /* A combination of values one method cannot take (--fragments above --sync-every, ...)
         * is refused here, naming the flags: a refusal like the parse's. */
        int rc = train_configure_method(o, o->methods[k], o->scalings[k], &mc);
        if (rc == 2) continue;
        if (rc != 0 || !(mc.lr_scale > 0)) __builtin_trap();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || size > 4096) return 0;
    char *buf = malloc(size + 1);
    if (buf == NULL) return 0;
    memcpy(buf, data + 1, size - 1);
    buf[size - 1] = '\0';
    char *argv[MAX_ARGS + 2];
    int argc = 0;
    argv[argc++] = "train";
    for (char *p = buf; p < buf + size - 1 && argc <= MAX_ARGS; p += strlen(p) + 1) argv[argc++] = p;
    argv[argc] = NULL;
    if (data[0] % 2 == 0) {
        train_options o;
        memset(&o, 0, sizeof o);
        if (train_parse_options(argc, argv, &o) == 0) check_accepted(&o);
    } else {
        sumo_args_error e;
        for (int i = 1; i < argc; i++) {
            int64_t l;
            int n;
            uint64_t u;
            double d;
            size_t z;
            if (sumo_args_int64("--x", argv[i], -5, 5000, &l, &e) && (l < -5 || l > 5000)) __builtin_trap();
            if (sumo_args_int("--x", argv[i], 1, 1024, &n, &e) && (n < 1 || n > 1024)) __builtin_trap();
            sumo_args_uint64("--x", argv[i], &u, &e);
            if (sumo_args_double("--x", argv[i], 0, true, 1, false, &d, &e) && !(d > 0 && d <= 1)) __builtin_trap();
            if (sumo_args_bytes("--x", argv[i], 4, (size_t)1 << 30, &z, &e) && (z < 4 || z > (size_t)1 << 30))
                __builtin_trap();
        }
    }
    free(buf);
    return 0;
}
