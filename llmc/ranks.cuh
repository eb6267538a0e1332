// ranks.cuh: data parallelism over ranks. Every rank holds the whole model; each micro-step runs on the
// rank's own share of the data (dataloader.h gives rank r the 128-document chunks r, r + N, ...). After the
// micro-steps the gradients are summed over the ranks, so every rank applies the same update and the
// weights stay identical, which ranks_check_identical verifies at every evaluation.
//
// How the ranks start (dev/docs/multinode.md):
// * forked: `--ranks N` on one machine. The process started is a supervisor; it forks the N ranks before
//   anything touches the GPU or starts OpenMP threads (neither survives a fork), then waits. When a rank
//   fails, it stops the others and exits with that rank's code.
// * launched: every process is one rank, started by a launcher: mpirun/mpiexec or srun with an MPI plugin
//   (the binary built with MPI: MPI says the rank, the world and the ranks on this node), or any launcher
//   that sets torchrun's RANK, WORLD_SIZE and LOCAL_RANK (LOCAL_WORLD_SIZE optional). The launcher stops
//   the others when one fails.
//
// How they meet and sum (the sums are deterministic: every rank adds the ranks' values in rank order, so
// the result is the same bits on every rank):
// * CUDA: NCCL all-reduce. Its unique id goes from rank 0 to the others through the fork's shared memory,
//   MPI_Bcast, or the rendezvous file (`--rendezvous FILE`, a path every rank can read: a shared file
//   system across nodes).
// * CPU: a shared-memory all-reduce: the fork's anonymous mapping, or, for launched ranks on one machine,
//   the rendezvous file mapped by all of them; across machines, MPI (an all-gather, then the sum in rank
//   order).
// Besides whole sums (ranks_sum_floats), the sharded optimizer exchanges parts of a buffer
// (ranks_exchange_floats): each part's sum only to the rank that updates it, and each part's updated
// values from that rank to the others (dev/docs/optim.md#the-sharded-optimizer).
//
// Rank 0 prints and writes the run directory; the others print nothing but their errors. Set-up errors
// (a bad file, a checkpoint that does not fit) are the same on every rank, so during set-up the forked
// ranks' errors are held back, and shown only if rank 0 did not fail as well. (Launched ranks have no
// supervisor to hold them back: each says its errors, "rank r: " first.) A stop signal (SIGINT, SIGTERM)
// stops every rank after the same step (stop_requested, at the end).
#pragma once

#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#include <atomic>
#include <climits>
#include <ctime>
#include <string>
#include <vector>
#include "backend.cuh"
#include "common.h"
#ifdef XSA_MPI
#include <mpi.h>
#endif
#if defined(__CUDACC__) && defined(XSA_NCCL)
#include <nccl.h>
#define ncclCheck(call)                                                                                       \
    do {                                                                                                      \
        ncclResult_t r_ = (call);                                                                             \
        if (r_ != ncclSuccess) fail("NCCL: %s (%s:%d)", ncclGetErrorString(r_), __FILE__, __LINE__);        \
    } while (0)
#endif

static const int MAX_RANKS = 64;
static const size_t RANK_CHUNK = 1 << 20;       // elements per rank per round of the shared-memory all-reduce
static int g_join_timeout_s = 300;  // launched ranks: the longest wait for the others at the rendezvous (XSA_RENDEZVOUS_TIMEOUT)
static const uint32_t RENDEZVOUS_MAGIC = 20261204u;  // the rendezvous file's first word

// What rank 0 says to the others when they meet: the header of the shared mapping or rendezvous file.
struct RendezvousHeader {
    uint32_t magic;       // RENDEZVOUS_MAGIC (a rendezvous file is written whole before the others can open it)
    int32_t world;
    int32_t slot_elems;   // RANK_CHUNK on the CPU backend (whose sums go through the mapping), 0 where NCCL sums
    int32_t reserved;
    char nccl_id[128];    // rank 0's ncclUniqueId, for the others
};

// The part of the state the ranks share: one mapping, anonymous (forked ranks) or of the rendezvous file
// (launched ranks on the CPU backend), followed by the slots of the shared-memory all-reduce. The barrier
// is a generation counter in shared memory (sense reversal), waited on with a futex.
struct alignas(64) RankShared {
    RendezvousHeader head;
    int32_t pids[MAX_RANKS];            // each rank's process id once it has joined (launched ranks check that their peers live)
    uint64_t pid_spaces[MAX_RANKS];     // the PID namespace that id is in (a peer in another, e.g. another container, is not checked)
    std::atomic<uint32_t> arrived;      // ranks at the barrier now
    std::atomic<uint32_t> generation;   // barriers completed
};
static_assert(std::atomic<uint32_t>::is_always_lock_free, "the barrier's counters must be lock-free to live in shared memory");

enum RankTransport { RANKS_ONE, RANKS_SHARED_MEMORY, RANKS_MPI, RANKS_NCCL };

struct RankGroup {
    int rank = 0, world = 1;
    int local_rank = 0, local_world = 1;  // on this machine: the GPU to use, how many share the cores
    bool launched = false;                // started by a launcher (not forked by --ranks)
    RankTransport transport = RANKS_ONE;  // what sums
    RankShared* shared = nullptr;
    float* float_slots = nullptr;    // (world, RANK_CHUNK) in the mapping: each rank's chunk of a float sum
    double* double_slots = nullptr;  // (world, RANK_CHUNK) likewise for doubles
    int saved_stderr = -1;           // forked ranks > 0 during set-up: the real stderr, while errors go to the capture file
#if defined(__CUDACC__) && defined(XSA_NCCL)
    ncclComm_t comm = nullptr;
    double* d_doubles = nullptr;     // device staging of ranks_sum_doubles
    size_t d_doubles_capacity = 0;
#endif
};
static RankGroup g_ranks;

static inline long futex(std::atomic<uint32_t>* word, int op, uint32_t value, const struct timespec* timeout) {
    return syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op, value, timeout, nullptr, 0);
}

// Whether process `pid` has ended (gone, or a zombie no one has reaped yet).
static inline bool process_ended(pid_t pid) {
    char path[64], stat[256] = {0};
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE* f = fopen(path, "r");
    if (f == nullptr) return kill(pid, 0) != 0 && errno == ESRCH;
    const size_t got = fread(stat, 1, sizeof stat - 1, f);
    fclose(f);
    const char* state = got > 0 ? strrchr(stat, ')') : nullptr;  // "pid (name) S ..."
    return state != nullptr && (state[2] == 'Z' || state[2] == 'X');
}

// Launched ranks that share memory have no supervisor: a rank whose process is gone will never reach the
// barrier, and one that never joined may never come. Say so instead of waiting forever.
static inline void ranks_check_peers(double waiting_since_ms, const char* rendezvous) {
    int joined = 0;
    for (int r = 0; r < g_ranks.world; r++) {
        const pid_t pid = __atomic_load_n(&g_ranks.shared->pids[r], __ATOMIC_ACQUIRE);
        if (pid == 0) continue;
        joined++;
        const bool visible = g_ranks.shared->pid_spaces[r] == g_ranks.shared->pid_spaces[g_ranks.rank];
        if (r != g_ranks.rank && visible && process_ended(pid)) fail("rank %d (process %d) has ended; stopping", r, (int)pid);
    }
    if (joined < g_ranks.world && wall_ms() - waiting_since_ms > g_join_timeout_s * 1000.0)
        fail("%d of %d ranks joined at the rendezvous file '%s' in %d s (on the CPU backend every rank must run on this machine; "
             "across machines, build with MPI and start the ranks with mpirun or srun)",
             joined, g_ranks.world, rendezvous, g_join_timeout_s);
}

static std::string g_rendezvous_path;  // launched ranks meeting in a file: its path, for messages

// Every rank waits here until all have arrived.
static inline void ranks_barrier() {
    if (g_ranks.world == 1) return;
#ifdef XSA_MPI
    if (g_ranks.transport == RANKS_MPI) {
        MPI_Barrier(MPI_COMM_WORLD);
        return;
    }
#endif
    RankShared* s = g_ranks.shared;
    const uint32_t gen = s->generation.load(std::memory_order_acquire);
    if (s->arrived.fetch_add(1, std::memory_order_acq_rel) + 1 == (uint32_t)g_ranks.world) {  // the last to arrive
        s->arrived.store(0, std::memory_order_relaxed);  // before the others leave: none can arrive at the next barrier early
        s->generation.fetch_add(1, std::memory_order_acq_rel);
        futex(&s->generation, FUTEX_WAKE, INT_MAX, nullptr);
        return;
    }
    const double since = wall_ms();
    const struct timespec tick = {0, 100 * 1000 * 1000};  // launched ranks look at their peers every 100 ms
    while (s->generation.load(std::memory_order_acquire) == gen) {
        futex(&s->generation, FUTEX_WAIT, gen, &tick);
        if (g_ranks.launched && s->generation.load(std::memory_order_acquire) == gen) ranks_check_peers(since, g_rendezvous_path.c_str());
    }
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
    sigaction(SIGHUP, &forward, nullptr);
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
                    const bool stop_requested = WIFEXITED(status) && (code == 128 + SIGINT || code == 128 + SIGTERM || code == 128 + SIGHUP);
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

// ----------------------------------------------------------------------------------------------------
// Starting the ranks

static inline size_t rank_shared_bytes(int world, size_t slot_elems) {
    return sizeof(RankShared) + (size_t)world * slot_elems * (sizeof(float) + sizeof(double));
}

static inline void ranks_use_mapping(void* map, size_t slot_elems) {
    g_ranks.shared = (RankShared*)map;
    g_ranks.double_slots = (double*)((char*)map + sizeof(RankShared));  // 8-byte aligned: RankShared is 64-byte aligned
    g_ranks.float_slots = (float*)(g_ranks.double_slots + (size_t)g_ranks.world * slot_elems);
}

// The slots of a shared-memory sum: the CPU backend's; NCCL sums on CUDA.
#ifdef __CUDACC__
static const size_t RANK_SLOT_ELEMS = 0;
#else
static const size_t RANK_SLOT_ELEMS = RANK_CHUNK;
#endif

#ifdef XSA_MPI
// At exit: MPI_Finalize when the ranks end together (the run's end, or a stop they agreed on: exit codes 0
// and 128 + SIGINT/SIGTERM). After an error the rank just exits and the launcher stops the others
// (MPI_Finalize would wait for them).
static void ranks_mpi_exit(int code, void*) {
    if (code == 0 || code == 128 + SIGINT || code == 128 + SIGTERM) MPI_Finalize();
}
#endif

// A launcher's integer from the environment, `fallback` if unset; a malformed one is an error.
static inline int env_int(const char* name, int fallback) {
    const char* v = getenv(name);
    if (v == nullptr) return fallback;
    char* end = nullptr;
    errno = 0;
    const long x = strtol(v, &end, 10);
    if (*v == '\0' || *end != '\0' || errno != 0 || x < 0 || x > INT_MAX) fail("environment: %s=%s is not a non-negative integer", name, v);
    return (int)x;
}

// Who started this process, if a launcher did: sets g_ranks' rank, world, local rank and local world and
// returns the launcher's name; nullptr if none did (one process, or ranks forked by --ranks to come).
static inline const char* ranks_from_launcher() {
#ifdef XSA_MPI
    if (getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || getenv("PMIX_RANK")) {  // mpirun/mpiexec, srun --mpi=...
        int provided = 0;
        MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);  // only the main thread calls MPI
        on_exit(ranks_mpi_exit, nullptr);
        MPI_Comm_rank(MPI_COMM_WORLD, &g_ranks.rank);
        MPI_Comm_size(MPI_COMM_WORLD, &g_ranks.world);
        MPI_Comm node;  // the ranks on this machine
        MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
        MPI_Comm_rank(node, &g_ranks.local_rank);
        MPI_Comm_size(node, &g_ranks.local_world);
        MPI_Comm_free(&node);
        if (g_ranks.world > MAX_RANKS) fail("MPI started %d ranks; at most %d are supported", g_ranks.world, MAX_RANKS);
        g_ranks.transport = RANKS_MPI;
        return "MPI";
    }
#endif
    // torchrun's variables, or Open MPI's (mpirun of a binary built without MPI)
    static const char* const names[2][5] = {{"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "RANK/WORLD_SIZE"},
                                            {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                                             "OMPI_COMM_WORLD_LOCAL_SIZE", "mpirun (this binary has no MPI)"}};
    for (const auto& n : names) {
        if (!getenv(n[0]) && !getenv(n[1])) continue;
        for (int i = 0; i < 3; i++)
            if (!getenv(n[i])) fail("environment: %s is set but %s is not (a launcher sets %s, %s and %s)", getenv(n[0]) ? n[0] : n[1], n[i], n[0], n[1], n[2]);
        g_ranks.world = env_int(n[1], 1);
        g_ranks.rank = env_int(n[0], 0);
        g_ranks.local_rank = env_int(n[2], 0);
        g_ranks.local_world = env_int(n[3], g_ranks.world);
        if (g_ranks.world < 1 || g_ranks.world > MAX_RANKS) fail("environment: %s=%d must be in [1, %d]", n[1], g_ranks.world, MAX_RANKS);
        if (g_ranks.rank >= g_ranks.world) fail("environment: %s=%d must be below %s=%d", n[0], g_ranks.rank, n[1], g_ranks.world);
        if (g_ranks.local_world < 1 || g_ranks.local_world > g_ranks.world || g_ranks.local_rank >= g_ranks.local_world)
            fail("environment: %s=%d must be below %s=%d, which must be in [1, %s]", n[2], g_ranks.local_rank, n[3], g_ranks.local_world, n[1]);
        return n[4];
    }
    return nullptr;
}

// Launched ranks without MPI meet in a file: rank 0 writes it whole under a temporary name and then links
// it to `path`, so that the others never read it half-written; they wait for it (g_join_timeout_s at
// most) and check it. Returns its descriptor, with `head` filled in (the others: from the file).
static inline int rendezvous_file(const std::string& path, RendezvousHeader* head) {
    const size_t bytes = head->slot_elems > 0 ? rank_shared_bytes(g_ranks.world, (size_t)head->slot_elems) : sizeof(RankShared);
    if (g_ranks.rank == 0) {
        struct stat st;
        if (stat(path.c_str(), &st) == 0)
            fail("--rendezvous: '%s' exists: another run's, or left by one that failed while starting; remove it if no run uses it", path.c_str());
        const std::string tmp = path + ".tmp" + std::to_string((long)getpid());
        const int fd = open(tmp.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
        if (fd < 0) fail("--rendezvous: cannot create '%s': %s", tmp.c_str(), strerror(errno));
        if (ftruncate(fd, (off_t)bytes) != 0 || pwrite(fd, head, sizeof *head, 0) != (ssize_t)sizeof *head || fsync(fd) != 0 ||
            link(tmp.c_str(), path.c_str()) != 0) {
            const int err = errno;
            unlink(tmp.c_str());
            fail("--rendezvous: cannot write '%s': %s", path.c_str(), strerror(err));
        }
        unlink(tmp.c_str());
        return fd;
    }
    const double since = wall_ms();
    int fd;
    while ((fd = open(path.c_str(), O_RDWR)) < 0) {
        if (errno != ENOENT) fail("--rendezvous: cannot open '%s': %s", path.c_str(), strerror(errno));
        if (wall_ms() - since > g_join_timeout_s * 1000.0) fail("--rendezvous: rank 0 has not made '%s' in %d s", path.c_str(), g_join_timeout_s);
        usleep(100 * 1000);
    }
    RendezvousHeader found;
    struct stat st;
    if (pread(fd, &found, sizeof found, 0) != (ssize_t)sizeof found || found.magic != RENDEZVOUS_MAGIC || found.slot_elems != head->slot_elems)
        fail("--rendezvous: '%s' is not this program's rendezvous file for this backend", path.c_str());
    if (found.world != g_ranks.world)
        fail("--rendezvous: '%s' is for %d ranks, and this is rank %d of %d (a file left by another run? remove it)", path.c_str(), found.world,
             g_ranks.rank, g_ranks.world);
    if (fstat(fd, &st) != 0 || (size_t)st.st_size != bytes) fail("--rendezvous: '%s' is truncated", path.c_str());
    *head = found;
    return fd;
}

// Forks `world` ranks; returns in each of them, and the process that called it supervises and does not return.
static inline void ranks_fork(int world) {
#if defined(__CUDACC__) && !defined(XSA_NCCL)
    fail("--ranks %d: this CUDA build has no NCCL (the Makefile found no nccl.h); install NCCL and rebuild", world);
#endif
    g_ranks.world = world;  // for the layout of the mapping; the ranks below are its ranks
    const size_t bytes = rank_shared_bytes(world, RANK_SLOT_ELEMS);
    void* map = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (map == MAP_FAILED) fail("--ranks %d: cannot map %zu bytes of shared memory: %s", world, bytes, strerror(errno));
    ranks_use_mapping(map, RANK_SLOT_ELEMS);  // zero-filled: the barrier is ready
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
            g_ranks.rank = g_ranks.local_rank = r;
            g_ranks.local_world = world;
            break;
        }
        pids.push_back(pid);
    }
    if (pids.size() == (size_t)world) ranks_supervise(pids, captures);  // the parent
    prctl(PR_SET_PDEATHSIG, SIGTERM);  // a supervisor that is killed takes its ranks with it
    g_ranks.transport = RANK_SLOT_ELEMS > 0 ? RANKS_SHARED_MEMORY : RANKS_NCCL;
    if (g_ranks.rank > 0) {  // rank 0 speaks for all; the others' set-up errors go to their capture file
        g_ranks.saved_stderr = dup(STDERR_FILENO);
        if (g_ranks.saved_stderr < 0 || dup2(fileno(captures[g_ranks.rank]), STDERR_FILENO) < 0)
            fail("cannot redirect rank %d's errors", g_ranks.rank);
    }
}

// A launched rank without MPI on the CPU backend: joins the others in the rendezvous file's mapping. Rank 0
// removes the file once all have joined (the mapping stays).
static inline void ranks_join_shared_memory(const std::string& path) {
    if (g_ranks.local_world != g_ranks.world)
        fail("the CPU backend's ranks meet in shared memory, so without MPI they must all run on one machine (%d of %d here); "
             "build with MPI and start them with mpirun or srun", g_ranks.local_world, g_ranks.world);
    RendezvousHeader head = {RENDEZVOUS_MAGIC, g_ranks.world, (int32_t)RANK_CHUNK, 0, {0}};
    const int fd = rendezvous_file(path, &head);
    const size_t bytes = rank_shared_bytes(g_ranks.world, RANK_CHUNK);
    void* map = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) fail("--rendezvous: cannot map '%s': %s", path.c_str(), strerror(errno));
    close(fd);
    file_mapping_register(map, bytes, "rendezvous file", path);  // (truncated by another process: an error, not SIGBUS)
    ranks_use_mapping(map, RANK_CHUNK);
    struct stat ns;
    g_ranks.shared->pid_spaces[g_ranks.rank] = stat("/proc/self/ns/pid", &ns) == 0 ? (uint64_t)ns.st_ino : 0;
    __atomic_store_n(&g_ranks.shared->pids[g_ranks.rank], (int32_t)getpid(), __ATOMIC_RELEASE);  // after its namespace
    g_ranks.transport = RANKS_SHARED_MEMORY;
    ranks_barrier();  // all have joined
    if (g_ranks.rank == 0) unlink(path.c_str());
}

#if defined(__CUDACC__) && defined(XSA_NCCL)
// Every rank joins NCCL's communicator on GPU local_rank, with rank 0's unique id passed on through the
// fork's shared memory, MPI, or the rendezvous file (removed by rank 0 once the communicator stands).
static inline void ranks_join_nccl(const std::string& rendezvous) {
    int devices = 0;
    cudaCheck(cudaGetDeviceCount(&devices));
    if (g_ranks.local_rank >= devices)
        fail("rank %d is rank %d on its machine, which has %d GPU%s", g_ranks.rank, g_ranks.local_rank, devices, devices == 1 ? "" : "s");
    cudaCheck(cudaSetDevice(g_ranks.local_rank));
    ncclUniqueId id;
    static_assert(sizeof(id) <= sizeof(RendezvousHeader::nccl_id), "ncclUniqueId does not fit");
    if (g_ranks.rank == 0) ncclCheck(ncclGetUniqueId(&id));
    if (g_ranks.transport == RANKS_MPI) {
#ifdef XSA_MPI
        MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
#endif
    } else if (g_ranks.launched) {
        RendezvousHeader head = {RENDEZVOUS_MAGIC, g_ranks.world, 0, 0, {0}};
        memcpy(head.nccl_id, &id, sizeof id);
        close(rendezvous_file(rendezvous, &head));
        memcpy(&id, head.nccl_id, sizeof id);
    } else {
        if (g_ranks.rank == 0) memcpy(g_ranks.shared->head.nccl_id, &id, sizeof id);
        ranks_barrier();
        memcpy(&id, g_ranks.shared->head.nccl_id, sizeof id);
    }
    ncclCheck(ncclCommInitRank(&g_ranks.comm, g_ranks.world, id, g_ranks.rank));
    if (g_ranks.launched && g_ranks.transport != RANKS_MPI && g_ranks.rank == 0) unlink(rendezvous.c_str());
    g_ranks.transport = RANKS_NCCL;
}
#endif

// Makes this process one of the ranks and returns in it, with g_ranks set: forks `forked_world` ranks
// (--ranks; nothing for 1), or joins the ranks a launcher started (the others through MPI, or through the
// rendezvous file). Call before backend_init and before anything starts OpenMP threads.
static inline void ranks_launch(int forked_world, const std::string& rendezvous) {
    if (forked_world < 1 || forked_world > MAX_RANKS) fail("--ranks must be in [1, %d], got %d", MAX_RANKS, forked_world);
    const char* launcher = ranks_from_launcher();
    if (launcher == nullptr && !rendezvous.empty())
        fail("--rendezvous is for ranks started by a launcher (RANK, WORLD_SIZE and LOCAL_RANK set, or mpirun); this process was not");
    if (launcher != nullptr && g_ranks.world > 1 && forked_world > 1)
        fail("--ranks %d: this process is already rank %d of %d, started by %s; use one or the other", forked_world, g_ranks.rank, g_ranks.world, launcher);
    if (launcher != nullptr && g_ranks.world > 1) {
        g_ranks.launched = true;
        g_join_timeout_s = env_int("XSA_RENDEZVOUS_TIMEOUT", g_join_timeout_s);
        g_rendezvous_path = rendezvous;
        if (g_ranks.transport != RANKS_MPI && rendezvous.empty())
            fail("rank %d of %d (started by %s) has no way to meet the others: pass --rendezvous FILE (a path every rank can reach; "
                 "on the CPU backend, on this machine) or build with MPI", g_ranks.rank, g_ranks.world, launcher);
#if defined(__CUDACC__) && !defined(XSA_NCCL)
        fail("rank %d of %d: this CUDA build has no NCCL (the Makefile found no nccl.h); install NCCL and rebuild", g_ranks.rank, g_ranks.world);
#endif
        if (RANK_SLOT_ELEMS > 0 && g_ranks.transport != RANKS_MPI) ranks_join_shared_memory(rendezvous);
    } else if (forked_world > 1) {
        ranks_fork(forked_world);
    }
    if (g_ranks.world == 1) return;
    if (g_ranks.rank > 0) {
        if (!freopen("/dev/null", "w", stdout)) fail("cannot redirect rank %d's output", g_ranks.rank);
        snprintf(g_fail_prefix, sizeof g_fail_prefix, "rank %d: ", g_ranks.rank);
    }
#ifdef _OPENMP
    omp_set_num_threads(std::max(1, omp_get_num_procs() / g_ranks.local_world));  // the ranks on a machine share its cores
#endif
#if defined(__CUDACC__) && defined(XSA_NCCL)
    ranks_join_nccl(rendezvous);
#endif
    const char* sums = g_ranks.transport == RANKS_NCCL ? "with NCCL" : g_ranks.transport == RANKS_MPI ? "with MPI" : "in shared memory";
    if (launcher != nullptr)
        printf("ranks: %d (started by %s), %d on this machine, gradients summed %s\n", g_ranks.world, launcher, g_ranks.local_world, sums);
    else
        printf("ranks: %d %s, gradients summed %s\n", g_ranks.world, RANK_SLOT_ELEMS > 0 ? "processes" : "GPUs, one each", sums);
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

// ----------------------------------------------------------------------------------------------------
// The sums

// out (len) = the ranks' rows of slots (world, stride) added in rank order: the same bits on every rank.
template <typename T>
static inline void sum_in_rank_order(T* out, const T* slots, size_t len, size_t stride) {
#pragma omp parallel for schedule(static)
    for (long i = 0; i < (long)len; i++) {
        T sum = slots[i];
        for (int r = 1; r < g_ranks.world; r++) sum += slots[(size_t)r * stride + i];
        out[i] = sum;
    }
}

// A span [begin, end) of a buffer and the rank it belongs to: the one that needs its sum, or whose values
// the others take (owner -1: every rank). The ranges of one exchange are in order and do not overlap.
struct RankRange {
    size_t begin, end;
    int owner;
};

// RANKS_REDUCE: the sum over the ranks (in rank order) into each range this rank owns (or every rank does);
// the rest of x keeps this rank's values. RANKS_BROADCAST: the owner's values into each range with an owner.
enum RankExchange { RANKS_REDUCE, RANKS_BROADCAST };

// The host version of ranks_exchange_floats, RANK_CHUNK elements a round: every rank's chunk gathered
// through the shared mapping or with MPI, then each range's part of it summed or copied.
template <typename T>
static inline void ranks_exchange_host(T* x, const std::vector<RankRange>& ranges, RankExchange op, T* slots) {
    if (ranges.empty()) return;
    const bool mpi = g_ranks.transport == RANKS_MPI;
    if (!mpi && slots == nullptr) fail("the ranks' shared memory is missing: ranks_launch has not run");
    const size_t lo = ranges.front().begin, hi = ranges.back().end;
    static std::vector<T> gathered;  // MPI: (world, chunk)
    size_t first = 0;                // the first range that reaches this round's chunk
    for (size_t base = lo; base < hi; base += RANK_CHUNK) {
        const size_t len = std::min(RANK_CHUNK, hi - base);
        const T* rows = slots;  // (world, stride): every rank's x[base .. base + len)
        size_t stride = RANK_CHUNK;
        if (mpi) {
#ifdef XSA_MPI
            gathered.resize((size_t)g_ranks.world * len);
            const MPI_Datatype type = sizeof(T) == sizeof(float) ? MPI_FLOAT : MPI_DOUBLE;
            MPI_Allgather(x + base, (int)len, type, gathered.data(), (int)len, type, MPI_COMM_WORLD);
#endif
            rows = gathered.data();
            stride = len;
        } else {
            memcpy(slots + (size_t)g_ranks.rank * RANK_CHUNK, x + base, len * sizeof(T));
            ranks_barrier();  // every rank's chunk is in
        }
        while (first < ranges.size() && ranges[first].end <= base) first++;
        for (size_t k = first; k < ranges.size() && ranges[k].begin < base + len; k++) {
            const RankRange& r = ranges[k];
            const size_t b = std::max(r.begin, base), e = std::min(r.end, base + len);
            if (b >= e) continue;
            if (op == RANKS_REDUCE && (r.owner < 0 || r.owner == g_ranks.rank)) sum_in_rank_order(x + b, rows + (b - base), e - b, stride);
            if (op == RANKS_BROADCAST && r.owner >= 0 && r.owner != g_ranks.rank)
                memcpy(x + b, rows + (size_t)r.owner * stride + (b - base), (e - b) * sizeof(T));
        }
        if (!mpi) ranks_barrier();  // every rank has read the chunks before the next round overwrites them
    }
}

// x (floats of backend memory): over `ranges`, the sums their owners need (RANKS_REDUCE) or the owners'
// values for every rank (RANKS_BROADCAST). The sharded optimizer's reduction of the gradients and its
// gathering of the updated parameters.
#ifdef __CUDACC__
// ranks_exchange_floats on a given stream (the overlapped gradient reduction runs on a second one).
static inline void ranks_exchange_floats_on(float* x, const std::vector<RankRange>& ranges, RankExchange op, cudaStream_t stream) {
    if (g_ranks.world == 1) return;
#ifdef XSA_NCCL
    ncclCheck(ncclGroupStart());  // one launch for all the ranges
    for (const RankRange& r : ranges) {
        const size_t n = r.end - r.begin;
        if (n == 0 || (op == RANKS_BROADCAST && r.owner < 0)) continue;
        float* p = x + r.begin;
        if (op == RANKS_BROADCAST) ncclCheck(ncclBroadcast(p, p, n, ncclFloat, r.owner, g_ranks.comm, stream));
        else if (r.owner < 0) ncclCheck(ncclAllReduce(p, p, n, ncclFloat, ncclSum, g_ranks.comm, stream));
        else ncclCheck(ncclReduce(p, p, n, ncclFloat, ncclSum, r.owner, g_ranks.comm, stream));
    }
    ncclCheck(ncclGroupEnd());
#else
    (void)x, (void)ranges, (void)op, (void)stream;  // not reached: without NCCL, ranks_launch refuses several ranks
#endif
}
#endif

static inline void ranks_exchange_floats(float* x, const std::vector<RankRange>& ranges, RankExchange op) {
#ifdef __CUDACC__
    ranks_exchange_floats_on(x, ranges, op, g_backend.stream);
#else
    if (g_ranks.world > 1) ranks_exchange_host(x, ranges, op, g_ranks.float_slots);
#endif
}

// x (n floats of backend memory) = the sum over the ranks of x, the same on every rank.
static inline void ranks_sum_floats(float* x, size_t n) { ranks_exchange_floats(x, {{0, n, -1}}, RANKS_REDUCE); }

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
    ranks_exchange_host(x, {{0, n, -1}}, RANKS_REDUCE, g_ranks.double_slots);
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

// ----------------------------------------------------------------------------------------------------
// Stopping together

// SIGINT, SIGTERM and SIGHUP (Ctrl-C, a scheduler's pre-emption, a closed terminal) ask the run to stop after the current optimizer
// step, with a checkpoint (run_train's loop, run_stop). A second request, a second or more after the first,
// ends the process at once: the handler restores the default action and raises the signal again. (Two
// copies of one request, e.g. from the terminal and from the --ranks supervisor, arrive together.)
// The request is answered at once, on rank 0's stderr, with what will happen: g_stop_text, kept current by the
// training loop (stop_texts_set). Where there is nothing to save (no -o, or before the first step) the first
// request ends the run at once (exit code 128 + the signal, as run_stop's).
static volatile sig_atomic_t g_stop_signal = 0;
static volatile long g_stop_at_ms = 0;
static volatile sig_atomic_t g_stop_at_once = 1;  // until the training loop says there is something to save
// [text][buffer]: what the first and the second request print; two buffers and the current one's index,
// since the handler may run while the loop writes the other
static char g_stop_text[2][2][512];
static volatile sig_atomic_t g_stop_text_current = -1;  // -1: none yet

static void stop_write(const char* text) {
    if (g_ranks.rank != 0) return;
    size_t n = 0;
    while (text[n]) n++;
    while (n > 0) {
        const ssize_t w = write(2, text, n);
        if (w <= 0) return;
        text += w;
        n -= (size_t)w;
    }
}

// What a first and a second stop request will print from now on (rank 0)
static void stop_texts_set(const std::string& first, const std::string& second) {
    const int next = g_stop_text_current == 0 ? 1 : 0;
    snprintf(g_stop_text[0][next], sizeof g_stop_text[0][next], "\n%s\n", first.c_str());
    snprintf(g_stop_text[1][next], sizeof g_stop_text[1][next], "\n%s\n", second.c_str());
    g_stop_text_current = next;
}

static void on_stop_signal(int sig) {
    timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);  // async-signal-safe, unlike most of libc
    const long ms = (long)now.tv_sec * 1000 + now.tv_nsec / 1000000;
    const int text = g_stop_text_current;
    if (g_stop_signal == 0) {
        g_stop_signal = sig;
        g_stop_at_ms = ms;
        if (g_stop_at_once) {
            stop_write("\nstopped at once: nothing to save (no -o, or no step trained yet)\n");
            _exit(128 + sig);
        }
        if (text >= 0) stop_write(g_stop_text[0][text]);
    } else if (ms - g_stop_at_ms > 1000) {
        if (text >= 0) stop_write(g_stop_text[1][text]);
        signal(sig, SIG_DFL);
        raise(sig);
    }
}

static void install_stop_handlers() {
    struct sigaction stop = {};
    stop.sa_handler = on_stop_signal;
    stop.sa_flags = SA_RESTART;
    sigaction(SIGINT, &stop, nullptr);
    sigaction(SIGTERM, &stop, nullptr);
    sigaction(SIGHUP, &stop, nullptr);  // the terminal of an ssh session closed: stop as SIGTERM does, with a checkpoint
    signal(SIGXFSZ, SIG_IGN);  // past `ulimit -f` a write fails (EFBIG: an error line) instead of killing the run
}

// The signal that asked the run to stop, 0 if none; with several ranks, any rank's (all of them must
// stop after the same step, since a checkpoint gathers every rank's loader state).
static int stop_requested() {
    if (g_ranks.world == 1) return g_stop_signal;
    std::vector<double> signals(g_ranks.world, 0.0);
    signals[g_ranks.rank] = g_stop_signal;
    ranks_sum_doubles(signals.data(), signals.size());
    return (int)*std::max_element(signals.begin(), signals.end());
}
