/*
 * sumo_store_create_dir: values come back whole and apart, a missing key times out at its
 * deadline, directories others could write to are refused, and removal takes the store's files
 * and nothing else.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include "sumo_shm.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void fresh_dir(char *dir, size_t len)
{
    const char *base = getenv("TMPDIR");
    snprintf(dir, len, "%s/sumo-dir-store.XXXXXX", base && *base ? base : "/tmp");
    assert_non_null(mkdtemp(dir));
}

static int entries(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        n += strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
    closedir(d);
    return n;
}

static void test_values_round_trip(void **state)
{
    (void)state;
    char dir[256];
    fresh_dir(dir, sizeof dir);
    sumo_store *a = NULL, *b = NULL;
    assert_int_equal(sumo_store_create_dir(dir, &a), SUMO_SUCCESS);
    assert_int_equal(sumo_store_create_dir(dir, &b), SUMO_SUCCESS); /* another rank's view */
    /* Keys that differ only in bytes the file names escape stay apart. */
    const char *keys[] = {"g/0/seg", "g_2F0_2Fseg", "g.0.seg", "G/0/seg", "g/0/seg/"};
    for (int i = 0; i < 5; i++) {
        unsigned char v[300];
        for (int j = 0; j < 300; j++) v[j] = (unsigned char)(i * 37 + j);
        assert_int_equal(a->set(a->ctx, keys[i], v, (size_t)(100 + i)), SUMO_SUCCESS);
    }
    for (int i = 0; i < 5; i++) {
        unsigned char got[300] = {0};
        size_t bytes = sizeof got;
        assert_int_equal(b->get(b->ctx, keys[i], got, &bytes, now_ns() + 1000000000), SUMO_SUCCESS);
        assert_int_equal(bytes, 100 + i);
        for (int j = 0; j < 100 + i; j++) assert_int_equal(got[j], (unsigned char)(i * 37 + j));
    }
    /* A value longer than the buffer: the buffer's worth, and its whole length. */
    unsigned char small[10];
    size_t bytes = sizeof small;
    assert_int_equal(b->get(b->ctx, keys[2], small, &bytes, now_ns()), SUMO_SUCCESS);
    assert_int_equal(bytes, 102);
    assert_int_equal(small[9], (unsigned char)(2 * 37 + 9));
    /* An empty value is a value. */
    assert_int_equal(a->set(a->ctx, "empty", "", 0), SUMO_SUCCESS);
    bytes = sizeof small;
    assert_int_equal(b->get(b->ctx, "empty", small, &bytes, now_ns()), SUMO_SUCCESS);
    assert_int_equal(bytes, 0);
    /* A key nobody set: the deadline, not sooner, not much later. */
    int64_t t0 = now_ns();
    bytes = sizeof small;
    assert_int_equal(b->get(b->ctx, "never", small, &bytes, t0 + 200000000), SUMO_ERR_TIMEOUT);
    int64_t took = now_ns() - t0;
    assert_true(took >= 200000000 && took < 5000000000);
    /* Removal takes the store's files and the directory; the second handle just frees. */
    assert_int_equal(sumo_store_destroy_dir(b, 0), SUMO_SUCCESS);
    assert_int_equal(entries(dir), 6);
    assert_int_equal(sumo_store_destroy_dir(a, 1), SUMO_SUCCESS);
    assert_int_equal(entries(dir), -1);
}

static void test_removal_leaves_foreign_files(void **state)
{
    (void)state;
    char dir[256], other[300];
    fresh_dir(dir, sizeof dir);
    snprintf(other, sizeof other, "%s/notes.txt", dir);
    FILE *f = fopen(other, "w");
    assert_non_null(f);
    fclose(f);
    sumo_store *s = NULL;
    assert_int_equal(sumo_store_create_dir(dir, &s), SUMO_SUCCESS);
    assert_int_equal(s->set(s->ctx, "k", "v", 1), SUMO_SUCCESS);
    assert_int_equal(sumo_store_destroy_dir(s, 1), SUMO_SUCCESS);
    assert_int_equal(entries(dir), 1);
    unlink(other);
    rmdir(dir);
}

static void test_refusals(void **state)
{
    (void)state;
    char dir[256], sub[300], file[300];
    fresh_dir(dir, sizeof dir);
    sumo_store *s = (sumo_store *)dir;
    assert_int_equal(sumo_store_create_dir(NULL, &s), SUMO_ERR_INVALID_ARGUMENT);
    assert_null(s);
    assert_int_equal(sumo_store_create_dir("", &s), SUMO_ERR_INVALID_ARGUMENT);
    assert_int_equal(sumo_store_create_dir(dir, NULL), SUMO_ERR_INVALID_ARGUMENT);
    /* Made when missing, owner-only. */
    snprintf(sub, sizeof sub, "%s/made", dir);
    assert_int_equal(sumo_store_create_dir(sub, &s), SUMO_SUCCESS);
    struct stat st;
    assert_int_equal(stat(sub, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0700);
    assert_int_equal(sumo_store_destroy_dir(s, 1), SUMO_SUCCESS);
    /* One that others may enter or write to. */
    assert_int_equal(mkdir(sub, 0750), 0);
    assert_int_equal(chmod(sub, 0750), 0); /* whatever the umask left */
    s = (sumo_store *)dir;
    assert_int_equal(sumo_store_create_dir(sub, &s), SUMO_ERR_INVALID_ARGUMENT);
    assert_null(s);
    rmdir(sub);
    /* A file where the directory should be; a parent that does not exist. */
    snprintf(file, sizeof file, "%s/file", dir);
    FILE *f = fopen(file, "w");
    assert_non_null(f);
    fclose(f);
    assert_int_equal(sumo_store_create_dir(file, &s), SUMO_ERR_INVALID_ARGUMENT);
    snprintf(sub, sizeof sub, "%s/missing/store", dir);
    assert_int_equal(sumo_store_create_dir(sub, &s), SUMO_ERR_SYSTEM);
    unlink(file);
    /* A store this function did not make is not freed. */
    assert_int_equal(sumo_store_create_dir(dir, &s), SUMO_SUCCESS);
    sumo_store copy = *s;
    assert_int_equal(sumo_store_destroy_dir(&copy, 0), SUMO_ERR_INVALID_ARGUMENT);
    assert_int_equal(sumo_store_destroy_dir(NULL, 1), SUMO_SUCCESS);
    assert_int_equal(sumo_store_destroy_dir(s, 1), SUMO_SUCCESS);
    assert_int_equal(entries(dir), -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_values_round_trip),
        cmocka_unit_test(test_removal_leaves_foreign_files),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
