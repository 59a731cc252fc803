/*
 * test_cuda: the two-level communicator (sumo_comm_create_hier), CUDA IPC inside a node and
 * NCCL between the nodes. On the host, each node's ranks on a threads communicator over
 * emulated device memory and, between the nodes, a threads communicator (host memory) with the
 * fake NCCL (fake_nccl.h) added for the device memory (sumo_comm_hier_add_across), against
 * threads communicators alone between them; on a device, one node and the real NCCL at one
 * rank per communicator.
 */
#include "cuda_test.h"
#include "fake_nccl.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define HL 2
#define HN 1203

/* What carries the nodes' traffic: threads communicators, the fake NCCL, or the real NCCL at
 * one rank per communicator (one node: NCCL refuses two ranks of one communicator on one
 * device). */
enum { ACROSS_THREADS, ACROSS_FAKE, ACROSS_NCCL };

/* H nodes of HL ranks, each node's ranks on a threads communicator (their kernels read each
 * other's buffers, as over CUDA IPC), on "device" buffers of kind mem: sum, average and
 * Adasum per tensor of the inputs harness_uniform_at(11 + op, rank, i). */
typedef struct hjob {
    int H, mem, across_kind;
    sumo_comm *node[MAXP][HL]; /* [node][local rank] */
    sumo_comm *across[HL][MAXP];
    fk_net nets[HL];
    float out[MAXP][3][HN];
    sumo_result res[MAXP];
    char msg[MAXP][320];
} hjob;

typedef struct hier_arg {
    hjob *x;
    int h, l;
} hier_arg;

static sumo_result hier_kernels(const hjob *x, sumo_comm *comm)
{
    return x->mem == M_DEV ? sumo_comm_add_cuda(comm, g_dev_kernels)
                           : sumo_comm_add_kernels(comm, g_emu_table);
}

static void *hier_rank(void *p)
{
    hier_arg *a = p;
    hjob *x = a->x;
    int rank = a->h * HL + a->l;
    sumo_comm *node = x->node[a->h][a->l], *across = x->across[a->l][a->h], *nccl = NULL;
    sumo_result r = SUMO_SUCCESS;
    if (x->across_kind == ACROSS_FAKE) {
        fk_rank *me = &x->nets[a->l].ranks[a->h];
        r = sumo_cuda__nccl_comm_create(&FAKE, me, me, &nccl);
    }
    /* The two-level communicator owns its levels from here on (and the NCCL one once added). */
    sumo_comm *hier = NULL;
    if (r == SUMO_SUCCESS) r = sumo_comm_create_hier(node, across, NULL, &hier);
    if (hier == NULL) {
        sumo_comm_destroy(node);
        sumo_comm_destroy(across);
    }
    if (r == SUMO_SUCCESS) r = hier_kernels(x, hier);
    if (r == SUMO_SUCCESS && nccl) {
        r = sumo_comm_hier_add_across(hier, nccl);
        if (r == SUMO_SUCCESS) nccl = NULL;
    }
    sumo_op adasum = SUMO_OP_ADASUM;
    static const size_t layout[] = {300, 1, 599, 0, 303};
    if (r == SUMO_SUCCESS) {
        sumo_adasum_options o = {.struct_size = sizeof o, .tensor_counts = layout, .ntensors = 5,
                                 .hierarchical = 1};
        r = sumo_op_create_adasum(hier, &o, &adasum);
    }
    size_t bytes = HN * sizeof(float);
    float *h = malloc(bytes), *buf = m_alloc(x->mem, bytes);
    const sumo_op ops[3] = {SUMO_OP_SUM, SUMO_OP_AVERAGE, adasum};
    for (int k = 0; k < 3 && r == SUMO_SUCCESS; k++) {
        for (int i = 0; i < HN; i++) h[i] = (float)harness_uniform_at(11 + (uint64_t)k, (uint64_t)rank, (size_t)i);
        m_put(x->mem, buf, h, bytes);
        r = sumo_allreduce(buf, buf, HN, SUMO_FLOAT32, ops[k], hier);
        m_get(x->mem, x->out[rank][k], buf, bytes);
    }
    const char *m = "";
    if (hier) sumo_comm_error_message(hier, &m);
    snprintf(x->msg[rank], sizeof x->msg[rank], "%s", m);
    x->res[rank] = r;
    sumo_comm_destroy(hier);
    sumo_comm_destroy(nccl);
    m_free(x->mem, buf);
    free(h);
    return NULL;
}

static void hier_run(hjob *x)
{
    for (int h = 0; h < x->H; h++) CHECK_OK(sumo_comm_create_threads(HL, x->node[h]));
    for (int l = 0; l < HL; l++) {
        if (x->across_kind == ACROSS_FAKE) fk_net_init(&x->nets[l], x->H);
        if (x->across_kind != ACROSS_NCCL) {
            CHECK_OK(sumo_comm_create_threads(x->H, x->across[l]));
        } else {
            unsigned char uid[128];
            CHECK_OK(sumo_nccl_unique_id(uid, sizeof uid));
            CHECK_OK(sumo_comm_create_nccl_rank(1, uid, sizeof uid, 0, 0, NULL, &x->across[l][0]));
        }
    }
    pthread_t ids[MAXP * HL];
    hier_arg args[MAXP * HL];
    for (int h = 0; h < x->H; h++)
        for (int l = 0; l < HL; l++) {
            args[h * HL + l] = (hier_arg){.x = x, .h = h, .l = l};
            pthread_create(&ids[h * HL + l], NULL, hier_rank, &args[h * HL + l]);
        }
    for (int i = 0; i < x->H * HL; i++) pthread_join(ids[i], NULL);
    for (int l = 0; l < HL && x->across_kind == ACROSS_FAKE; l++) fk_net_free(&x->nets[l]);
}

/* On the host, over emulated device memory: the fake NCCL between the nodes against threads
 * communicators between them (which move device memory only by their shared-memory
 * algorithms): sum and average bit for bit, Adasum per tensor within rounding (its
 * point-to-point and shared-memory forms may round apart); every rank the same bits; the sum
 * against two levels of in-order sums. */
void t_nccl_fake_hier(void)
{
    for (int H = 1; H <= 3; H++) {
        hjob *a = calloc(1, sizeof *a), *b = calloc(1, sizeof *b);
        a->H = b->H = H;
        a->mem = b->mem = M_EMU;
        a->across_kind = ACROSS_THREADS;
        b->across_kind = ACROSS_FAKE;
        hier_run(a);
        hier_run(b);
        for (int r = 0; r < H * HL; r++) {
            CHECK(a->res[r] == SUMO_SUCCESS && b->res[r] == SUMO_SUCCESS,
                  "H %d rank %d: threads %s (%s), nccl %s (%s)", H, r, sumo_result_name(a->res[r]),
                  a->msg[r], sumo_result_name(b->res[r]), b->msg[r]);
            for (int k = 0; k < 3; k++) {
                CHECK(k == 2 || memcmp(a->out[r][k], b->out[r][k], sizeof a->out[r][k]) == 0,
                      "H %d rank %d op %d: NCCL between the nodes differs from threads", H, r, k);
                CHECK(memcmp(b->out[r][k], b->out[0][k], sizeof b->out[r][k]) == 0,
                      "H %d rank %d op %d: differs from rank 0", H, r, k);
            }
            for (int i = 0; i < HN; i++) {
                float g = b->out[r][2][i], w = a->out[r][2][i];
                if (!(fabsf(g - w) <= 1e-5f * (1 + fabsf(w)))) {
                    CHECK(false, "H %d rank %d Adasum element %d: %g vs %g", H, r, i, g, w);
                    break;
                }
            }
        }
        /* Adasum: the documented tree over the nodes' averages, per tensor of the layout,
         * within rounding (the library rounds to fp32 after the node's average and every
         * combine; the reference stays in double). */
        {
            static const size_t off[] = {0, 300, 301, 900, 900, 1203};
            double *u[MAXP];
            for (int h = 0; h < H; h++) {
                u[h] = calloc(HN, sizeof(double));
                for (int i = 0; i < HN; i++) {
                    for (int l = 0; l < HL; l++)
                        u[h][i] += (float)harness_uniform_at(13, (uint64_t)(h * HL + l), (size_t)i);
                    u[h][i] /= HL;
                }
            }
            ref_adasum_tree(u, H, off, 5);
            for (int t = 0; t < 5; t++) {
                double dd = 0, ww = 0;
                for (size_t i = off[t]; i < off[t + 1]; i++) {
                    double diff = (double)b->out[0][2][i] - u[0][i];
                    dd += diff * diff, ww += u[0][i] * u[0][i];
                }
                CHECK(dd <= 1e-10 * (ww + 1e-30), "H %d Adasum tensor %d: relative error %.3g", H, t,
                      ww > 0 ? sqrt(dd / ww) : dd);
            }
            for (int h = 0; h < H; h++) free(u[h]);
        }
        /* The sum is two levels of in-order sums (fp32 accumulates in fp32). */
        for (int i = 0; i < HN; i++) {
            float want = 0;
            for (int h = 0; h < H; h++) {
                float node = 0;
                for (int l = 0; l < HL; l++)
                    node += (float)harness_uniform_at(11, (uint64_t)(h * HL + l), (size_t)i);
                want += node;
            }
            if (b->out[0][0][i] != want) {
                CHECK(false, "H %d sum element %d: %.9g, want %.9g", H, i, b->out[0][0][i], want);
                break;
            }
        }
        free(a);
        free(b);
    }
}

/* On a device: one node of HL ranks and, per local rank, a real NCCL communicator of one rank
 * between the "nodes": sum and average against the closed form of two inputs, Adasum over one
 * node's average = that average, every rank the same bits. */
void d_hier_one_node(void)
{
    unsigned char uid[128];
    if (sumo_nccl_unique_id(uid, sizeof uid) != SUMO_SUCCESS) {
        printf("    (NCCL not loaded; set SUMO_NCCL_LIBRARY)\n");
        CHECK(getenv("SUMO_CUDA_TEST_REQUIRE_NCCL") == NULL, "NCCL required");
        return;
    }
    hjob *x = calloc(1, sizeof *x);
    x->H = 1, x->mem = M_DEV, x->across_kind = ACROSS_NCCL;
    hier_run(x);
    for (int l = 0; l < HL; l++) {
        CHECK(x->res[l] == SUMO_SUCCESS, "rank %d: %s (%s)", l, sumo_result_name(x->res[l]), x->msg[l]);
        CHECK(memcmp(x->out[l], x->out[0], sizeof x->out[l]) == 0, "rank %d differs from rank 0", l);
    }
    int bad = 0;
    for (int i = 0; i < HN && bad < 3; i++) {
        float want[3];
        for (int k = 0; k < 3; k++) {
            float u = (float)harness_uniform_at(11 + (uint64_t)k, 0, (size_t)i);
            float v = (float)harness_uniform_at(11 + (uint64_t)k, 1, (size_t)i);
            want[k] = k == 0 ? u + v : (u + v) / 2;
        }
        if (x->out[0][0][i] != want[0] || x->out[0][1][i] != want[1] || x->out[0][2][i] != want[2]) {
            CHECK(false, "element %d: sum %.9g average %.9g Adasum %.9g, want %.9g, %.9g, %.9g", i,
                  x->out[0][0][i], x->out[0][1][i], x->out[0][2][i], want[0], want[1], want[2]);
            bad++;
        }
    }
    free(x);
}
