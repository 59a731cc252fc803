/*
 * The table of environment settings (src/common/settings.c): every variable's default when
 * unset or empty, the edges of its range, a malformed value refused by name (through the
 * parser, sumo_env_check and sumo_setting), and each reader refusing it where it reads it: an
 * optimizer, the shm transport (rank 0's refusal reaching a peer in another process). The
 * expected values are written out here, not taken from the table. The communicators' own
 * check of SUMO_TIMEOUT and SUMO_DEBUG is test_core's; the MPI transport's is
 * tests/mpi/test_settings_mpi.c's.
 */
#include "common/settings.h"
#include "sumo_optim.h"
#include "sumo_shm.h"
#include "support/temp_dir.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static const char *const names[] = {
    "SUMO_TIMEOUT",   "SUMO_DEBUG",        "SUMO_SHM_STAGE_BYTES",       "SUMO_SHM_NAMED",
    "SUMO_MPI_SHM",   "SUMO_NCCL_LIBRARY", "SUMO_FUSION_THRESHOLD",      "SUMO_TEST_EXIT_DURING_SAVE",
    "SUMO_LOCAL_SIZE", "SUMO_LIVENESS_TIMEOUT", "SUMO_SOCKET_IFNAME", "SUMO_KERNEL_ISA",
    "SUMO_HIER_CHUNK_BYTES",
};
#define NNAMES (sizeof names / sizeof names[0])

/* Each test starts from an environment without any of them (the test command sets some). */
static int clear_all(void **state)
{
    (void)state;
    for (size_t i = 0; i < NNAMES; i++) unsetenv(names[i]);
    unsetenv("HOROVOD_FUSION_THRESHOLD"); /* an alias (test_alias_read_in_place_of_the_name) */
    return 0;
}

static void test_table_names_every_variable(void **state)
{
    (void)state;
    assert_int_equal(SUMO__SETTING_COUNT, (int)NNAMES);
    for (size_t i = 0; i < NNAMES; i++) {
        const char *name = NULL, *doc = NULL;
        char accepts[200] = "";
        assert_int_equal(sumo_setting_describe((int)i, &name, accepts, sizeof accepts, NULL, &doc),
                         SUMO_SUCCESS);
        assert_string_equal(name, names[i]);
        assert_string_equal(sumo__setting_info((sumo__setting_id)i)->name, names[i]);
        assert_true(strlen(accepts) > 0 && strlen(doc) > 20);
    }
    assert_int_equal(sumo_setting_describe((int)NNAMES, NULL, NULL, 0, NULL, NULL),
                     SUMO_ERR_INVALID_ARGUMENT);
    assert_int_equal(sumo_setting_describe(-1, NULL, NULL, 0, NULL, NULL), SUMO_ERR_INVALID_ARGUMENT);
    assert_null(sumo__setting_info(SUMO__SETTING_COUNT));
}

static void test_defaults_when_unset_or_empty(void **state)
{
    (void)state;
    /* name, what sumo_setting gives, the number or integer the parser gives */
    const struct {
        sumo__setting_id id;
        const char *text;
        double value;
    } want[] = {
        {SUMO__SETTING_TIMEOUT, "300", 300.0},
        {SUMO__SETTING_DEBUG, "NONE", 0},
        {SUMO__SETTING_SHM_STAGE_BYTES, "524288", 512 * 1024},
        {SUMO__SETTING_SHM_NAMED, "0", 0},
        {SUMO__SETTING_MPI_SHM, "1", 1},
        {SUMO__SETTING_NCCL_LIBRARY, NULL, 0},
        {SUMO__SETTING_FUSION_THRESHOLD, "67108864", 64 * 1024 * 1024},
        {SUMO__SETTING_TEST_EXIT_DURING_SAVE, NULL, 0},
        {SUMO__SETTING_LOCAL_SIZE, NULL, 0},
        {SUMO__SETTING_LIVENESS_TIMEOUT, "5", 5.0},
        {SUMO__SETTING_SOCKET_IFNAME, NULL, 0},
        {SUMO__SETTING_KERNEL_ISA, NULL, 0},
        {SUMO__SETTING_HIER_CHUNK_BYTES, "4194304", 4194304},
    };
    for (int empty = 0; empty < 2; empty++) {
        for (size_t i = 0; i < NNAMES; i++) {
            const char *name = names[want[i].id];
            if (empty) setenv(name, "", 1);
            sumo__setting_value v;
            assert_int_equal(sumo__setting_read(want[i].id, &v, NULL, 0), SUMO_SUCCESS);
            assert_false(v.set);
            const char *text = "x";
            assert_int_equal(sumo_setting(name, &text), SUMO_SUCCESS);
            if (want[i].text == NULL) {
                assert_null(v.text);
                assert_null(text);
            } else {
                assert_string_equal(v.text, want[i].text);
                assert_string_equal(text, want[i].text);
            }
            double got = sumo__setting_info(want[i].id)->type == SUMO__SETTING_NUMBER
                             ? v.number
                             : (double)v.integer;
            assert_true(got == want[i].value);
        }
        char msg[64] = "x";
        assert_int_equal(sumo_env_check(msg, sizeof msg), SUMO_SUCCESS);
        assert_string_equal(msg, "");
        clear_all(NULL);
    }
}

typedef struct edge {
    sumo__setting_id id;
    const char *text;
    bool ok;
    double value; /* when ok: the number (NUMBER) or integer read */
} edge;

static const edge edges[] = {
    {SUMO__SETTING_TIMEOUT, "2.5", true, 2.5},
    {SUMO__SETTING_TIMEOUT, "1e-9", true, 1e-9},
    {SUMO__SETTING_TIMEOUT, "100000000", true, 1e8},
    {SUMO__SETTING_TIMEOUT, "1e8", true, 1e8},
    {SUMO__SETTING_TIMEOUT, "100000000.5", false, 0},
    {SUMO__SETTING_TIMEOUT, "0", false, 0},
    {SUMO__SETTING_TIMEOUT, "-5", false, 0},
    {SUMO__SETTING_TIMEOUT, "abc", false, 0},
    {SUMO__SETTING_TIMEOUT, "5s", false, 0},
    {SUMO__SETTING_TIMEOUT, "nan", false, 0},
    {SUMO__SETTING_TIMEOUT, "inf", false, 0},
    {SUMO__SETTING_TIMEOUT, "1e999", false, 0},
    {SUMO__SETTING_DEBUG, "NONE", true, 0},
    {SUMO__SETTING_DEBUG, "warn", true, 1},
    {SUMO__SETTING_DEBUG, "Info", true, 2},
    {SUMO__SETTING_DEBUG, "LOUD", false, 0},
    {SUMO__SETTING_DEBUG, "WAR", false, 0},
    {SUMO__SETTING_DEBUG, "INFOS", false, 0},
    {SUMO__SETTING_DEBUG, "2", false, 0},
    {SUMO__SETTING_SHM_STAGE_BYTES, "8192", true, 8192},
    {SUMO__SETTING_SHM_STAGE_BYTES, "12345", true, 12288},
    {SUMO__SETTING_SHM_STAGE_BYTES, "1073741824", true, 1073741824.0},
    {SUMO__SETTING_SHM_STAGE_BYTES, "8191", false, 0},
    {SUMO__SETTING_SHM_STAGE_BYTES, "1073741825", false, 0},
    {SUMO__SETTING_SHM_STAGE_BYTES, "-8192", false, 0},
    {SUMO__SETTING_SHM_STAGE_BYTES, "64k", false, 0},
    {SUMO__SETTING_SHM_STAGE_BYTES, "0x2000", false, 0},
    {SUMO__SETTING_SHM_STAGE_BYTES, "99999999999999999999999", false, 0},
    {SUMO__SETTING_SHM_NAMED, "1", true, 1},
    {SUMO__SETTING_SHM_NAMED, "0", true, 0},
    {SUMO__SETTING_SHM_NAMED, "yes", false, 0},
    {SUMO__SETTING_SHM_NAMED, "2", false, 0},
    {SUMO__SETTING_SHM_NAMED, "01", false, 0},
    {SUMO__SETTING_MPI_SHM, "0", true, 0},
    {SUMO__SETTING_MPI_SHM, "1", true, 1},
    {SUMO__SETTING_MPI_SHM, "off", false, 0},
    {SUMO__SETTING_MPI_SHM, "true", false, 0},
    {SUMO__SETTING_NCCL_LIBRARY, "/opt/nccl/lib/libnccl.so.2", true, 0},
    {SUMO__SETTING_NCCL_LIBRARY, "no such library", true, 0},
    {SUMO__SETTING_LOCAL_SIZE, "2", true, 2},
    {SUMO__SETTING_LOCAL_SIZE, "256", true, 256},
    {SUMO__SETTING_LOCAL_SIZE, "0", false, 0},
    {SUMO__SETTING_LOCAL_SIZE, "257", false, 0},
    {SUMO__SETTING_LOCAL_SIZE, "two", false, 0},
    {SUMO__SETTING_FUSION_THRESHOLD, "0", true, 0},
    {SUMO__SETTING_FUSION_THRESHOLD, "1000", true, 1000},
    {SUMO__SETTING_FUSION_THRESHOLD, "1099511627776", true, 1099511627776.0},
    {SUMO__SETTING_FUSION_THRESHOLD, "1099511627777", false, 0},
    {SUMO__SETTING_FUSION_THRESHOLD, "-1", false, 0},
    {SUMO__SETTING_FUSION_THRESHOLD, "64MB", false, 0},
    {SUMO__SETTING_TEST_EXIT_DURING_SAVE, "0", true, 0},
    {SUMO__SETTING_TEST_EXIT_DURING_SAVE, "60", true, 60},
    {SUMO__SETTING_TEST_EXIT_DURING_SAVE, "1000000000", true, 1e9},
    {SUMO__SETTING_TEST_EXIT_DURING_SAVE, "1000000001", false, 0},
    {SUMO__SETTING_TEST_EXIT_DURING_SAVE, "-1", false, 0},
    {SUMO__SETTING_TEST_EXIT_DURING_SAVE, "sixty", false, 0},
    /* Every CPU runs the portable kernels; the sets a CPU lacks are test_kernels_forced's. */
    {SUMO__SETTING_KERNEL_ISA, "PORTABLE", true, 0},
    {SUMO__SETTING_KERNEL_ISA, "sse4", false, 0},
    {SUMO__SETTING_KERNEL_ISA, "avx-512", false, 0},
    {SUMO__SETTING_KERNEL_ISA, "avx2 ", false, 0},
    {SUMO__SETTING_LIVENESS_TIMEOUT, "1", true, 1},
    {SUMO__SETTING_LIVENESS_TIMEOUT, "0.25", true, 0.25},
    {SUMO__SETTING_LIVENESS_TIMEOUT, "1000000", true, 1e6},
    {SUMO__SETTING_LIVENESS_TIMEOUT, "0", false, 0},
    {SUMO__SETTING_LIVENESS_TIMEOUT, "1000001", false, 0},
    {SUMO__SETTING_LIVENESS_TIMEOUT, "5s", false, 0},
    {SUMO__SETTING_HIER_CHUNK_BYTES, "4096", true, 4096},
    {SUMO__SETTING_HIER_CHUNK_BYTES, "16400", true, 16384},
    {SUMO__SETTING_HIER_CHUNK_BYTES, "4095", false, 0},
    {SUMO__SETTING_HIER_CHUNK_BYTES, "4MiB", false, 0},
};

/* Each value against its range, through the parser, sumo_setting and sumo_env_check; a
 * refused one by name, with its value and what is accepted. */
static void test_ranges_and_refusals(void **state)
{
    (void)state;
    int refused = 0;
    bool refused_each[SUMO__SETTING_COUNT] = {0};
    for (size_t i = 0; i < sizeof edges / sizeof edges[0]; i++) {
        const edge *e = &edges[i];
        const char *name = names[e->id];
        setenv(name, e->text, 1);
        sumo__setting_value v;
        char why[256] = "", msg[256] = "";
        sumo_result r = sumo__setting_read(e->id, &v, why, sizeof why);
        const char *text = "x";
        sumo_result pub = sumo_setting(name, &text);
        sumo_result all = sumo_env_check(msg, sizeof msg);
        unsetenv(name);
        if (e->ok) {
            if (r != SUMO_SUCCESS) print_message("%s='%s' refused: %s\n", name, e->text, why);
            assert_int_equal(r, SUMO_SUCCESS);
            assert_int_equal(pub, SUMO_SUCCESS);
            assert_int_equal(all, SUMO_SUCCESS);
            assert_true(v.set);
            assert_non_null(text);
            if (sumo__setting_info(e->id)->type == SUMO__SETTING_NUMBER)
                assert_true(v.number == e->value);
            else if (e->id != SUMO__SETTING_NCCL_LIBRARY) assert_true((double)v.integer == e->value);
            /* A level as the table spells it; anything else as written. */
            static const char *const levels[] = {"NONE", "WARN", "INFO"};
            assert_string_equal(text, e->id == SUMO__SETTING_DEBUG ? levels[v.integer] : e->text);
            continue;
        }
        if (r == SUMO_SUCCESS) print_message("%s='%s' accepted\n", name, e->text);
        assert_int_equal(r, SUMO_ERR_INVALID_ARGUMENT);
        assert_int_equal(pub, SUMO_ERR_INVALID_ARGUMENT);
        assert_null(text);
        assert_int_equal(all, SUMO_ERR_INVALID_ARGUMENT);
        assert_string_equal(msg, why);
        char quoted[128];
        snprintf(quoted, sizeof quoted, "%s='%s' is not ", name, e->text);
        assert_non_null(strstr(why, quoted));
        assert_non_null(strstr(why, ": expected "));
        refused++;
        refused_each[e->id] = true;
    }
    /* Every setting that can be malformed (all but the texts: a path, an interface name)
     * was tried malformed. */
    for (int id = 0; id < SUMO__SETTING_COUNT; id++)
        assert_true(refused_each[id] ||
                    sumo__setting_info((sumo__setting_id)id)->type == SUMO__SETTING_TEXT);
    assert_true(refused > 20);
}

/* What the sentences say is accepted, for the settings whose bounds matter to a user. */
static void test_refusal_names_the_range(void **state)
{
    (void)state;
    const struct {
        const char *name, *value, *says;
    } cases[] = {
        {"SUMO_TIMEOUT", "0", "> 0 and <= 100000000"},
        {"SUMO_DEBUG", "LOUD", "NONE, WARN or INFO"},
        {"SUMO_KERNEL_ISA", "sse4", "expected PORTABLE, AVX2 or AVX512, in any case (unset or empty: none)"},
        {"SUMO_SHM_STAGE_BYTES", "1", "8192 .. 1073741824, rounded down to a multiple of 4096"},
        {"SUMO_SHM_NAMED", "yes", "expected 0 or 1 (unset or empty: 0)"},
        {"SUMO_MPI_SHM", "no", "expected 0 or 1 (unset or empty: 1)"},
        {"SUMO_TEST_EXIT_DURING_SAVE", "x", "0 .. 1000000000 (unset or empty: none)"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        setenv(cases[i].name, cases[i].value, 1);
        char msg[256] = "";
        assert_int_equal(sumo_env_check(msg, sizeof msg), SUMO_ERR_INVALID_ARGUMENT);
        unsetenv(cases[i].name);
        if (strstr(msg, cases[i].says) == NULL) print_message("%s\n", msg);
        assert_non_null(strstr(msg, cases[i].says));
    }
    const char *v = "x";
    assert_int_equal(sumo_setting("SUMO_NO_SUCH_THING", &v), SUMO_ERR_INVALID_ARGUMENT);
    assert_null(v);
    assert_int_equal(sumo_setting(NULL, &v), SUMO_ERR_INVALID_ARGUMENT);
    assert_int_equal(sumo_setting("SUMO_DEBUG", NULL), SUMO_ERR_INVALID_ARGUMENT);
}

/* HOROVOD_FUSION_THRESHOLD is read where SUMO_FUSION_THRESHOLD is unset or empty, through
 * the same parser, and refused by its own name. */
static void test_alias_read_in_place_of_the_name(void **state)
{
    (void)state;
    const char *horovod = "HOROVOD_FUSION_THRESHOLD";
    const struct {
        const char *sumo, *hvd; /* NULL: unset */
        bool ok;
        double value;
    } cases[] = {
        {NULL, "1000", true, 1000},
        {"", "1000", true, 1000},
        {"2000", "1000", true, 2000},
        {"2000", "64MB", true, 2000}, /* not read where the name is set */
        {NULL, "", true, 64 * 1024 * 1024},
        {NULL, "64MB", false, 0},
        {"", "-1", false, 0},
        {NULL, "1099511627777", false, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (cases[i].sumo) setenv("SUMO_FUSION_THRESHOLD", cases[i].sumo, 1);
        setenv(horovod, cases[i].hvd, 1);
        sumo__setting_value v;
        char why[256] = "", msg[256] = "";
        sumo_result r = sumo__setting_read(SUMO__SETTING_FUSION_THRESHOLD, &v, why, sizeof why);
        const char *text = "x";
        sumo_result pub = sumo_setting("SUMO_FUSION_THRESHOLD", &text);
        sumo_result all = sumo_env_check(msg, sizeof msg);
        unsetenv("SUMO_FUSION_THRESHOLD");
        unsetenv(horovod);
        if (cases[i].ok) {
            assert_int_equal(r, SUMO_SUCCESS);
            assert_int_equal(pub, SUMO_SUCCESS);
            assert_int_equal(all, SUMO_SUCCESS);
            assert_true((double)v.integer == cases[i].value);
            continue;
        }
        assert_int_equal(r, SUMO_ERR_INVALID_ARGUMENT);
        assert_int_equal(pub, SUMO_ERR_INVALID_ARGUMENT);
        assert_null(text);
        assert_int_equal(all, SUMO_ERR_INVALID_ARGUMENT);
        assert_string_equal(msg, why);
        char quoted[128];
        snprintf(quoted, sizeof quoted, "HOROVOD_FUSION_THRESHOLD='%s' is not a byte count",
                 cases[i].hvd);
        if (strstr(why, quoted) == NULL) print_message("%s\n", why);
        assert_non_null(strstr(why, quoted));
        assert_non_null(strstr(why, "where SUMO_FUSION_THRESHOLD is unset"));
    }
}

static void test_optimizer_refuses_malformed_debug(void **state)
{
    (void)state;
    sumo_optimizer_options o;
    assert_int_equal(sumo_optimizer_options_default(SUMO_OPTIM_SGD, &o), SUMO_SUCCESS);
    size_t sizes[1] = {4};
    sumo_optimizer *opt = NULL;
    setenv("SUMO_DEBUG", "LOUD", 1);
    assert_int_equal(sumo_optimizer_create(&o, sizes, 1, &opt), SUMO_ERR_INVALID_ARGUMENT);
    assert_null(opt);
    setenv("SUMO_DEBUG", "warn", 1);
    assert_int_equal(sumo_optimizer_create(&o, sizes, 1, &opt), SUMO_SUCCESS);
    unsetenv("SUMO_DEBUG");
    assert_int_equal(sumo_optimizer_destroy(opt), SUMO_SUCCESS);
}

/* ---- the shm transport ---------------------------------------------------------------------- */

static void make_dir(char *dir, size_t len)
{
    assert_true(make_temp_dir(dir, len, "settings"));
}

static sumo_result create_shm(const char *dir, int rank, int size, size_t stage_bytes, char *err,
                              size_t errlen, sumo_comm **comm)
{
    sumo_store *store = NULL;
    sumo_result r = sumo_store_create_dir(dir, &store);
    if (r != SUMO_SUCCESS) return r;
    sumo_shm_options o = {.struct_size = sizeof o, .rank = rank, .size = size,
                          .store = store, .key_prefix = "settings/", .stage_bytes = stage_bytes,
                          .error = err, .error_bytes = errlen};
    r = sumo_comm_create_shm(&o, comm);
    sumo_store_destroy_dir(store, 0);
    return r;
}

/* Rank 0 reads SUMO_SHM_STAGE_BYTES (where the options leave the size 0) and SUMO_SHM_NAMED;
 * a malformed one fails the creation with the sentence in options.error. */
static void test_shm_refuses_its_settings(void **state)
{
    (void)state;
    const struct {
        const char *name, *value;
        size_t stage_bytes;
        sumo_result want;
    } cases[] = {
        {"SUMO_SHM_STAGE_BYTES", "lots", 0, SUMO_ERR_INVALID_ARGUMENT},
        {"SUMO_SHM_STAGE_BYTES", "4096", 0, SUMO_ERR_INVALID_ARGUMENT},
        /* Not read where the options give the size. */
        {"SUMO_SHM_STAGE_BYTES", "lots", 16384, SUMO_SUCCESS},
        {"SUMO_SHM_STAGE_BYTES", "20000", 0, SUMO_SUCCESS},
        {"SUMO_SHM_NAMED", "yes", 0, SUMO_ERR_INVALID_ARGUMENT},
        {"SUMO_SHM_NAMED", "1", 0, SUMO_SUCCESS},
        {"SUMO_TIMEOUT", "never", 0, SUMO_ERR_INVALID_ARGUMENT},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char dir[256], err[256] = "";
        make_dir(dir, sizeof dir);
        setenv(cases[i].name, cases[i].value, 1);
        sumo_comm *comm = NULL;
        sumo_result r = create_shm(dir, 0, 1, cases[i].stage_bytes, err, sizeof err, &comm);
        unsetenv(cases[i].name);
        remove_dir(dir);
        if (r != cases[i].want) print_message("%s=%s: %s (%s)\n", cases[i].name, cases[i].value,
                                              sumo_result_name(r), err);
        assert_int_equal(r, cases[i].want);
        if (r == SUMO_SUCCESS) {
            assert_string_equal(err, "");
            assert_int_equal(sumo_comm_destroy(comm), SUMO_SUCCESS);
            continue;
        }
        assert_null(comm);
        char quoted[128];
        snprintf(quoted, sizeof quoted, "%s='%s' is not ", cases[i].name, cases[i].value);
        assert_non_null(strstr(err, quoted));
    }
    /* The options' own size takes the variable's range, but exactly. */
    for (size_t i = 0; i < 3; i++) {
        static const size_t sizes[] = {12288 + 100, 4096, ((size_t)1 << 30) + 4096};
        char dir[256], err[256] = "";
        make_dir(dir, sizeof dir);
        sumo_comm *comm = NULL;
        assert_int_equal(create_shm(dir, 0, 1, sizes[i], err, sizeof err, &comm),
                         SUMO_ERR_INVALID_ARGUMENT);
        remove_dir(dir);
        assert_non_null(strstr(err, "options.stage_bytes is not 0 or a multiple of 4096 in "
                                    "8192 .. 1073741824"));
    }
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Rank 0's refusal reaches rank 1, another process, at once (not at the deadline), with the
 * sentence; rank 1's own environment is fine. */
static void test_shm_refusal_reaches_the_peers(void **state)
{
    (void)state;
    char dir[256];
    make_dir(dir, sizeof dir);
    setenv("SUMO_TIMEOUT", "60", 1);
    int pipefd[2];
    assert_int_equal(pipe(pipefd), 0);
    double start = now_s();
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(pipefd[0]);
        char err[256] = "";
        sumo_comm *comm = NULL;
        sumo_result r = create_shm(dir, 1, 2, 0, err, sizeof err, &comm);
        if (write(pipefd[1], err, sizeof err) != (ssize_t)sizeof err) _exit(99);
        _exit(r == SUMO_SUCCESS ? 98 : (int)r);
    }
    close(pipefd[1]);
    setenv("SUMO_SHM_STAGE_BYTES", "lots", 1);
    char err[256] = "", peer_err[256] = "";
    sumo_comm *comm = NULL;
    sumo_result r = create_shm(dir, 0, 2, 0, err, sizeof err, &comm);
    unsetenv("SUMO_SHM_STAGE_BYTES");
    unsetenv("SUMO_TIMEOUT");
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    double took = now_s() - start;
    assert_int_equal(read(pipefd[0], peer_err, sizeof peer_err), (ssize_t)sizeof peer_err);
    close(pipefd[0]);
    remove_dir(dir);
    assert_int_equal(r, SUMO_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err, "SUMO_SHM_STAGE_BYTES='lots' is not "));
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), SUMO_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(peer_err, "rank 0: SUMO_SHM_STAGE_BYTES='lots' is not "));
    assert_true(took < 30.0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_table_names_every_variable, clear_all),
        cmocka_unit_test_setup(test_defaults_when_unset_or_empty, clear_all),
        cmocka_unit_test_setup(test_ranges_and_refusals, clear_all),
        cmocka_unit_test_setup(test_refusal_names_the_range, clear_all),
        cmocka_unit_test_setup(test_alias_read_in_place_of_the_name, clear_all),
        cmocka_unit_test_setup(test_optimizer_refuses_malformed_debug, clear_all),
        cmocka_unit_test_setup(test_shm_refuses_its_settings, clear_all),
        cmocka_unit_test_setup(test_shm_refusal_reaches_the_peers, clear_all),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
