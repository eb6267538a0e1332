// ranks.cuh: data parallelism over ranks. `train_gpt --ranks N` runs N copies of the training process,
// forked from the one started: one per GPU on the CUDA backend (rank r uses GPU r), or N processes on the
// CPU backend. Every rank holds the whole model and optimizer state; each micro-step runs on the rank's
// own share of the data (dataloader.h gives rank r the 128-document chunks r, r + N, ...). After the
// micro-steps the gradients are summed over the ranks, so every rank applies the same update and the
// weights stay identical, which ranks_check_identical verifies at every evaluation.
//
// The sums: NCCL all-reduce on the CUDA backend (built with NCCL when the Makefile finds it), and on the
// CPU backend a shared-memory all-reduce in which every rank adds the ranks' values in rank order, so the
// result is deterministic and the same bits on every rank. nanochat instead reduce-scatters and lets each
// rank update only its share of the matrices (ZeRO-2); here every rank runs the whole optimizer, which
// costs optimizer time but no memory the model does not already need.
//
// Processes: the process started is a supervisor; it forks the ranks before anything touches the GPU or
// starts OpenMP threads (neither survives a fork), then waits. When a rank fails, it stops the others and
// exits with that rank's code. Rank 0 prints and writes the run directory; the others print nothing but
// their errors. Set-up errors (a bad file, a checkpoint that does not fit) are the same on every rank, so
// during set-up the other ranks' errors are held back, and shown only if rank 0 did not fail as well.
#pragma once

#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>
#include "backend.cuh"
#include "common.h"
#if defined(__CUDACC__) && defined(XSA_NCCL)
#include <nccl.h>
#define ncclCheck(call)                                                                                       \
    do {                                                                                                      \
        ncclResult_t r_ = (call);                                                                             \
        if (r_ != ncclSuccess) fail("NCCL: %s (%s:%d)", ncclGetErrorString(r_), __FILE__, __LINE__);        \
    } while (0)
#endif

static const int MAX_RANKS = 64;
static const size_t RANK_CHUNK = 1 << 20;  // elements per rank per round of the shared-memory all-reduce

// The part of the state the ranks share: one anonymous mapping made before the fork.
struct RankShared {
    pthread_barrier_t barrier;   // process-shared, `world` parties
    char nccl_id[128];           // rank 0's ncclUniqueId, for the others
};

struct RankGroup {
    int rank = 0, world = 1;
    RankShared* shared = nullptr;
    float* float_slots = nullptr;    // (world, RANK_CHUNK) in the mapping: each rank's chunk of a float sum
    double* double_slots = nullptr;  // (world, RANK_CHUNK) likewise for doubles
    int saved_stderr = -1;           // ranks > 0 during set-up: the real stderr, while errors go to the capture file
#if defined(__CUDACC__) && defined(XSA_NCCL)
    ncclComm_t comm = nullptr;
    double* d_doubles = nullptr;     // device staging of ranks_sum_doubles
    size_t d_doubles_capacity = 0;
#endif
};
static RankGroup g_ranks;

static inline void ranks_barrier() {
    if (g_ranks.world > 1) pthread_barrier_wait(&g_ranks.shared->barrier);
}

// The supervisor: waits for the ranks and exits with the first failing rank's code (or 0). A rank that
// fails leaves the others waiting for it in the next all-reduce, so they are stopped, after a grace period
// in which rank 0, if it fails the same way, says why. If it does not, the failed rank's held-back set-up
// errors (captures[r]: a file its stderr went to during set-up) are shown.
// The ranks, for the supervisor's signal handler: SIGINT or SIGTERM sent to the supervisor alone (kill PID,
// a scheduler's pre-emption) is passed on to every rank, which finishes its step and checkpoints.
static pid_t g_rank_pids[MAX_RANKS];
static int g_rank_count = 0;

static void ranks_forward_signal(int sig) {
    for (int r = 0; r < g_rank_count; r++) kill(g_rank_pids[r], sig);
}

[[noreturn]] static inline void ranks_supervise(const std::vector<pid_t>& pids, const std::vector<FILE*>& captures) {
    const double GRACE_MS = 3000.0;
    for (pid_t pid : pids) g_rank_pids[g_rank_count++] = pid;
    struct sigaction forward = {};
    forward.sa_handler = ranks_forward_signal;
    forward.sa_flags = SA_RESTART;  // waitpid below goes on waiting
    sigaction(SIGINT, &forward, nullptr);
    sigaction(SIGTERM, &forward, nullptr);
    int code = 0, failed_rank = -1;
    bool stopped = false;
    double failed_at = 0.0;
    std::vector<int> rank_code(pids.size(), -1);  // -1: still running
    for (size_t running = pids.size(); running > 0;) {
        int status = 0;
        pid_t pid = waitpid(-1, &status, code == 0 ? 0 : WNOHANG);
        if (pid < 0 && errno == EINTR) continue;
        if (pid < 0) break;
        if (pid == 0) {  // a rank failed and others still run
            if (!stopped && wall_ms() - failed_at > GRACE_MS) {
                for (size_t r = 0; r < pids.size(); r++)
                    if (rank_code[r] < 0) kill(pids[r], SIGKILL);  // not SIGTERM: that asks for a step the rank cannot finish
                stopped = true;
            }
            usleep(10000);
            continue;
        }
        running--;
        for (size_t r = 0; r < pids.size(); r++)
            if (pids[r] == pid) {
                rank_code[r] = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
                if (WIFSIGNALED(status) && !stopped)  // a crash or the OOM killer: the rank could not say why
                    fprintf(stderr, "error: rank %zu was killed by signal %d (%s)\n", r, WTERMSIG(status), strsignal(WTERMSIG(status)));
                if (rank_code[r] != 0 && code == 0) {
                    code = rank_code[r];
                    failed_rank = (int)r;
                    // a rank that stopped on SIGINT/SIGTERM exited after its last step, as all the ranks do: the
                    // others are not stopped (rank 0 may still be writing the checkpoint)
                    const bool stop_requested = WIFEXITED(status) && (code == 128 + SIGINT || code == 128 + SIGTERM);
                    failed_at = stop_requested ? INFINITY : wall_ms();
                }
            }
    }
    const bool rank0_failed = rank_code[0] != 0 && !(stopped && rank_code[0] == 128 + SIGKILL);
    if (failed_rank > 0 && !rank0_failed) {
        FILE* f = captures[failed_rank];
        char line[4096];
        rewind(f);
        while (fgets(line, sizeof line, f)) fprintf(stderr, "%s", line);
    }
    exit(code);
}

// Forks `world` ranks (nothing for world = 1) and returns in each of them, with g_ranks set; the process
// that called it supervises and does not return. On CUDA, rank r then selects GPU r and joins the NCCL
// communicator. Call before backend_init and before anything starts OpenMP threads.
static inline void ranks_launch(int world) {
    if (world == 1) return;
    if (world < 1 || world > MAX_RANKS) fail("--ranks must be in [1, %d], got %d", MAX_RANKS, world);
#if defined(__CUDACC__) && !defined(XSA_NCCL)
    fail("--ranks %d: this CUDA build has no NCCL (the Makefile found no nccl.h); install NCCL and rebuild", world);
#endif
#ifdef __CUDACC__
    const size_t slot_elems = 0;  // NCCL sums; the mapping holds only the barrier and the NCCL id
#else
    const size_t slot_elems = RANK_CHUNK;
#endif
    const size_t bytes = sizeof(RankShared) + (size_t)world * slot_elems * (sizeof(float) + sizeof(double));
    void* map = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (map == MAP_FAILED) fail("--ranks %d: cannot map %zu bytes of shared memory: %s", world, bytes, strerror(errno));
    g_ranks.shared = (RankShared*)map;
    g_ranks.double_slots = (double*)((char*)map + sizeof(RankShared));  // 8-byte aligned: RankShared is
    g_ranks.float_slots = (float*)(g_ranks.double_slots + (size_t)world * slot_elems);
    pthread_barrierattr_t attr;
    pthread_barrierattr_init(&attr);
    pthread_barrierattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
    if (pthread_barrier_init(&g_ranks.shared->barrier, &attr, world) != 0) fail("--ranks %d: cannot create the barrier", world);
    pthread_barrierattr_destroy(&attr);
    std::vector<FILE*> captures(world, nullptr);  // rank r's set-up errors (r > 0)
    for (int r = 1; r < world; r++)
        if (!(captures[r] = tmpfile())) fail("--ranks %d: cannot create a temporary file: %s", world, strerror(errno));
    fflush(stdout);
    fflush(stderr);
    std::vector<pid_t> pids;
    for (int r = 0; r < world; r++) {
        pid_t pid = fork();
        if (pid < 0) fail("--ranks %d: fork failed: %s", world, strerror(errno));
        if (pid == 0) {
            g_ranks.rank = r;
            g_ranks.world = world;
            break;
        }
        pids.push_back(pid);
    }
    if (g_ranks.world == 1) ranks_supervise(pids, captures);  // the parent
    prctl(PR_SET_PDEATHSIG, SIGTERM);  // a supervisor that is killed takes its ranks with it
    if (g_ranks.rank > 0) {  // rank 0 speaks for all; the others' set-up errors go to their capture file
        if (!freopen("/dev/null", "w", stdout)) fail("cannot redirect rank %d's output", g_ranks.rank);
        g_ranks.saved_stderr = dup(STDERR_FILENO);
        if (g_ranks.saved_stderr < 0 || dup2(fileno(captures[g_ranks.rank]), STDERR_FILENO) < 0)
            fail("cannot redirect rank %d's errors", g_ranks.rank);
        snprintf(g_fail_prefix, sizeof g_fail_prefix, "rank %d: ", g_ranks.rank);
    }
#ifdef _OPENMP
    omp_set_num_threads(std::max(1, omp_get_num_procs() / world));  // the ranks share the cores
#endif
#ifdef __CUDACC__
    printf("ranks: %d, one GPU each, gradients summed with NCCL\n", world);
#else
    printf("ranks: %d processes, gradients summed in shared memory\n", world);
#endif
#if defined(__CUDACC__) && defined(XSA_NCCL)
    int devices = 0;
    cudaCheck(cudaGetDeviceCount(&devices));
    if (devices < world) fail("--ranks %d needs %d GPUs, this machine has %d", world, world, devices);
    cudaCheck(cudaSetDevice(g_ranks.rank));
    ncclUniqueId id;
    static_assert(sizeof(id) <= sizeof(g_ranks.shared->nccl_id), "ncclUniqueId does not fit");
    if (g_ranks.rank == 0) {
        ncclCheck(ncclGetUniqueId(&id));
        memcpy(g_ranks.shared->nccl_id, &id, sizeof(id));
    }
    ranks_barrier();
    memcpy(&id, g_ranks.shared->nccl_id, sizeof(id));
    ncclCheck(ncclCommInitRank(&g_ranks.comm, world, id, g_ranks.rank));
#endif
}

// Set-up is over: from here on an error may be one rank's own, so every rank shows its errors, saying
// which rank it is.
static inline void ranks_setup_done() {
    if (g_ranks.world == 1) return;
    snprintf(g_fail_prefix, sizeof g_fail_prefix, "rank %d: ", g_ranks.rank);
    if (g_ranks.saved_stderr < 0) return;
    fflush(stderr);
    dup2(g_ranks.saved_stderr, STDERR_FILENO);
    close(g_ranks.saved_stderr);
    g_ranks.saved_stderr = -1;
}

// The shared-memory all-reduce: x (n) += the other ranks' x, in rank order, RANK_CHUNK elements a round.
template <typename T>
static inline void ranks_sum_shared(T* x, size_t n, T* slots) {
    const int world = g_ranks.world;
    if (slots == nullptr) fail("the ranks' shared memory is missing: ranks_launch has not run");
    for (size_t base = 0; base < n; base += RANK_CHUNK) {
        const size_t len = std::min(RANK_CHUNK, n - base);
        memcpy(slots + (size_t)g_ranks.rank * RANK_CHUNK, x + base, len * sizeof(T));
        ranks_barrier();  // every rank's chunk is in
#pragma omp parallel for schedule(static)
        for (long i = 0; i < (long)len; i++) {
            T sum = slots[i];
            for (int r = 1; r < world; r++) sum += slots[(size_t)r * RANK_CHUNK + i];
            x[base + i] = sum;
        }
        ranks_barrier();  // every rank has read the chunks before the next round overwrites them
    }
}

// x (n floats of backend memory) = the sum over the ranks of x, the same on every rank.
static inline void ranks_sum_floats(float* x, size_t n) {
    if (g_ranks.world == 1) return;
#if defined(__CUDACC__) && defined(XSA_NCCL)
    ncclCheck(ncclAllReduce(x, x, n, ncclFloat, ncclSum, g_ranks.comm, g_backend.stream));
#elif defined(__CUDACC__)
    (void)x, (void)n;  // not reached: without NCCL, ranks_launch refuses several ranks
#else
    ranks_sum_shared(x, n, g_ranks.float_slots);
#endif
}

// x (n doubles of host memory) = the sum over the ranks of x, the same on every rank; synchronous.
static inline void ranks_sum_doubles(double* x, size_t n) {
    if (g_ranks.world == 1) return;
#if defined(__CUDACC__) && defined(XSA_NCCL)
    if (n > g_ranks.d_doubles_capacity) {
        cuda_free(g_ranks.d_doubles);
        cudaCheck(cuda_malloc(&g_ranks.d_doubles, n * sizeof(double)));
        g_ranks.d_doubles_capacity = n;
    }
    cudaCheck(cudaMemcpyAsync(g_ranks.d_doubles, x, n * sizeof(double), cudaMemcpyHostToDevice, g_backend.stream));
    ncclCheck(ncclAllReduce(g_ranks.d_doubles, g_ranks.d_doubles, n, ncclDouble, ncclSum, g_ranks.comm, g_backend.stream));
    cudaCheck(cudaMemcpyAsync(x, g_ranks.d_doubles, n * sizeof(double), cudaMemcpyDeviceToHost, g_backend.stream));
    cudaCheck(cudaStreamSynchronize(g_backend.stream));
#elif defined(__CUDACC__)
    (void)x, (void)n;  // not reached: without NCCL, ranks_launch refuses several ranks
#else
    ranks_sum_shared(x, n, g_ranks.double_slots);
#endif
}

// Every rank's `values` (any length, the same or not), on every rank: result[r] is rank r's. Integers up
// to 2^53 pass exactly (they travel as doubles, summed with zeros).
static inline std::vector<std::vector<int64_t>> ranks_gather(const std::vector<int64_t>& values) {
    const int world = g_ranks.world;
    if (world == 1) return {values};
    std::vector<double> sizes(world, 0.0);
    sizes[g_ranks.rank] = (double)values.size();
    ranks_sum_doubles(sizes.data(), world);
    std::vector<size_t> offset(world + 1, 0);
    for (int r = 0; r < world; r++) offset[r + 1] = offset[r] + (size_t)sizes[r];
    std::vector<double> all(offset[world], 0.0);
    for (size_t i = 0; i < values.size(); i++) all[offset[g_ranks.rank] + i] = (double)values[i];
    ranks_sum_doubles(all.data(), all.size());
    std::vector<std::vector<int64_t>> out(world);
    for (int r = 0; r < world; r++) out[r].assign(all.begin() + offset[r], all.begin() + offset[r + 1]);
    return out;
}
