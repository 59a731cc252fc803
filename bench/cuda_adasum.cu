/*
 * The fused Adasum combine on one GPU, as sumo's Gram form runs it: the Gram partials of P
 * inputs in one launch, the Adasum tree's weights from them on the host, the weighted sum in a
 * second launch (the CUDA table's gram_partials and weighted_sum entries, each waited for, as
 * a collective calls them). Reports time, GB/s and the share of the device's memory bandwidth,
 * measured in the same run by a device-to-device copy (bytes read plus written).
 *
 *   cuda_adasum [--csv FILE] [--sizes 1,4,16,64,256,1024] [--ranks 2,4,8] [--quick]
 *
 * Two kinds of row: `fused`, the table's two entries with the weights on the host between
 * them (sumo__adasum_gram_weights, as a collective weighs), and `device`,
 * sumo_cuda_adasum_combine: the same kernels and weights with the weights computed on the
 * device, one wait per combine. Their outputs must be the same bits (checked). At 1 MiB each
 * row also reports its fixed cost: the time less the bytes at the measured copy bandwidth
 * (issue 30's goal for the device combine: <= 15 us).
 *
 * Sizes are MiB per input (fp32). Bytes moved by the combine: P inputs read twice (Gram pass,
 * weighted sum) and one output written: (2P + 1) x size; fewer cannot be (the weights need
 * every input before the sum can start). bench/torch_adasum_cuda.py times the torch
 * compositions on the same inputs and joins the two into a table.
 *
 * Also: sumo_cuda_allreduce with SUMO_OP_ADASUM on the threads transport, P ranks sharing the
 * GPU with a stream each (the whole collective: agreement, Gram pass, the partials' sum, the
 * weighted sum into every rank's output, barriers), for P = 2 and 4.
 */
#define SUMO_EXPERIMENTAL_API 1
#include "sumo.h"
#include "sumo_cuda.h"
#include "sumo_ext.h"
/* The library's own weights: the fused rows weigh as a collective does. */
#include "collectives/adasum_gram.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <vector>

#define CUDA_OK(call)                                                                       \
    do {                                                                                    \
        cudaError_t e_ = (call);                                                            \
        if (e_ != cudaSuccess) {                                                            \
            fprintf(stderr, "cuda_adasum: %s: %s (%s:%d)\n", #call, cudaGetErrorString(e_), \
                    __FILE__, __LINE__);                                                    \
            exit(1);                                                                        \
        }                                                                                   \
    } while (0)
#define SUMO_OK(call)                                                                        \
    do {                                                                                     \
        sumo_result r_ = (call);                                                             \
        if (r_ != SUMO_SUCCESS) {                                                            \
            fprintf(stderr, "cuda_adasum: %s: %s (%s:%d)\n", #call, sumo_result_name(r_),    \
                    __FILE__, __LINE__);                                                     \
            exit(1);                                                                         \
        }                                                                                    \
    } while (0)

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double median(std::vector<double> v)
{
    std::sort(v.begin(), v.end());
    size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Gradient-like inputs: a shared direction plus each rank's own noise, so that the Adasum
 * weights are those of training, not of orthogonal noise (and no input is zeros). */
__device__ __forceinline__ float uniform_at(unsigned long long seed, unsigned long long i)
{
    unsigned long long z = seed * 0x9E3779B97F4A7C15ull + i * 0xBF58476D1CE4E5B9ull + 1;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (float)((double)(z >> 11) * 0x1.0p-53 * 2.0 - 1.0);
}

__global__ void fill_kernel(float *x, size_t n, int rank)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        x[i] = uniform_at(12345, i) + 0.5f * uniform_at(1000 + (unsigned long long)rank, i);
}

static void fill(float *x, size_t n, int rank, cudaStream_t s)
{
    fill_kernel<<<4096, 256, 0, s>>>(x, n, rank);
    CUDA_OK(cudaGetLastError());
}

/* The weights a collective applies (collectives/adasum.c: flat, 8 epsilon asked of fp32's
 * norms); false where the Gram form declines (then a collective runs the tree). */
static bool adasum_weights(const double *packed, int P, double *w)
{
    sumo__adasum_gram_params p = {P, 1, 8 * 0x1p-23, 0};
    std::vector<double> work(sumo__adasum_gram_work_len(P));
    unsigned char flags = 0;
    sumo__adasum_gram_weights(&p, packed, 1, w, &flags, work.data());
    return flags == 0;
}

static std::vector<int> parse_list(const char *s)
{
    std::vector<int> v;
    while (*s) {
        v.push_back(atoi(s));
        const char *c = strchr(s, ',');
        if (!c) break;
        s = c + 1;
    }
    return v;
}

/* A device-to-device copy of `bytes`, median of reps, counting bytes read and written. */
static double copy_bandwidth(size_t bytes)
{
    void *a, *b;
    CUDA_OK(cudaMalloc(&a, bytes));
    CUDA_OK(cudaMalloc(&b, bytes));
    CUDA_OK(cudaMemset(a, 1, bytes));
    cudaEvent_t e0, e1;
    CUDA_OK(cudaEventCreate(&e0));
    CUDA_OK(cudaEventCreate(&e1));
    std::vector<double> t;
    for (int rep = 0; rep < 13; rep++) {
        CUDA_OK(cudaEventRecord(e0));
        CUDA_OK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice));
        CUDA_OK(cudaEventRecord(e1));
        CUDA_OK(cudaEventSynchronize(e1));
        float ms;
        CUDA_OK(cudaEventElapsedTime(&ms, e0, e1));
        if (rep >= 3) t.push_back(ms * 1e-3);
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaFree(a);
    cudaFree(b);
    return 2.0 * (double)bytes / median(t);
}

struct coll_arg {
    const sumo_cuda_kernels *k;
    size_t n;
    int reps, P;
    std::vector<double> times; /* rank 0's */
    /* sumo_threads_run ends a rank's handle when its function returns, which fails a peer
     * still finishing the last collective: each rank waits here for all of them first. */
    pthread_mutex_t lock;
    pthread_cond_t all_done;
    int done;
};

static sumo_result coll_rank(sumo_comm *comm, int rank, void *p)
{
    coll_arg *a = (coll_arg *)p;
    cudaStream_t s;
    if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) return SUMO_ERR_SYSTEM;
    sumo_result r = sumo_comm_add_cuda(comm, a->k);
    float *in = NULL, *out = NULL;
    if (cudaMalloc(&in, a->n * 4) != cudaSuccess || cudaMalloc(&out, a->n * 4) != cudaSuccess)
        r = SUMO_ERR_SYSTEM;
    if (r == SUMO_SUCCESS) fill(in, a->n, rank, s);
    for (int rep = 0; rep < a->reps + 2 && r == SUMO_SUCCESS; rep++) {
        r = sumo_barrier(comm);
        double t0 = now_s();
        if (r == SUMO_SUCCESS) r = sumo_cuda_allreduce(in, out, a->n, SUMO_FLOAT32, SUMO_OP_ADASUM, comm, s);
        double t1 = now_s();
        if (rank == 0 && rep >= 2) a->times.push_back(t1 - t0);
    }
    cudaFree(in);
    cudaFree(out);
    cudaStreamDestroy(s);
    pthread_mutex_lock(&a->lock);
    if (++a->done == a->P) pthread_cond_broadcast(&a->all_done);
    while (a->done < a->P) pthread_cond_wait(&a->all_done, &a->lock);
    pthread_mutex_unlock(&a->lock);
    return r;
}

int main(int argc, char **argv)
{
    const char *csv_path = NULL;
    std::vector<int> sizes = {1, 4, 16, 64, 256, 1024}, ranks = {2, 4, 8};
    bool quick = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--csv") && i + 1 < argc) csv_path = argv[++i];
        else if (!strcmp(argv[i], "--sizes") && i + 1 < argc) sizes = parse_list(argv[++i]);
        else if (!strcmp(argv[i], "--ranks") && i + 1 < argc) ranks = parse_list(argv[++i]);
        else if (!strcmp(argv[i], "--quick")) quick = true;
        else {
            fprintf(stderr, "usage: %s [--csv FILE] [--sizes MiB,..] [--ranks P,..] [--quick]\n", argv[0]);
            return 2;
        }
    }
    if (quick) sizes = {1, 16, 64}, ranks = {2, 4};
    int ndev = 0;
    char why[256];
    SUMO_OK(sumo_cuda_device_count(&ndev, why, sizeof why));
    if (ndev == 0) {
        printf("cuda_adasum: skipped: %s\n", why);
        return 0;
    }
    cudaDeviceProp prop;
    CUDA_OK(cudaGetDeviceProperties(&prop, 0));
    double bw = copy_bandwidth((size_t)1 << 30);
    printf("device: %s, %d SMs; device-to-device copy %.0f GB/s (read + write, 1 GiB)\n", prop.name,
           prop.multiProcessorCount, bw * 1e-9);
    FILE *csv = csv_path ? fopen(csv_path, "w") : NULL;
    if (csv_path && !csv) {
        perror(csv_path);
        return 1;
    }
    if (csv) {
        fprintf(csv, "# device=%s copy_GBps=%.1f\n", prop.name, bw * 1e-9);
        fprintf(csv, "kind,P,size_mib,median_ms,min_ms,gram_ms,weights_ms,wsum_ms,GBps,pct_copy_bw,reps,fixed_us\n");
    }
    sumo_cuda_kernels *k;
    SUMO_OK(sumo_cuda_kernels_create(0, &k));
    const sumo_kernel_table *t;
    SUMO_OK(sumo_cuda_kernels_table(k, &t));
    cudaStream_t s;
    CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    printf("%-8s %3s %8s %10s %10s %9s %9s %9s %8s %7s %8s\n", "kind", "P", "MiB", "median ms", "min ms",
           "gram ms", "wts ms", "wsum ms", "GB/s", "% copy", "fixed us");
    for (int P : ranks)
        for (int mib : sizes) {
            size_t n = (size_t)mib << 18; /* fp32 elements */
            std::vector<float *> in(P);
            float *out;
            for (int r = 0; r < P; r++) {
                CUDA_OK(cudaMalloc(&in[r], n * 4));
                fill(in[r], n, r, s);
            }
            CUDA_OK(cudaMalloc(&out, n * 4));
            CUDA_OK(cudaStreamSynchronize(s));
            const size_t offsets[2] = {0, n};
            std::vector<double> gram((size_t)P * (P + 1) / 2), w(P);
            std::vector<double> tot, tg, tw, ts;
            double budget = quick ? 0.3 : 1.0, spent = 0;
            int reps = 0;
            for (int rep = 0; rep < 200 && (rep < 5 || (spent < budget && reps < 50)); rep++) {
                std::fill(gram.begin(), gram.end(), 0.0);
                double t0 = now_s();
                SUMO_OK(t->gram_partials(t->ctx, s, SUMO_FLOAT32, (const void *const *)in.data(), P,
                                         offsets, 1, 0, n, gram.data()));
                double t1 = now_s();
                if (!adasum_weights(gram.data(), P, w.data())) {
                    fprintf(stderr, "cuda_adasum: P %d %d MiB: the Gram form declined\n", P, mib);
                    return 1;
                }
                double t2 = now_s();
                void *outs[1] = {out};
                SUMO_OK(t->weighted_sum(t->ctx, s, SUMO_FLOAT32, outs, 1, (const void *const *)in.data(), P,
                                        offsets, 1, 0, n, w.data()));
                double t3 = now_s();
                if (rep < 2) continue; /* warm-up: pool, module load */
                tot.push_back(t3 - t0);
                tg.push_back(t1 - t0);
                tw.push_back(t2 - t1);
                ts.push_back(t3 - t2);
                spent += t3 - t0;
                reps++;
            }
            /* A check of the result: a few elements against sum_k w_k x_k in double. */
            std::vector<float> hx(16), ho(16);
            double worst = 0;
            for (int q = 0; q < 16; q++) {
                size_t i = (size_t)q * (n / 16) + (size_t)q;
                CUDA_OK(cudaMemcpy(&ho[q], out + i, 4, cudaMemcpyDeviceToHost));
                double v = 0;
                for (int r = 0; r < P; r++) {
                    float x;
                    CUDA_OK(cudaMemcpy(&x, in[r] + i, 4, cudaMemcpyDeviceToHost));
                    v += w[r] * (double)x;
                }
                worst = fmax(worst, fabs(ho[q] - v) / (fabs(v) + 1e-30));
            }
            if (!(worst < 1e-6)) {
                fprintf(stderr, "cuda_adasum: P %d %d MiB: result off by %.3g\n", P, mib, worst);
                return 1;
            }
            double m = median(tot), bytes = (2.0 * P + 1) * (double)n * 4;
            double gbps = bytes / m * 1e-9, pct = 100.0 * bytes / m / bw;
            /* The fixed cost: what the bytes at copy bandwidth do not explain (1 MiB only, where
             * it dominates; larger sizes measure bandwidth). */
            double fixed_us = (m - bytes / bw) * 1e6;
            char fixed[32] = "";
            if (mib == 1) snprintf(fixed, sizeof fixed, "%.1f", fixed_us);
            printf("%-8s %3d %8d %10.3f %10.3f %9.3f %9.4f %9.3f %8.0f %6.1f%% %8s\n", "fused", P, mib, m * 1e3,
                   *std::min_element(tot.begin(), tot.end()) * 1e3, median(tg) * 1e3, median(tw) * 1e3,
                   median(ts) * 1e3, gbps, pct, fixed);
            if (csv)
                fprintf(csv, "fused,%d,%d,%.4f,%.4f,%.4f,%.5f,%.4f,%.1f,%.1f,%d,%s\n", P, mib, m * 1e3,
                        *std::min_element(tot.begin(), tot.end()) * 1e3, median(tg) * 1e3,
                        median(tw) * 1e3, median(ts) * 1e3, gbps, pct, reps, fixed);
            /* The device combine on the same inputs, into a second output: the same bits. */
            float *out2;
            CUDA_OK(cudaMalloc(&out2, n * 4));
            std::vector<double> td;
            spent = 0;
            reps = 0;
            /* Half the fused rows' time: gpu-check.sh's budget (under 6 minutes) holds. */
            for (int rep = 0; rep < 200 && (rep < 5 || (spent < 0.5 * budget && reps < 50)); rep++) {
                void *outs[1] = {out2};
                int applied = 0;
                double t0 = now_s();
                SUMO_OK(sumo_cuda_adasum_combine(k, SUMO_FLOAT32, outs, 1, (const void *const *)in.data(), P,
                                                 offsets, 1, s, &applied));
                double t1 = now_s();
                if (!applied) {
                    fprintf(stderr, "cuda_adasum: P %d %d MiB: the device combine declined\n", P, mib);
                    return 1;
                }
                if (rep < 2) continue;
                td.push_back(t1 - t0);
                spent += t1 - t0;
                reps++;
            }
            std::vector<float> h1(n), h2(n);
            CUDA_OK(cudaMemcpy(h1.data(), out, n * 4, cudaMemcpyDeviceToHost));
            CUDA_OK(cudaMemcpy(h2.data(), out2, n * 4, cudaMemcpyDeviceToHost));
            if (memcmp(h1.data(), h2.data(), n * 4) != 0) {
                fprintf(stderr, "cuda_adasum: P %d %d MiB: the device combine's bits differ from the table path's\n", P, mib);
                return 1;
            }
            cudaFree(out2);
            m = median(td);
            gbps = bytes / m * 1e-9, pct = 100.0 * bytes / m / bw;
            fixed_us = (m - bytes / bw) * 1e6;
            if (mib == 1) snprintf(fixed, sizeof fixed, "%.1f", fixed_us);
            printf("%-8s %3d %8d %10.3f %10.3f %9s %9s %9s %8.0f %6.1f%% %8s\n", "device", P, mib, m * 1e3,
                   *std::min_element(td.begin(), td.end()) * 1e3, "", "", "", gbps, pct, fixed);
            if (csv)
                fprintf(csv, "device,%d,%d,%.4f,%.4f,,,,%.1f,%.1f,%d,%s\n", P, mib, m * 1e3,
                        *std::min_element(td.begin(), td.end()) * 1e3, gbps, pct, reps, fixed);
            for (int r = 0; r < P; r++) cudaFree(in[r]);
            cudaFree(out);
        }
    /* The whole collective on the threads transport, P ranks on this GPU. */
    for (int P : {2, 4})
        for (int mib : quick ? std::vector<int>{16} : std::vector<int>{16, 64, 256}) {
            coll_arg a;
            a.k = k;
            a.n = (size_t)mib << 18;
            a.reps = quick ? 3 : 10;
            a.P = P;
            a.done = 0;
            pthread_mutex_init(&a.lock, NULL);
            pthread_cond_init(&a.all_done, NULL);
            std::vector<sumo_result> res(P);
            SUMO_OK(sumo_threads_run(P, coll_rank, &a, res.data()));
            pthread_cond_destroy(&a.all_done);
            pthread_mutex_destroy(&a.lock);
            double m = median(a.times);
            /* Each rank reads its slice of every input twice and writes it into every output:
             * P inputs read twice and P outputs written, 3P x size in all. */
            double bytes = (3.0 * P) * (double)a.n * 4;
            printf("%-8s %3d %8d %10.3f %10s %9s %9s %9s %8.0f %6.1f%%\n", "threads", P, mib, m * 1e3, "", "",
                   "", "", bytes / m * 1e-9, 100.0 * bytes / m / bw);
            if (csv)
                fprintf(csv, "threads,%d,%d,%.4f,,,,,%.1f,%.1f,%d,\n", P, mib, m * 1e3, bytes / m * 1e-9,
                        100.0 * bytes / m / bw, (int)a.times.size());
        }
    if (csv) fclose(csv);
    cudaStreamDestroy(s);
    sumo_cuda_kernels_destroy(k);
    return 0;
}
