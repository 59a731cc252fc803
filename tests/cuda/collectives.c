/*
 * test_cuda: collectives on the threads transport, buffers in `kind` memory (as test_seams.c
 * runs a third-party table): sum, average and Adasum at P = 2, 3, 4, sum and average bit for
 * bit the host path's, Adasum within the tree's bound of the float64 reference, identical on
 * every rank and run; on the device (a stream per rank), also the emulated run's bits.
 */
#include "cuda_test.h"

#include <cuda_runtime_api.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { OPK_SUM, OPK_AVG, OPK_ADASUM, OPK_ADASUM_LAYOUT };
static const char *OPK_NAME[] = {"sum", "average", "Adasum", "Adasum per tensor"};

typedef struct cjob {
    int kind;
    int P;
    sumo_dtype dt;
    int opk;
    bool in_place;
    size_t n;
    unsigned char *out[MAXP], *again[MAXP];
    sumo_result res[MAXP];
    char msg[MAXP][256];
} cjob;

static double input_value(const cjob *j, int rank, size_t i)
{
    return j->opk >= OPK_ADASUM ? harness_uniform_at(17, (uint64_t)rank, i)
                                : harness_collective_value(rank, i, false);
}

static sumo_result one_allreduce(const cjob *j, sumo_comm *comm, const void *send, void *recv,
                                 sumo_op op, void *stream)
{
    if (j->kind == M_DEV) return sumo_cuda_allreduce(send, recv, j->n, j->dt, op, comm, stream);
    sumo_collective c = {.struct_size = sizeof c, .kind = SUMO_COLLECTIVE_ALLREDUCE, .sendbuf = send,
                         .recvbuf = recv, .count = j->n, .dtype = j->dt, .op = op, .stream = stream};
    return sumo_collective_run(comm, &c);
}

static void cjob_rank(sumo_comm *comm, int rank, int size, void *arg)
{
    (void)size;
    cjob *j = arg;
    size_t bytes = j->n * esz(j->dt);
    sumo_result r = SUMO_SUCCESS;
    cudaStream_t stream = NULL;
    if (j->kind != M_HOST) r = sumo_comm_add_kernels(comm, table_of(j->kind));
    if (j->kind == M_DEV && cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess)
        r = SUMO_ERR_SYSTEM;
    unsigned char *h = malloc(bytes + 1);
    for (size_t i = 0; i < j->n; i++) harness_set(j->dt, h, i, input_value(j, rank, i));
    unsigned char *send = m_alloc(j->kind, bytes), *recv = m_alloc(j->kind, bytes);
    sumo_op op = j->opk == OPK_SUM ? SUMO_OP_SUM : j->opk == OPK_AVG ? SUMO_OP_AVERAGE : SUMO_OP_ADASUM;
    if (r == SUMO_SUCCESS && j->opk == OPK_ADASUM_LAYOUT) {
        sumo_adasum_options o = {.struct_size = sizeof o, .tensor_counts = LAYOUT, .ntensors = NLAYOUT};
        r = sumo_op_create_adasum(comm, &o, &op);
    }
    j->out[rank] = malloc(bytes + 1);
    j->again[rank] = malloc(bytes + 1);
    for (int rep = 0; rep < 2 && r == SUMO_SUCCESS; rep++) {
        /* The input goes in on this rank's stream: the call must wait for it. */
        if (j->kind == M_DEV) cudaMemcpyAsync(send, h, bytes, cudaMemcpyHostToDevice, stream);
        else m_put(j->kind, send, h, bytes);
        void *dst = j->in_place ? send : recv;
        r = one_allreduce(j, comm, send, dst, op, stream);
        m_get(j->kind, rep ? j->again[rank] : j->out[rank], dst, bytes);
    }
    j->res[rank] = r;
    const char *m = "";
    sumo_comm_error_message(comm, &m);
    snprintf(j->msg[rank], sizeof j->msg[rank], "%s", m);
    m_free(j->kind, send);
    m_free(j->kind, recv);
    if (stream) cudaStreamDestroy(stream);
    free(h);
}

static void cjob_free(cjob *j)
{
    for (int r = 0; r < j->P; r++) {
        free(j->out[r]);
        free(j->again[r]);
    }
}

/* Adasum's float64 reference: every rank's input, rounded to the dtype, through the tree. */
static double adasum_error(const cjob *j, const unsigned char *got)
{
    size_t offs[NLAYOUT + 1];
    size_t T = j->opk == OPK_ADASUM_LAYOUT ? NLAYOUT : 1;
    if (T == NLAYOUT) layout_offsets(offs);
    else offs[0] = 0, offs[1] = j->n;
    double *u[MAXP];
    for (int r = 0; r < j->P; r++) {
        u[r] = malloc(j->n * sizeof(double) + 8);
        for (size_t i = 0; i < j->n; i++) u[r][i] = ref_round_to(j->dt, input_value(j, r, i));
    }
    double *in_norm = calloc(T, sizeof(double));
    for (size_t t = 0; t < T; t++)
        for (int r = 0; r < j->P; r++)
            for (size_t i = offs[t]; i < offs[t + 1]; i++) in_norm[t] += u[r][i] * u[r][i];
    ref_adasum_tree(u, j->P, offs, T);
    double worst = 0;
    for (size_t t = 0; t < T; t++) {
        double dd = 0;
        for (size_t i = offs[t]; i < offs[t + 1]; i++) {
            double diff = harness_get(j->dt, got, i) - u[0][i];
            dd += diff * diff;
        }
        if (in_norm[t] > 0) worst = fmax(worst, sqrt(dd / in_norm[t]));
    }
    for (int r = 0; r < j->P; r++) free(u[r]);
    free(in_norm);
    return worst;
}

/* Runs the job on `kind` memory; compares with the host path (sum, average: bit for bit) and,
 * with `emu` given (the same job on emulated memory), with it bit for bit. */
static void check_collective(int kind, int P, sumo_dtype dt, int opk, bool in_place, size_t n,
                             bool compare_emulated)
{
    cjob got = {.kind = kind, .P = P, .dt = dt, .opk = opk, .in_place = in_place, .n = n};
    cjob host = got, emu = got;
    host.kind = M_HOST;
    emu.kind = M_EMU;
    CHECK(harness_run_threads(P, cjob_rank, &got) == 0, "threads");
    CHECK(harness_run_threads(P, cjob_rank, &host) == 0, "threads");
    if (compare_emulated) CHECK(harness_run_threads(P, cjob_rank, &emu) == 0, "threads");
    size_t bytes = n * esz(dt);
    const char *what = OPK_NAME[opk];
    for (int r = 0; r < P; r++) {
        CHECK(got.res[r] == SUMO_SUCCESS && host.res[r] == SUMO_SUCCESS,
              "%s %s P %d rank %d: %s (%s) / host %s", what, DT_NAME[dt], P, r,
              sumo_result_name(got.res[r]), got.msg[r], sumo_result_name(host.res[r]));
        CHECK(memcmp(got.out[r], got.out[0], bytes) == 0, "%s %s P %d: rank %d differs from rank 0",
              what, DT_NAME[dt], P, r);
        CHECK(memcmp(got.again[r], got.out[r], bytes) == 0, "%s %s P %d rank %d: a second run differs",
              what, DT_NAME[dt], P, r);
        if (opk <= OPK_AVG) {
            size_t at = first_diff(dt, got.out[r], host.out[r], n);
            CHECK(at == SIZE_MAX, "%s %s P %d in place %d rank %d differs from the host path at %zu",
                  what, DT_NAME[dt], P, in_place, r, at);
        }
        if (compare_emulated) {
            CHECK(emu.res[r] == SUMO_SUCCESS, "emulated run");
            size_t at = first_diff(dt, got.out[r], emu.out[r], n);
            CHECK(at == SIZE_MAX, "%s %s P %d in place %d rank %d: device and emulator differ at %zu",
                  what, DT_NAME[dt], P, in_place, r, at);
        }
    }
    if (opk >= OPK_ADASUM) {
        int levels = 0;
        while ((1 << levels) < P) levels++;
        double tol = 8.0 * (levels + 1) * harness_eps(dt);
        double e_got = adasum_error(&got, got.out[0]), e_host = adasum_error(&host, host.out[0]);
        CHECK(e_got <= tol, "%s %s P %d: error %.3g over %.3g (host path %.3g)", what, DT_NAME[dt], P,
              e_got, tol, e_host);
    }
    cjob_free(&got);
    cjob_free(&host);
    if (compare_emulated) cjob_free(&emu);
}

void check_collectives(int kind)
{
    size_t offs[NLAYOUT + 1], total = layout_offsets(offs);
    for (int P = 2; P <= 4; P++)
        for (size_t d = 0; d < 4; d++)
            for (int opk = 0; opk < 4; opk++)
                for (int ip = 0; ip <= 1; ip++) {
                    if (g_quick && (ip || d == 1)) continue;
                    size_t n = opk == OPK_ADASUM_LAYOUT ? total : opk == OPK_ADASUM ? 20011 : 30001;
                    int before = g_failed_checks;
                    check_collective(kind, P, DTS[d], opk, ip, n, kind == M_DEV);
                    if (g_failed_checks != before) return;
                }
}
