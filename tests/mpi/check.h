/*
 * What the MPI tests share: this process's rank and the group's size, and a check that fails
 * when it failed on any rank (so rank 0's tally speaks for the job). One copy per test
 * program: each is a single file.
 */
#ifndef SUMO_TEST_MPI_CHECK_H
#define SUMO_TEST_MPI_CHECK_H

#include <mpi.h>
#include <stdbool.h>
#include <stdio.h>

static int g_rank, g_size, g_passed, g_failed;

static void check(bool ok, const char *what)
{
    int bad = !ok, any = 0;
    MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (any) {
        g_failed++;
        if (bad) fprintf(stderr, "rank %d/%d: FAILED %s\n", g_rank, g_size, what);
    } else {
        g_passed++;
    }
}

#endif
