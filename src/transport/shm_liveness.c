#include "transport/shm_liveness.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

/* ---- processes ------------------------------------------------------------------------------ */

/* State letter and start time of a process from /proc/<pid>/stat; false when unreadable. */
static bool proc_stat(pid_t pid, char *state, uint64_t *start)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return false;
    buf[n] = '\0';
    /* The command name may hold spaces and parentheses: fields restart after the last ')'. */
    char *p = strrchr(buf, ')');
    if (p == NULL || p[1] != ' ') return false;
    *state = p[2];
    /* The start time is field 22; the state is field 3. */
    p += 2;
    for (int field = 3; field < 22; field++) {
        p = strchr(p, ' ');
        if (p == NULL) return false;
        p++;
    }
    char *end;
    *start = strtoull(p, &end, 10);
    return end != p;
}

uint64_t sumo__shm_own_start(void)
{
    char state;
    uint64_t start = 0;
    return proc_stat(getpid(), &state, &start) ? start : 0;
}

static int open_pidfd(pid_t pid)
{
#ifdef SYS_pidfd_open
    return (int)syscall(SYS_pidfd_open, pid, 0);
#else
    (void)pid;
    errno = ENOSYS;
    return -1;
#endif
}

/* Whether the process with this pid has ended (a zombie counts); false when unknown. */
static bool pid_ended(pid_t pid)
{
    char state;
    uint64_t start;
    if (kill(pid, 0) != 0 && errno == ESRCH) return true;
    return proc_stat(pid, &state, &start) && (state == 'Z' || state == 'X');
}

bool sumo__shm_still_running(pid_t pid, uint64_t start)
{
    char state;
    uint64_t now;
    return proc_stat(pid, &state, &now) && now == start && state != 'Z' && state != 'X';
}

/* ---- watching the peers --------------------------------------------------------------------- */

bool sumo__shm_watch_init(sumo__shm_watch *w, int rank, int size)
{
    *w = (sumo__shm_watch){.rank = rank, .size = size, .also = -1};
    w->pidfd = malloc(sizeof *w->pidfd * (size_t)size);
    w->pid = calloc((size_t)size, sizeof *w->pid);
    for (int r = 0; w->pidfd && r < size; r++) w->pidfd[r] = -1;
    return w->pidfd && w->pid;
}

void sumo__shm_watch_free(sumo__shm_watch *w)
{
    for (int r = 0; w->pidfd && r < w->size; r++)
        if (w->pidfd[r] >= 0) close(w->pidfd[r]);
    free(w->pidfd);
    free(w->pid);
    w->pidfd = NULL;
    w->pid = NULL;
}

/* Whether rank r's process has ended; why says how that was seen. */
static bool rank_dead(const sumo__shm_watch *w, int r, char *why, size_t why_bytes)
{
    pid_t pid = w->pid[r];
    if (w->pidfd[r] >= 0) {
        struct pollfd p = {.fd = w->pidfd[r], .events = POLLIN};
        if (poll(&p, 1, 0) <= 0) return false;
    } else {
        char state;
        uint64_t start;
        /* A start time other than the rank's: the pid was recycled after the rank ended. */
        bool recycled = w->info[r].start != 0 && proc_stat(pid, &state, &start) &&
                        start != w->info[r].start;
        if (pid <= 0 || !(recycled || pid_ended(pid))) return false;
    }
    snprintf(why, why_bytes, "died (process %d ended: killed, crashed or exited without "
                             "destroying its handle)", (int)pid);
    return true;
}

/* shm.c's watch: the ranks a wait depends on (peer and `also`, or every rank). */
static int watch_peers(sumo__shm *shm, int peer, char *why, size_t why_bytes)
{
    const sumo__shm_watch *w = shm->watch_ctx;
    if (peer < 0) {
        for (int r = 0; r < w->size; r++)
            if (r != w->rank && rank_dead(w, r, why, why_bytes)) return r;
        return -1;
    }
    if (rank_dead(w, peer, why, why_bytes)) return peer;
    int also = w->also;
    if (also < 0) return -1;
    if (atomic_load(&shm->ctl->desc[also].gone)) {
        snprintf(why, why_bytes, "left the group (its handle was destroyed)");
        return also;
    }
    return rank_dead(w, also, why, why_bytes) ? also : -1;
}

/* A pid this process cannot see, or whose start time is not the one its rank wrote, is another
 * PID namespace's: that rank is then left to the deadline rather than judged by a stranger. */
void sumo__shm_watch_start(sumo__shm_watch *w, sumo__shm *shm, const sumo__shm_rank_info *info)
{
    w->info = info;
    for (int r = 0; r < w->size; r++) {
        w->pidfd[r] = -1;
        w->pid[r] = 0;
        if (r == w->rank) continue;
        pid_t pid = (pid_t)atomic_load(&info[r].pid);
        uint64_t start = info[r].start;
        if (pid <= 0) continue;
        int fd = open_pidfd(pid);
        char state;
        uint64_t now_start;
        /* Read after the pidfd holds the process, so both name the same one. */
        bool seen = proc_stat(pid, &state, &now_start);
        if ((fd < 0 && !seen && kill(pid, 0) != 0 && errno == ESRCH) ||
            (start != 0 && seen && now_start != start)) {
            if (fd >= 0) close(fd);
            continue;
        }
        w->pidfd[r] = fd;
        w->pid[r] = pid;
    }
    shm->watch = watch_peers;
    shm->watch_ctx = w;
}
