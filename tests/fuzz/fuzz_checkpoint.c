/*
 * libFuzzer harness for the checkpoint reader (src/train/checkpoint.c): a rank file, the
 * manifest ("latest") and the comparison of stored and current configurations that names
 * the flags a refused resume differs in.
 *
 * Input: one selector byte, then the file's bytes. 0: a rank file (step 5, rank 0 of 1,
 * configuration hash 0x5eed); 1: a manifest read against a fixed configuration; 2: two
 * configuration texts separated by a NUL byte.
 */
#include "train/checkpoint.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char dir[64];

static const char current[] = "--workers 2\n--batch 32\n--lr 0.05\n--reduce avg\n";

static void put(const char *name, const uint8_t *bytes, size_t n)
{
    char path[128];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (f == NULL) abort();
    if (n) fwrite(bytes, 1, n, f);
    fclose(f);
}

/* The scratch folder goes when the fuzzer exits (libFuzzer ends with exit()). */
static void remove_dir(void)
{
    static const char *const names[] = {"step-5.rank-0.ckpt", "latest"};
    char path[128];
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        unlink(path);
    }
    rmdir(dir);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (dir[0] == '\0') {
        snprintf(dir, sizeof dir, "/tmp/sumo-fuzz-ckpt-XXXXXX");
        if (mkdtemp(dir) == NULL) abort();
        atexit(remove_dir);
    }
    if (size < 1 || size > (1u << 20)) return 0;
    char err[1024];
    err[0] = '\0';
    sumo__ckpt_id id = {.dir = dir, .step = 5, .rank = 0, .size = 1, .config_hash = 0x5eed,
                        .config_text = current};
    switch (data[0] % 3) {
    case 0: {
        put("step-5.rank-0.ckpt", data + 1, size - 1);
        void *payload = NULL;
        size_t bytes = 0;
        if (sumo__checkpoint_read_rank(&id, &payload, &bytes, err, sizeof err) == SUMO_SUCCESS) {
            if (bytes && payload == NULL) __builtin_trap();
            free(payload);
        } else if (err[0] == '\0') {
            __builtin_trap();
        }
        break;
    }
    case 1: {
        put("latest", data + 1, size - 1);
        long step = -1;
        if (sumo__checkpoint_read_manifest(&id, &step, err, sizeof err) == SUMO_SUCCESS) {
            if (step < 0) __builtin_trap();
        } else if (err[0] == '\0') {
            __builtin_trap();
        }
        break;
    }
    default: {
        char *copy = malloc(size);
        if (copy == NULL) return 0;
        memcpy(copy, data + 1, size - 1);
        copy[size - 1] = '\0';
        const char *stored = copy, *now = memchr(copy, '\0', size - 1);
        now = now && now < copy + size - 1 ? now + 1 : current;
        char out[512];
        sumo__config_diff(stored, now, out, sizeof out);
        if (strlen(out) >= sizeof out) __builtin_trap();
        free(copy);
        break;
    }
    }
    return 0;
}
