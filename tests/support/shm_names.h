/*
 * The POSIX shared-memory names sumo's shm transport makes ("sumo.<pid>.<nonce>" in
 * /dev/shm), which none of a test's processes may leave behind. Shared by the unit tests and
 * test_cuda, so it asserts nothing: the caller says what a leftover means in its framework.
 */
#ifndef SUMO_TEST_SHM_NAMES_H
#define SUMO_TEST_SHM_NAMES_H

#include <dirent.h>
#include <stdio.h>
#include <sys/types.h>

/* Names in /dev/shm made by one of pids, each printed; returns how many. */
static inline int leftovers(const pid_t *pids, int n)
{
    DIR *d = opendir("/dev/shm");
    if (d == NULL) return 0;
    int found = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        int pid = 0;
        if (sscanf(e->d_name, "sumo.%d.", &pid) != 1) continue;
        for (int i = 0; i < n; i++)
            if (pids[i] == pid) {
                fprintf(stderr, "left behind: /dev/shm/%s\n", e->d_name);
                found++;
            }
    }
    closedir(d);
    return found;
}

#endif
