/*
 * What another user of the same machine can plant, and files that are not what they seem:
 *   - a shared-memory segment that another user made (a /dev/shm object or a memfd, mode
 *     0666), named in a store record this rank trusts, is refused by the kernel's word on
 *     its owner, not mapped and written;
 *   - a checkpoint folder another user owns, or any user may write, is refused before any
 *     file in it is written or read;
 *   - links planted at a temporary file's name never redirect a write (the checkpoint's, or
 *     the experiments' results writer in a folder everyone may write);
 *   - a FIFO in a rank file's place is refused at once instead of blocking the resume;
 *   - a rank file copied to another step, with its header edited to match, fails the CRC;
 *   - a directory store's folder swapped for a link after it was checked (its parent open to
 *     everyone) changes nothing: the store keeps to the folder it checked.
 * The other user is uid/gid 65534 (nobody), taken by a forked child: these run as root only
 * (CI does), and say so in one line where they cannot.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "sumo_shm.h"
#include "train/checkpoint.h"
#include "transport/shm_segment.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define NOBODY 65534

static int64_t sumo_test_now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static bool as_root(void)
{
    if (geteuid() == 0) return true;
    print_message("not root: no second user to plant files as; this test is skipped\n");
    return false;
}

static void become_nobody(void)
{
    if (setgid(NOBODY) != 0 || setuid(NOBODY) != 0) _exit(3);
}

static void make_dir(char *dir, size_t bytes)
{
    snprintf(dir, bytes, "/tmp/sumo-hostile-XXXXXX");
    assert_non_null(mkdtemp(dir));
}

static void remove_tree(const char *dir)
{
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

/* ---- shared memory ----------------------------------------------------------------------- */

static void test_foreign_named_segment_refused(void **state)
{
    (void)state;
    if (!as_root()) skip();
    char name[64];
    snprintf(name, sizeof name, "/sumo-hostile.%d", (int)getpid());
    const size_t bytes = 1 << 16;
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        become_nobody();
        int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0666);
        if (fd < 0 || fchmod(fd, 0666) != 0 || ftruncate(fd, (off_t)bytes) != 0) _exit(4);
        _exit(0);
    }
    int status = 0;
    assert_int_equal(waitpid(child, &status, 0), child);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    char path[96];
    snprintf(path, sizeof path, "/dev/shm%s", name);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    sumo__shm_segment s;
    bool by_proc = true;
    char err[256] = "";
    /* Everything a store record could say about it is right: only the owner is not. */
    int e = sumo__shm_segment_open(SUMO__SHM_NAMED, 0, -1, name, (uint64_t)st.st_ino,
                                   (uint64_t)st.st_dev, bytes, &s, &by_proc, err, sizeof err);
    print_message("%s\n", err);
    shm_unlink(name);
    assert_int_equal(e, EACCES);
    assert_false(by_proc);
    assert_null(s.base);
    assert_non_null(strstr(err, "uid 65534"));
}

static void test_foreign_memfd_refused(void **state)
{
    (void)state;
    if (!as_root()) skip();
    const size_t bytes = 1 << 16;
    int ready[2], done[2];
    assert_int_equal(pipe(ready), 0);
    assert_int_equal(pipe(done), 0);
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        become_nobody();
        int fd = memfd_create("planted", 0);
        if (fd < 0 || fchmod(fd, 0666) != 0 || ftruncate(fd, (off_t)bytes) != 0) _exit(4);
        if (write(ready[1], &fd, sizeof fd) != (ssize_t)sizeof fd) _exit(5);
        char c;
        (void)!read(done[0], &c, 1); /* kept open until the parent has tried */
        _exit(0);
    }
    int fd = -1;
    assert_int_equal(read(ready[0], &fd, sizeof fd), (ssize_t)sizeof fd);
    char proc[64];
    snprintf(proc, sizeof proc, "/proc/%d/fd/%d", (int)child, fd);
    struct stat st;
    assert_int_equal(stat(proc, &st), 0);
    sumo__shm_segment s;
    bool by_proc = false;
    char err[256] = "";
    int e = sumo__shm_segment_open(SUMO__SHM_MEMFD, child, fd, "", (uint64_t)st.st_ino,
                                   (uint64_t)st.st_dev, bytes, &s, &by_proc, err, sizeof err);
    print_message("%s\n", err);
    assert_int_equal(write(done[1], "x", 1), 1);
    int status = 0;
    assert_int_equal(waitpid(child, &status, 0), child);
    assert_int_equal(e, EACCES);
    assert_null(s.base);
    assert_non_null(strstr(err, "uid 65534"));
}

/* ---- checkpoint folders and files --------------------------------------------------------- */

static const double PAYLOAD[4] = {1.0, 2.0, 3.0, 4.0};

static sumo__ckpt_id id_at(const char *dir, long step)
{
    return (sumo__ckpt_id){.dir = dir, .step = step, .rank = 0, .size = 1, .config_hash = 7};
}

static void test_foreign_checkpoint_folder_refused(void **state)
{
    (void)state;
    if (!as_root()) skip();
    char dir[64];
    make_dir(dir, sizeof dir);
    char err[512];
    sumo__ckpt_id id = id_at(dir, 4);
    /* Another user's folder (they could swap its files between the save and the resume). */
    assert_int_equal(chown(dir, NOBODY, NOBODY), 0);
    assert_int_equal(sumo__checkpoint_write_rank(&id, PAYLOAD, sizeof PAYLOAD, err, sizeof err),
                     SUMO_ERR_SYSTEM);
    print_message("%s\n", err);
    assert_non_null(strstr(err, "uid 65534"));
    assert_int_equal(sumo__checkpoint_prepare(dir, true, false, true, err, sizeof err),
                     SUMO_ERR_INVALID_USAGE);
    /* This user's, but anyone may write it. */
    assert_int_equal(chown(dir, 0, 0), 0);
    assert_int_equal(chmod(dir, 0777), 0);
    assert_int_equal(sumo__checkpoint_write_manifest(&id, err, sizeof err), SUMO_ERR_SYSTEM);
    assert_non_null(strstr(err, "writable by nobody else"));
    char path[128];
    snprintf(path, sizeof path, "%s/latest", dir);
    assert_int_equal(access(path, F_OK), -1);
    /* A link to a good folder is not followed. */
    assert_int_equal(chmod(dir, 0700), 0);
    char link[128];
    snprintf(link, sizeof link, "%s-link", dir);
    assert_int_equal(symlink(dir, link), 0);
    sumo__ckpt_id via = id_at(link, 4);
    assert_int_equal(sumo__checkpoint_write_rank(&via, PAYLOAD, sizeof PAYLOAD, err, sizeof err),
                     SUMO_ERR_SYSTEM);
    assert_non_null(strstr(err, "a link or not a folder"));
    unlink(link);
    remove_tree(dir);
}

/* Links at every name a writer with this pid could once have used, to a file that must
 * survive: the write lands in place, the target keeps its bytes. */
static void test_planted_links_do_not_redirect_writes(void **state)
{
    (void)state;
    char dir[64], open_dir[96], target[128];
    make_dir(dir, sizeof dir);
    snprintf(target, sizeof target, "%s/precious", dir);
    FILE *f = fopen(target, "w");
    assert_non_null(f);
    fputs("precious", f);
    fclose(f);
    assert_int_equal(chmod(target, 0600), 0);
    char link[256], err[512];
    snprintf(link, sizeof link, "%s/step-4.rank-0.ckpt.tmp.%ld", dir, (long)getpid());
    assert_int_equal(symlink(target, link), 0);
    snprintf(link, sizeof link, "%s/latest.tmp.%ld", dir, (long)getpid());
    assert_int_equal(symlink(target, link), 0);
    sumo__ckpt_id id = id_at(dir, 4);
    assert_int_equal(sumo__checkpoint_write_rank(&id, PAYLOAD, sizeof PAYLOAD, err, sizeof err),
                     SUMO_SUCCESS);
    assert_int_equal(sumo__checkpoint_write_manifest(&id, err, sizeof err), SUMO_SUCCESS);
    /* The results writer, in a folder anyone may write (sticky, as /tmp). */
    snprintf(open_dir, sizeof open_dir, "%s/shared", dir);
    assert_int_equal(mkdir(open_dir, 01777), 0);
    assert_int_equal(chmod(open_dir, 01777), 0);
    char out[160];
    snprintf(out, sizeof out, "%s/results.json", open_dir);
    snprintf(link, sizeof link, "%s.tmp.%ld", out, (long)getpid());
    assert_int_equal(symlink(target, link), 0);
    assert_int_equal(sumo__write_file_atomic(out, "{}\n", 3, err, sizeof err), SUMO_SUCCESS);
    char got[32] = "";
    f = fopen(target, "r");
    assert_non_null(f);
    assert_non_null(fgets(got, sizeof got, f));
    fclose(f);
    assert_string_equal(got, "precious");
    void *payload = NULL;
    size_t bytes = 0;
    assert_int_equal(sumo__checkpoint_read_rank(&id, &payload, &bytes, err, sizeof err),
                     SUMO_SUCCESS);
    assert_int_equal(bytes, sizeof PAYLOAD);
    assert_memory_equal(payload, PAYLOAD, sizeof PAYLOAD);
    free(payload);
    remove_tree(dir);
}

static void on_alarm(int sig)
{
    (void)sig;
    static const char m[] = "a FIFO as a rank file blocked the read\n";
    (void)!write(2, m, sizeof m - 1);
    _exit(1);
}

static void test_fifo_rank_file_refused_at_once(void **state)
{
    (void)state;
    char dir[64], path[128], err[512];
    make_dir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/step-4.rank-0.ckpt", dir);
    assert_int_equal(mkfifo(path, 0600), 0);
    snprintf(path, sizeof path, "%s/latest", dir);
    assert_int_equal(mkfifo(path, 0600), 0);
    signal(SIGALRM, on_alarm);
    alarm(20);
    sumo__ckpt_id id = id_at(dir, 4);
    void *payload = NULL;
    size_t bytes = 0;
    assert_int_equal(sumo__checkpoint_read_rank(&id, &payload, &bytes, err, sizeof err),
                     SUMO_ERR_SYSTEM);
    assert_non_null(strstr(err, "not a regular file"));
    long step = -1;
    assert_int_not_equal(sumo__checkpoint_read_manifest(&id, &step, err, sizeof err),
                         SUMO_SUCCESS);
    assert_non_null(strstr(err, "not a regular file"));
    alarm(0);
    remove_tree(dir);
}

static void test_header_edited_to_another_step_fails_crc(void **state)
{
    (void)state;
    char dir[64], from[128], to[128], err[512];
    make_dir(dir, sizeof dir);
    sumo__ckpt_id two = id_at(dir, 2), four = id_at(dir, 4);
    assert_int_equal(sumo__checkpoint_write_rank(&two, PAYLOAD, sizeof PAYLOAD, err, sizeof err),
                     SUMO_SUCCESS);
    snprintf(from, sizeof from, "%s/step-2.rank-0.ckpt", dir);
    snprintf(to, sizeof to, "%s/step-4.rank-0.ckpt", dir);
    assert_int_equal(rename(from, to), 0);
    /* The header's step (an int64 after magic, version, rank, size and crc: offset 24). */
    int fd = open(to, O_RDWR);
    assert_true(fd >= 0);
    int64_t step = 0;
    assert_int_equal(pread(fd, &step, sizeof step, 24), (ssize_t)sizeof step);
    assert_int_equal(step, 2);
    step = 4;
    assert_int_equal(pwrite(fd, &step, sizeof step, 24), (ssize_t)sizeof step);
    close(fd);
    void *payload = NULL;
    size_t bytes = 0;
    assert_int_equal(sumo__checkpoint_read_rank(&four, &payload, &bytes, err, sizeof err),
                     SUMO_ERR_INVALID_ARGUMENT);
    print_message("%s\n", err);
    assert_non_null(strstr(err, "CRC"));
    remove_tree(dir);
}

static void test_swapped_store_folder_not_followed(void **state)
{
    (void)state;
    char parent[64], dir[128], moved[128], elsewhere[128];
    make_dir(parent, sizeof parent);
    assert_int_equal(chmod(parent, 01777), 0); /* a parent anyone may write, as /tmp */
    snprintf(dir, sizeof dir, "%s/store", parent);
    snprintf(moved, sizeof moved, "%s/store.moved", parent);
    snprintf(elsewhere, sizeof elsewhere, "%s/elsewhere", parent);
    sumo_store *store = NULL;
    assert_int_equal(sumo_store_create_dir(dir, &store), SUMO_SUCCESS);
    /* The swap: the checked folder moves away, a link to another folder takes its path. */
    assert_int_equal(mkdir(elsewhere, 0700), 0);
    assert_int_equal(rename(dir, moved), 0);
    assert_int_equal(symlink(elsewhere, dir), 0);
    char planted[160];
    snprintf(planted, sizeof planted, "%s/k.x", elsewhere);
    FILE *f = fopen(planted, "w");
    assert_non_null(f);
    fputs("planted", f);
    fclose(f);
    assert_int_equal(store->set(store->ctx, "y", "mine", 4), SUMO_SUCCESS);
    char got[16] = "";
    size_t bytes = sizeof got;
    /* The planted record is not read: the key is not in the checked folder. */
    assert_int_equal(store->get(store->ctx, "x", got, &bytes, sumo_test_now_ns()),
                     SUMO_ERR_TIMEOUT);
    char path[160];
    snprintf(path, sizeof path, "%s/k.y", moved);
    assert_int_equal(access(path, F_OK), 0);
    snprintf(path, sizeof path, "%s/k.y", elsewhere);
    assert_int_equal(access(path, F_OK), -1);
    assert_int_equal(sumo_store_destroy_dir(store, 1), SUMO_SUCCESS);
    remove_tree(parent);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_foreign_named_segment_refused),
        cmocka_unit_test(test_foreign_memfd_refused),
        cmocka_unit_test(test_foreign_checkpoint_folder_refused),
        cmocka_unit_test(test_planted_links_do_not_redirect_writes),
        cmocka_unit_test(test_fifo_rank_file_refused_at_once),
        cmocka_unit_test(test_header_edited_to_another_step_fails_crc),
        cmocka_unit_test(test_swapped_store_folder_not_followed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
