/* Smoke test of the `sumo` command: dispatch, usage errors, and a tiny `sumo bench` whose rows
 * are checked against the sequential reference. It runs the binary built beside this test
 * ($(BUILD)/sumo, found from argv[0]) and skips when that was not built. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <libgen.h>
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
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
