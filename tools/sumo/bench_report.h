/*
 * What sumo bench prints: the table in nccl-tests' layout (lines starting with '#' are
 * comments, the others are rows), the memory section, the derived figures, and
 * the same measurements as CSV rows. Only the printing process (rank 0 of the run) prints.
 */
#ifndef SUMO_TOOL_BENCH_REPORT_H
#define SUMO_TOOL_BENCH_REPORT_H

#include "bench_membw.h"
#include "bench_options.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

/* One allreduce measurement: a rank count, a size and an op. */
typedef struct bench_row {
    int ranks;
    size_t bytes;
    int op;
    int status; /* sumo_result of the op; 0 when it ran */
    double med_us, min_us;
    bool has_peer;
    double peer_med_us, peer_min_us;
    int check; /* a bench_verdict */
} bench_row;

typedef struct bench_report {
    const bench_opts *o;
    const char *transport;
    size_t sizes[BENCH_MAX_SIZES];
    int nsizes;
    bool printer;  /* this process prints (rank 0 of the run) */
    bool peer;     /* MPI_Allreduce is measured beside sumo */
    int nodes;     /* machines the ranks run on */
    int world_size;
    FILE *csv;
    bench_row *rows;
    size_t nrows, cap;
    int failures; /* rows that failed or did not check out */
} bench_report;

/* Opens --csv on the printing process only, so that no other rank truncates its file; 0 or
 * -1 after saying why on stderr. */
int bench_report_open_csv(bench_report *rep);
void bench_report_close(bench_report *rep);

void bench_print_machine(const bench_report *rep);
/* The MPI library's line, under the machine's. */
void bench_print_mpi(const bench_report *rep, const char *version, int provided, int wanted,
                     int ranks_on_node);
void bench_print_stream(const bench_report *rep, const bench_mem_results *m);
void bench_print_table_header(const bench_report *rep, int p);

/* Prints a row (err_detail: the library's message for a failure, or NULL; why: the check's
 * reason for a FAIL or n/a), writes its CSV row, counts it when it failed and keeps it for
 * the derived figures. */
void bench_report_row(bench_report *rep, const bench_row *r, const char *err_detail,
                      const char *why);

void bench_print_derived(const bench_report *rep, const bench_mem_results *m);

#endif
