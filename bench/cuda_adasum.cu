/*
 * The fused Adasum combine on one GPU, as sumo's Gram form runs it: the Gram partials of P
 * inputs in one launch, the Adasum tree's weights from them on the host, the weighted sum in a
 * second launch (the CUDA table's gram_partials and weighted_sum entries, each waited for, as
 * a collective calls them). Reports time, GB/s and the share of the device's memory bandwidth,
 * measured in the same run by a device-to-device copy (bytes read plus written).
 *
 *   cuda_adasum [--csv FILE] [--sizes 1,4,16,64,256,1024] [--ranks 2,4,8] [--quick]
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

/* The Adasum tree's weights from the Gram matrix (sumo.h's tree: pairs first when P is not a
 * power of two, then the balanced tree, the lower rank on the left): each intermediate is a
 * combination c of the inputs, and a.b = c_a^T G c_b. */
static void adasum_weights(const double *packed, int P, double *w)
{
    std::vector<double> G((size_t)P * P);
    for (int a = 0, q = 0; a < P; a++)
        for (int b = a; b < P; b++, q++) G[(size_t)a * P + b] = G[(size_t)b * P + a] = packed[q];
    auto dot = [&](const std::vector<double> &u, const std::vector<double> &v) {
        double s = 0;
        for (int a = 0; a < P; a++)
            for (int b = 0; b < P; b++) s += u[a] * G[(size_t)a * P + b] * v[b];
        return s;
    };
    auto combine = [&](std::vector<double> &u, const std::vector<double> &v) {
        double d = dot(u, v), nu = dot(u, u), nv = dot(v, v);
        double cu = nu < 0x1p-511 ? 1.0 : 1.0 - d / (2 * nu), cv = nv < 0x1p-511 ? 1.0 : 1.0 - d / (2 * nv);
        for (int k = 0; k < P; k++) u[k] = cu * u[k] + cv * v[k];
    };
    std::vector<std::vector<double>> c(P, std::vector<double>(P, 0.0));
    for (int k = 0; k < P; k++) c[k][k] = 1.0;
    int g2 = 1;
    while (g2 * 2 <= P) g2 *= 2;
    int rem = P - g2;
    std::vector<std::vector<double>> t(g2);
    for (int i = 0; i < g2; i++) {
        if (i < rem) {
            t[i] = c[2 * i];
            combine(t[i], c[2 * i + 1]);
        } else {
            t[i] = c[i + rem];
        }
    }
    for (int step = 1; step < g2; step *= 2)
        for (int i = 0; i + step < g2; i += 2 * step) combine(t[i], t[i + step]);
    for (int k = 0; k < P; k++) w[k] = t[0][k];
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
        fprintf(csv, "kind,P,size_mib,median_ms,min_ms,gram_ms,weights_ms,wsum_ms,GBps,pct_copy_bw,reps\n");
    }
    sumo_cuda_kernels *k;
    SUMO_OK(sumo_cuda_kernels_create(0, &k));
    const sumo_kernel_table *t;
    SUMO_OK(sumo_cuda_kernels_table(k, &t));
    cudaStream_t s;
    CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    printf("%-8s %3s %8s %10s %10s %9s %9s %9s %8s %7s\n", "kind", "P", "MiB", "median ms", "min ms",
           "gram ms", "wts ms", "wsum ms", "GB/s", "% copy");
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
                adasum_weights(gram.data(), P, w.data());
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
            printf("%-8s %3d %8d %10.3f %10.3f %9.3f %9.4f %9.3f %8.0f %6.1f%%\n", "fused", P, mib, m * 1e3,
                   *std::min_element(tot.begin(), tot.end()) * 1e3, median(tg) * 1e3, median(tw) * 1e3,
                   median(ts) * 1e3, gbps, pct);
            if (csv)
                fprintf(csv, "fused,%d,%d,%.4f,%.4f,%.4f,%.5f,%.4f,%.1f,%.1f,%d\n", P, mib, m * 1e3,
                        *std::min_element(tot.begin(), tot.end()) * 1e3, median(tg) * 1e3,
                        median(tw) * 1e3, median(ts) * 1e3, gbps, pct, reps);
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
                fprintf(csv, "threads,%d,%d,%.4f,,,,,%.1f,%.1f,%d\n", P, mib, m * 1e3, bytes / m * 1e-9,
                        100.0 * bytes / m / bw, (int)a.times.size());
        }
    if (csv) fclose(csv);
    cudaStreamDestroy(s);
    sumo_cuda_kernels_destroy(k);
    return 0;
}
