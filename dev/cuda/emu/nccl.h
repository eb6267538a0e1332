// nccl.h for the CUDA emulator: the NCCL calls ranks.cuh makes, for ranks that are processes forked on one
// machine. Documented semantics kept: a collective (ncclAllReduce, ncclReduce, ncclBroadcast) is a stream
// operation (it runs when the emulator runs the stream's work, in issue order), every rank must issue the
// same collectives in the same order, and the result is the same on every rank. The sum adds the ranks'
// values in rank order.
//
// The ranks meet in a file mapped by all of them: ncclGetUniqueId creates it (its path is the id), and
// ncclCommInitRank maps it. The file's zero-filled header is a sense-reversing barrier (atomics in shared
// memory), so nothing needs initialising before the ranks arrive.
#pragma once

#include <fcntl.h>
#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>
#include <atomic>
#include <cstdio>
#include <cstring>

typedef enum { ncclSuccess = 0, ncclSystemError = 2, ncclInvalidArgument = 4 } ncclResult_t;
typedef enum { ncclFloat = 7, ncclDouble = 8 } ncclDataType_t;
typedef enum { ncclSum = 0 } ncclRedOp_t;
typedef struct { char internal[128]; } ncclUniqueId;

static const int EMU_NCCL_MAX_RANKS = 16;
static const size_t EMU_NCCL_CHUNK = 1 << 18;  // bytes per rank per round

struct EmuNcclShared {
    std::atomic<int> arrived;
    std::atomic<int> generation;
};
struct EmuNcclComm {
    int rank, nranks;
    EmuNcclShared* shared;
    unsigned char* slots;  // (EMU_NCCL_MAX_RANKS, EMU_NCCL_CHUNK)
};
typedef EmuNcclComm* ncclComm_t;
static const size_t EMU_NCCL_BYTES = 4096 + (size_t)EMU_NCCL_MAX_RANKS * EMU_NCCL_CHUNK;

static inline const char* ncclGetErrorString(ncclResult_t r) { return r == ncclSuccess ? "no error" : "emulated NCCL error"; }

static inline ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
    memset(id, 0, sizeof *id);
    snprintf(id->internal, sizeof id->internal, "/tmp/emu_nccl_%d_%ld", (int)getpid(), (long)time(nullptr));
    int fd = open(id->internal, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0 || ftruncate(fd, (off_t)EMU_NCCL_BYTES) != 0) return ncclSystemError;
    close(fd);
    return ncclSuccess;
}

static inline void emu_nccl_barrier(ncclComm_t c) {
    const int gen = c->shared->generation.load();
    if (c->shared->arrived.fetch_add(1) + 1 == c->nranks) {
        c->shared->arrived.store(0);
        c->shared->generation.fetch_add(1);
    } else {
        while (c->shared->generation.load() == gen) sched_yield();
    }
}

static inline ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
    if (nranks < 1 || nranks > EMU_NCCL_MAX_RANKS || rank < 0 || rank >= nranks) return ncclInvalidArgument;
    int fd = open(id.internal, O_RDWR);
    if (fd < 0) return ncclSystemError;
    void* map = mmap(nullptr, EMU_NCCL_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (map == MAP_FAILED) return ncclSystemError;
    *comm = new EmuNcclComm{rank, nranks, (EmuNcclShared*)map, (unsigned char*)map + 4096};
    emu_nccl_barrier(*comm);  // every rank has mapped the file: it can go
    if (rank == 0) unlink(id.internal);
    return ncclSuccess;
}

// recv = the sum of the ranks' send, on every rank (root -1) or on root only; in rank order
template <typename T>
static inline void emu_nccl_sum(T* recv, const T* send, size_t count, ncclComm_t c, int root = -1) {
    const size_t per_round = EMU_NCCL_CHUNK / sizeof(T);
    for (size_t base = 0; base < count; base += per_round) {
        const size_t len = count - base < per_round ? count - base : per_round;
        memcpy(c->slots + (size_t)c->rank * EMU_NCCL_CHUNK, send + base, len * sizeof(T));
        emu_nccl_barrier(c);
        for (size_t i = 0; i < len && (root < 0 || root == c->rank); i++) {
            T sum = ((const T*)c->slots)[i];
            for (int r = 1; r < c->nranks; r++) sum += ((const T*)(c->slots + (size_t)r * EMU_NCCL_CHUNK))[i];
            recv[base + i] = sum;
        }
        emu_nccl_barrier(c);
    }
}

// recv = root's send, on every rank
static inline void emu_nccl_broadcast(unsigned char* recv, const unsigned char* send, size_t bytes, int root, ncclComm_t c) {
    for (size_t base = 0; base < bytes; base += EMU_NCCL_CHUNK) {
        const size_t len = bytes - base < EMU_NCCL_CHUNK ? bytes - base : EMU_NCCL_CHUNK;
        if (c->rank == root) memcpy(c->slots, send + base, len);
        emu_nccl_barrier(c);
        if (c->rank != root) memcpy(recv + base, c->slots, len);
        emu_nccl_barrier(c);
    }
}

// Groups only batch launches in NCCL; here every call already runs in issue order on its stream.
static inline ncclResult_t ncclGroupStart() { return ncclSuccess; }
static inline ncclResult_t ncclGroupEnd() { return ncclSuccess; }

static inline ncclResult_t ncclReduce(const void* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t op, int root, ncclComm_t comm,
                                      cudaStream_t stream) {
    if (op != ncclSum || (type != ncclFloat && type != ncclDouble) || root < 0 || root >= comm->nranks) return ncclInvalidArgument;
    emu_enqueue(stream, [=] {
        if (type == ncclFloat) emu_nccl_sum((float*)recv, (const float*)send, count, comm, root);
        else emu_nccl_sum((double*)recv, (const double*)send, count, comm, root);
    });
    return ncclSuccess;
}

static inline ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t type, int root, ncclComm_t comm,
                                         cudaStream_t stream) {
    if ((type != ncclFloat && type != ncclDouble) || root < 0 || root >= comm->nranks) return ncclInvalidArgument;
    const size_t bytes = count * (type == ncclFloat ? sizeof(float) : sizeof(double));
    emu_enqueue(stream, [=] { emu_nccl_broadcast((unsigned char*)recv, (const unsigned char*)send, bytes, root, comm); });
    return ncclSuccess;
}

static inline ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t op, ncclComm_t comm,
                                         cudaStream_t stream) {
    if (op != ncclSum || (type != ncclFloat && type != ncclDouble)) return ncclInvalidArgument;
    emu_enqueue(stream, [=] {
        if (type == ncclFloat) emu_nccl_sum((float*)recv, (const float*)send, count, comm);
        else emu_nccl_sum((double*)recv, (const double*)send, count, comm);
    });
    return ncclSuccess;
}
