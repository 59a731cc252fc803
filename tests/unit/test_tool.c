/* Smoke test of the `sumo` command: dispatch, usage errors, and a tiny `sumo bench` whose rows
 * are checked against the sequential reference. It runs the binary built beside this test
 * ($(BUILD)/sumo, found from argv[0]) and skips when that was not built. Also the pieces
 * `sumo train` is built from: the flag parsers (tools/sumo/args.c, compiled in here) and the
 * checkpoint folder's housekeeping (keep K, stale temporaries, refused fresh runs, the
 * configuration a refused resume names). */
/* Before cmocka.h, whose fail() macro would rename args.c's helper. */
#include "../../tools/sumo/args.c"
#include "train/checkpoint.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <libgen.h>
#include <sys/stat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static char sumo_path[4096];

/* Runs `sumo ARGS` with stderr folded into stdout; returns the exit status, output in *out. */
static int run_sumo(const char *args, char **out)
{
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "'%s' %s 2>&1", sumo_path, args);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    assert_non_null(buf);
    size_t got;
    while ((got = fread(buf + len, 1, cap - len - 1, p)) > 0) {
        len += got;
        if (cap - len < 4096) {
            cap *= 2;
            buf = realloc(buf, cap);
            assert_non_null(buf);
        }
    }
    buf[len] = '\0';
    int status = pclose(p);
    *out = buf;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static void require_binary(void)
{
    if (access(sumo_path, X_OK) != 0) {
        print_message("no sumo binary at %s: skipped\n", sumo_path);
        skip();
    }
}

static void test_help_lists_bench(void **state)
{
    (void)state;
    require_binary();
    char *out;
    assert_int_equal(run_sumo("help", &out), 0);
    assert_non_null(strstr(out, "bench"));
    free(out);
    assert_int_equal(run_sumo("help bench", &out), 0);
    assert_non_null(strstr(out, "--transport"));
    free(out);
}

static void test_usage_errors(void **state)
{
    (void)state;
    require_binary();
    char *out;
    assert_int_equal(run_sumo("no-such-command", &out), 2);
    free(out);
    assert_int_equal(run_sumo("bench --no-such-option", &out), 2);
    free(out);
    assert_int_equal(run_sumo("bench --min 1M --max 4K", &out), 2);
    free(out);
    assert_int_equal(run_sumo("bench --dtype int8", &out), 2);
    free(out);
    /* A size of 0 used to become 4 B (one element) without a word. */
    assert_int_equal(run_sumo("bench --min 0", &out), 2);
    assert_non_null(strstr(out, "--min"));
    free(out);
    /* An empty list entry is a typo, not a shorter list (the run would otherwise go ahead). */
    assert_int_equal(run_sumo("bench --transport threads --ranks 2,,3 --quick --skip-mem --max 4K "
                              "--iters 1 --warmup 0", &out), 2);
    assert_non_null(strstr(out, "--ranks"));
    free(out);
    assert_int_equal(run_sumo("bench --transport threads --ops sum, --quick --skip-mem --max 4K "
                              "--iters 1 --warmup 0", &out), 2);
    free(out);
    assert_int_equal(run_sumo("bench --shared-buffers --shared-outputs", &out), 2);
    assert_non_null(strstr(out, "exclude"));
    free(out);
}

/* Out of place into sumo_mem_alloc memory: every sum, average and Adasum row checked against
 * the sequential reference, ACGA's measured (its values are the test_acga_* tests'). */
static void test_bench_shared_outputs_checked(void **state)
{
    (void)state;
    require_binary();
    char *out;
    int rc = run_sumo("bench --transport threads --quick --check --ranks 2,3 --max 64K --iters 3 "
                      "--warmup 1 --skip-mem --shared-outputs --ops sum,avg,adasum,acga", &out);
    if (rc != 0) print_message("%s", out);
    assert_int_equal(rc, 0);
    assert_null(strstr(out, "FAIL"));
    assert_null(strstr(out, "SUMO_ERR"));
    int checked = 0, acga_timed = 0;
    for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n")) {
        char op[16], time[32];
        if (line[0] == '#' || sscanf(line, "%*s %*s %*s %15s %31s", op, time) != 2) continue;
        if (strcmp(op, "acga") == 0) acga_timed += atof(time) > 0;
        else if (strstr(line, "exact") || strstr(line, " ok")) checked++;
    }
    assert_int_equal(checked, 3 * 3 * 2); /* 3 ops, 4K, 16K and 64K, on P = 2 and 3 */
    assert_int_equal(acga_timed, 3 * 2);
    free(out);
}

/* Adasum over a layout of tensors (--tensors): every row checked tensor by tensor against the
 * sequential tree, fp32 and bf16, with more tensors than elements at 4K on P = 3 (zero-length
 * tensors). A usage error for 0 tensors. */
static void test_bench_tensors_checked(void **state)
{
    (void)state;
    require_binary();
    char *out;
    assert_int_equal(run_sumo("bench --tensors 0", &out), 2);
    free(out);
    const char *dtypes[] = {"fp32", "bf16"};
    for (int d = 0; d < 2; d++) {
        char args[256];
        snprintf(args, sizeof args,
                 "bench --transport threads --quick --check --ranks 2,3 --max 16K --iters 2 "
                 "--warmup 1 --skip-mem --ops adasum --tensors 1500 --dtype %s", dtypes[d]);
        int rc = run_sumo(args, &out);
        if (rc != 0) print_message("%s", out);
        assert_int_equal(rc, 0);
        assert_non_null(strstr(out, "(adasum: 1500 tensors a call)"));
        assert_null(strstr(out, "FAIL"));
        assert_null(strstr(out, "SUMO_ERR"));
        int checked = 0;
        for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n"))
            if (line[0] != '#' && (strstr(line, "exact") || strstr(line, " ok"))) checked++;
        assert_int_equal(checked, 2 * 2); /* 4K and 16K, on P = 2 and 3 */
        free(out);
    }
}

/* A few sizes on 2 and 3 ranks (3: not a power of two, uneven slices), every row checked,
 * with the memory sections at a size that keeps this fast under sanitizers. */
static void test_bench_quick_checked(void **state)
{
    (void)state;
    require_binary();
    char csv[] = "/tmp/sumo-test-tool-XXXXXX";
    int fd = mkstemp(csv);
    assert_true(fd >= 0);
    close(fd);
    char args[512], *out;
    snprintf(args, sizeof args,
             "bench --transport threads --quick --check --ranks 2,3 --max 64K --iters 3 "
             "--warmup 1 --mem-size 4M --mem-reps 1 --csv %s", csv);
    int rc = run_sumo(args, &out);
    if (rc != 0) print_message("%s", out);
    assert_int_equal(rc, 0);
    assert_non_null(strstr(out, "busbw(GB/s)"));
    assert_non_null(strstr(out, "memory bandwidth"));
    assert_non_null(strstr(out, "derived figures"));
    assert_null(strstr(out, "FAIL"));
    /* A quick run's timings judge no goal: the test log that prints them must not say
     * "NOT met" (nor "met") about the benchmark's goals. */
    assert_null(strstr(out, "met)"));
    assert_null(strstr(out, "below goal"));
    /* Adasum's cost is its time against the sum's and against the two-pass floor, both of
     * this run, and no slogan: "almost as efficient as summing" once stood beside 2.06x. */
    assert_null(strstr(out, "almost"));
    assert_non_null(strstr(out, "B adasum: "));
    assert_non_null(strstr(out, "x sum ("));
    assert_non_null(strstr(out, "x the two-pass floor ("));
    /* Data rows (not comments) for sum on both rank counts, verified. */
    int sum_rows = 0;
    for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n"))
        if (line[0] != '#' && strstr(line, " sum ") && (strstr(line, "exact") || strstr(line, " ok")))
            sum_rows++;
    assert_int_equal(sum_rows, 2 * 3); /* 4K, 16K, 64K on P = 2 and 3 */
    free(out);
    FILE *f = fopen(csv, "r");
    assert_non_null(f);
    char line[1024];
    assert_non_null(fgets(line, sizeof line, f));
    assert_int_equal(strncmp(line, "section,transport,ranks", 23), 0);
    int rows = 0;
    while (fgets(line, sizeof line, f)) rows += strncmp(line, "allreduce,threads,", 18) == 0;
    fclose(f);
    unlink(csv);
    assert_true(rows >= 2 * 3 * 2); /* sum and avg at least */
}

/* Values that used to wrap or be taken silently: each refused with the flag and range named. */
static void test_args_refuse_with_flag_and_range(void **state)
{
    (void)state;
    sumo_args_error e;
    int n;
    int64_t l;
    uint64_t u;
    double d;
    assert_false(sumo_args_int("--workers", "4294967297", 1, 1024, &n, &e));
    assert_non_null(strstr(e.message, "--workers"));
    assert_non_null(strstr(e.message, "1 to 1024"));
    assert_false(sumo_args_int("--batch", "4294967360", 1, 65536, &n, &e));
    assert_false(sumo_args_int64("--epochs", "99999999999999999999", 1, 1000000, &l, &e));
    assert_non_null(strstr(e.message, "out of range"));
    assert_false(sumo_args_int("--workers", "", 1, 1024, &n, &e));
    assert_false(sumo_args_int("--workers", " 4", 1, 1024, &n, &e));
    assert_false(sumo_args_int("--workers", "4x", 1, 1024, &n, &e));
    assert_false(sumo_args_uint64("--seed", "abc", &u, &e));
    assert_non_null(strstr(e.message, "--seed"));
    assert_false(sumo_args_uint64("--seed", "-1", &u, &e));
    assert_false(sumo_args_double("--lr", "0", 0, true, 1000, false, &d, &e));
    assert_false(sumo_args_double("--lr", "1e300", 0, true, 1000, false, &d, &e));
    assert_non_null(strstr(e.message, "1000"));
    assert_false(sumo_args_double("--lr", "nan", 0, true, 1000, false, &d, &e));
    assert_true(sumo_args_int("--workers", "1024", 1, 1024, &n, &e));
    assert_int_equal(n, 1024);
    assert_true(sumo_args_uint64("--seed", "18446744073709551615", &u, &e));
    assert_true(u == UINT64_MAX);
    assert_true(sumo_args_double("--lr", "0.05", 0, true, 1000, false, &d, &e));
}

static int count_files(const char *dir, const char *contains)
{
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;) n += strstr(e->d_name, contains) != NULL;
    closedir(d);
    return n;
}

static void touch(const char *dir, const char *name)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fclose(f);
}

static void test_checkpoint_housekeeping(void **state)
{
    (void)state;
    char dir[] = "/tmp/sumo-test-ckpt-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char err[1024];
    const char *config = "--workers 2\n--lr 0.05\n--batch 32\n";
    unsigned char payload[64] = {1, 2, 3};
    for (long step = 10; step <= 40; step += 10) {
        sumo__ckpt_id id = {.dir = dir, .step = step, .rank = 0, .size = 1, .config_hash = 7,
                            .config_text = config};
        assert_int_equal(sumo__checkpoint_write_rank(&id, payload, sizeof payload, err, sizeof err), SUMO_SUCCESS);
        assert_int_equal(sumo__checkpoint_write_manifest(&id, err, sizeof err), SUMO_SUCCESS);
    }
    /* A step past the manifest's was never completed; the 2 newest up to it stay. */
    touch(dir, "step-50.rank-0.ckpt");
    sumo__checkpoint_prune(dir, 0, 40, 2);
    assert_int_equal(count_files(dir, ".ckpt"), 2);
    assert_int_equal(count_files(dir, "step-30."), 1);
    assert_int_equal(count_files(dir, "step-40."), 1);

    /* A fresh run is refused, naming the folder and the ways out. */
    assert_int_equal(sumo__checkpoint_prepare(dir, false, false, true, err, sizeof err), SUMO_ERR_INVALID_USAGE);
    assert_non_null(strstr(err, dir));
    assert_non_null(strstr(err, "--overwrite"));

    /* Temporaries of a writer that is gone go; this process's own stay. */
    pid_t child = fork();
    if (child == 0) _exit(0);
    waitpid(child, NULL, 0);
    char name[128];
    snprintf(name, sizeof name, "latest.tmp.%ld", (long)child);
    touch(dir, name);
    snprintf(name, sizeof name, "step-60.rank-0.ckpt.tmp.%ld.0badf00d", (long)getpid());
    touch(dir, name);
    assert_int_equal(sumo__checkpoint_prepare(dir, true, false, true, err, sizeof err), SUMO_SUCCESS);
    assert_int_equal(count_files(dir, ".tmp."), 1);
    assert_int_equal(count_files(dir, ".ckpt"), 3);

    /* Resuming with other flags names each one that differs, with both values. */
    sumo__ckpt_id other = {.dir = dir, .rank = 0, .size = 1, .config_hash = 8,
                           .config_text = "--workers 2\n--lr 0.1\n--batch 32\n--seed 3\n"};
    long step;
    assert_int_equal(sumo__checkpoint_read_manifest(&other, &step, err, sizeof err), SUMO_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err, "--lr 0.05 in the checkpoint, 0.1 now"));
    assert_non_null(strstr(err, "--seed (not set) in the checkpoint, 3 now"));
    assert_null(strstr(err, "--batch"));

    /* --overwrite discards the old checkpoint. */
    assert_int_equal(sumo__checkpoint_prepare(dir, false, true, true, err, sizeof err), SUMO_SUCCESS);
    assert_int_equal(count_files(dir, ".ckpt"), 1); /* this process's temporary */
    assert_int_equal(count_files(dir, "latest"), 0);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

/* The repository's root as this file was compiled (make builds from there), with a trailing
 * slash; skips the test where that cannot be told. */
static void source_root(char *root, size_t bytes)
{
    snprintf(root, bytes, "%s", __FILE__);
    char *cut = strstr(root, "tests/unit/test_tool.c");
    if (cut == NULL) {
        print_message("compiled as %s: cannot find the sources: skipped\n", __FILE__);
        skip();
    }
    *cut = '\0';
}

/* docs/settings.md holds the table `sumo environment --markdown` prints from the library's
 * own, row for row, and `sumo --help` names every setting: neither can drift from the table. */
static void test_environment_listed_as_documented(void **state)
{
    (void)state;
    require_binary();
    char root[4096], path[4200];
    source_root(root, sizeof root);
    snprintf(path, sizeof path, "%sdocs/settings.md", root);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    static char docs[1 << 16];
    size_t n = fread(docs, 1, sizeof docs - 1, f);
    fclose(f);
    docs[n] = '\0';
    char *table, *help, *plain;
    assert_int_equal(run_sumo("environment --markdown", &table), 0);
    assert_int_equal(run_sumo("--help", &help), 0);
    assert_int_equal(run_sumo("environment", &plain), 0);
    if (strstr(docs, table) == NULL)
        print_message("docs/settings.md does not hold this table (regenerate it with `sumo "
                      "environment --markdown`):\n%s", table);
    assert_non_null(strstr(docs, table));
    int count = 0, rows = 0;
    const char *name;
    for (; sumo_setting_describe(count, &name, NULL, 0, NULL, NULL) == SUMO_SUCCESS; count++) {
        char row[128];
        snprintf(row, sizeof row, "| `%s` |", name);
        assert_non_null(strstr(table, row));
        assert_non_null(strstr(help, name));
        assert_non_null(strstr(plain, name));
    }
    for (const char *p = docs; (p = strstr(p, "\n| `SUMO_")) != NULL; p++) rows++;
    assert_int_equal(count, 13);
    assert_int_equal(rows, count);
    free(table);
    free(help);
    free(plain);
}

/* The tool is a client of the public API (include/) and of the training driver (src/train/),
 * the layer below it; a benchmark of other internals belongs in bench/. Reads the sources
 * beside this file's, as compiled (make builds from the repository root). */
static void test_tool_includes_no_private_header(void **state)
{
    (void)state;
    char root[4096];
    source_root(root, sizeof root);
    char dir[4200];
    snprintf(dir, sizeof dir, "%stools/sumo", root);
    DIR *d = opendir(dir);
    if (d == NULL) {
        print_message("no %s from here: skipped\n", dir);
        skip();
    }
    int files = 0, bad = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        size_t n = strlen(e->d_name);
        if (n < 3 || (strcmp(e->d_name + n - 2, ".c") != 0 && strcmp(e->d_name + n - 2, ".h") != 0)) continue;
        char path[4500], line[1024];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        FILE *f = fopen(path, "r");
        assert_non_null(f);
        files++;
        while (fgets(line, sizeof line, f)) {
            char inc[256];
            if (sscanf(line, " # include \"%255[^\"]\"", inc) != 1 || strchr(inc, '/') == NULL) continue;
            if (strncmp(inc, "train/", 6) == 0) continue;
            print_message("%s includes the private header %s\n", e->d_name, inc);
            bad++;
        }
        fclose(f);
    }
    closedir(d);
    assert_true(files > 5);
    assert_int_equal(bad, 0);
}

static void test_train_usage_errors(void **state)
{
    (void)state;
    require_binary();
    char *out;
    assert_int_equal(run_sumo("train --workers 4294967297", &out), 2);
    assert_non_null(strstr(out, "--workers"));
    free(out);
    assert_int_equal(run_sumo("train --reduce ''", &out), 2);
    free(out);
    assert_int_equal(run_sumo("train --resume", &out), 2);
    assert_null(strstr(out, "(null)"));
    free(out);
    assert_int_equal(run_sumo("help train", &out), 0);
    assert_non_null(strstr(out, "--keep"));
    free(out);
}

int main(int argc, char **argv)
{
    (void)argc;
    char self[4096];
    snprintf(self, sizeof self, "%s", argv[0]);
    /* $(BUILD)/tests/test_tool -> $(BUILD)/sumo */
    snprintf(sumo_path, sizeof sumo_path, "%s/../sumo", dirname(self));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_help_lists_bench),
        cmocka_unit_test(test_usage_errors),
        cmocka_unit_test(test_bench_quick_checked),
        cmocka_unit_test(test_bench_shared_outputs_checked),
        cmocka_unit_test(test_bench_tensors_checked),
        cmocka_unit_test(test_args_refuse_with_flag_and_range),
        cmocka_unit_test(test_checkpoint_housekeeping),
        cmocka_unit_test(test_train_usage_errors),
        cmocka_unit_test(test_tool_includes_no_private_header),
        cmocka_unit_test(test_environment_listed_as_documented),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
