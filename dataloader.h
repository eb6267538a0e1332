// dataloader.h: token shards and nanochat's BOS-aligned best-fit packing, with a state that resumes
// exactly (dev/docs/data.md#the-data-loader).
//
// Shard layout (llm.c's): int32 header[256]: [0] = 20240520 (magic), [1] = version (1: uint16 tokens,
// 2: uint32 tokens), [2] = token count low 32 bits, [3] = high 32 bits (0 in llm.c files); then the
// tokens. Every document starts with BOS, so documents are the spans between BOS tokens.
//
// Packing, per row of T+1 tokens: keep a buffer of >= 1000 documents (refilled 128 at a time); put in
// the largest document that still fits; when none fits, crop the shortest to the space left and drop
// its tail. Every row starts with BOS and no document spans two rows. inputs = row[0:T],
// targets = row[1:T+1]. With several ranks, rank r reads the 128-document chunks r, r+W, r+2W, ... of
// every shard (nanochat strides parquet row groups the same way).
//
// Unlike nanochat, the state (stream position and the buffer's documents) is saved whole, so a resumed
// run sees exactly the batches the uninterrupted run would have seen.
#pragma once

#include <fcntl.h>
#include <glob.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <string>
#include <vector>
#include "llmc/common.h"

static const int SHARD_MAGIC = 20240520;
static const int SHARD_HEADER_INTS = 256;
static const uint64_t SHARD_HEADER_BYTES = SHARD_HEADER_INTS * sizeof(int32_t);

// A data file memory-mapped read-only: a token shard, or a conversation file for SFT. Such files are large
// (pages are read as the loader reaches them). A file truncated under a mapping turns a read of its lost
// pages into SIGBUS, so:
// * mapped_file_open checks the size against the header (the caller's check), and mapped_file_check
//   compares the file with what was mapped (same inode: same size and modification time) before each chunk
//   of documents is scanned and before each document is copied into a batch: a file rewritten or truncated
//   during a run is an error naming it. (A file replaced by a new one, e.g. renamed over, leaves the
//   mapping on the old one, which stays whole.)
// * a truncation between a check and a read still raises SIGBUS: the handler below names the file whose
//   mapping holds the faulting address, as an `error:` line, and exits 1. A SIGBUS anywhere else keeps
//   its previous action.
struct MappedFile {
    std::string path;
    const char* what = "";    // "shard", "conversation file": how errors name it
    void* map = nullptr;      // the whole file
    size_t map_bytes = 0;
    dev_t dev = 0;            // the file that was mapped, to notice it changing under the run (mapped_file_check)
    ino_t ino = 0;
    struct timespec mtime = {};
};

struct FileMapping {
    const char* begin;
    size_t bytes;
    const char* what;
    char* path;  // malloc'ed: read by the signal handler
};
static std::vector<FileMapping>& g_file_mappings = *new std::vector<FileMapping>;  // never destroyed: the handler may run during exit
static struct sigaction g_sigbus_previous;

static inline void sigbus_write(const char* text) {
    size_t n = strlen(text);
    while (n > 0) {
        ssize_t w = write(2, text, n);
        if (w <= 0) return;
        text += w;
        n -= (size_t)w;
    }
}

static inline void mapped_file_sigbus_handler(int sig, siginfo_t* info, void* context) {
    const char* addr = (const char*)info->si_addr;
    for (const FileMapping& m : g_file_mappings) {
        if (addr >= m.begin && addr < m.begin + m.bytes) {
            // one line, async-signal-safe: write(2) and _exit only
            char line[4096] = "error: ";
            size_t n = strlen(line);
            const char* parts[] = {g_fail_prefix, m.what, " '", m.path, "' was truncated while this run read it (a ", m.what,
                                   " must not change during a run)\n"};
            for (const char* part : parts)
                for (const char* c = part; *c && n < sizeof line - 2; c++) line[n++] = *c;
            if (line[n - 1] != '\n') line[n++] = '\n';
            line[n] = '\0';
            sigbus_write(line);
            _exit(1);
        }
    }
    // not ours: the previous action, on the faulting access again
    sigaction(SIGBUS, &g_sigbus_previous, nullptr);
    (void)sig;
    (void)context;
}

static inline void mapped_file_register(const MappedFile& f) {
    static bool installed = false;
    if (!installed) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = mapped_file_sigbus_handler;
        sa.sa_flags = SA_SIGINFO;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGBUS, &sa, &g_sigbus_previous);
        installed = true;
    }
    char* path = strdup(f.path.c_str());
    if (!path) fail("out of memory opening %s '%s'", f.what, f.path.c_str());
    g_file_mappings.push_back({(const char*)f.map, f.map_bytes, f.what, path});
}

static inline void mapped_file_unregister(const MappedFile& f) {
    for (size_t i = 0; i < g_file_mappings.size(); i++)
        if (g_file_mappings[i].begin == (const char*)f.map) {
            char* path = g_file_mappings[i].path;
            g_file_mappings.erase(g_file_mappings.begin() + i);
            free(path);
            return;
        }
}

// Opens `path` (a `what`), reads its first header_bytes into `header` (shorter is an error), lets
// check_header(file_bytes) refuse a header that does not fit the file (before anything is mapped, so a
// failure leaks nothing), then maps the whole file.
template <typename CheckHeader>
static inline void mapped_file_open(MappedFile* f, const std::string& path, const char* what, void* header, size_t header_bytes,
                                    CheckHeader check_header) {
    f->path = path;
    f->what = what;
    int fd = open(path.c_str(), O_RDONLY);
    if (fd < 0) fail("cannot open %s '%s': %s", what, path.c_str(), strerror(errno));
    struct FdCloser {  // closed on every return and every fail() (which throws in the fuzz build)
        int fd;
        ~FdCloser() { close(fd); }
    } closer{fd};
    struct stat st;
    if (fstat(fd, &st) != 0) fail("cannot stat %s '%s': %s", what, path.c_str(), strerror(errno));
    if (!S_ISREG(st.st_mode)) fail("%s '%s' is not a regular file", what, path.c_str());
    const uint64_t file_bytes = (uint64_t)st.st_size;
    if (file_bytes < header_bytes)
        fail("%s '%s' is truncated: %llu bytes, shorter than its %zu-byte header", what, path.c_str(), (unsigned long long)file_bytes, header_bytes);
    if (pread(fd, header, header_bytes, 0) != (ssize_t)header_bytes) fail("cannot read %s '%s': %s", what, path.c_str(), strerror(errno));
    check_header(file_bytes);
    if (file_bytes > (uint64_t)SIZE_MAX) fail("%s '%s' is too large to map", what, path.c_str());
    f->map_bytes = (size_t)file_bytes;
    f->dev = st.st_dev;
    f->ino = st.st_ino;
    f->mtime = st.st_mtim;
#ifdef XSA_FUZZ
    // the fuzz build (dev/fuzz/) reads the file into the heap, where ASan reports any read past its end
    // (past a mapping it sees nothing: the next pages may belong to anything)
    f->map = malloc(f->map_bytes);
    if (f->map == nullptr || pread(fd, f->map, f->map_bytes, 0) != (ssize_t)f->map_bytes) {
        free(f->map);
        f->map = nullptr;
        fail("cannot read %s '%s'", what, path.c_str());
    }
#else
    f->map = mmap(nullptr, f->map_bytes, PROT_READ, MAP_PRIVATE, fd, 0);
    if (f->map == MAP_FAILED) {
        f->map = nullptr;
        fail("cannot map %s '%s': %s", what, path.c_str(), strerror(errno));
    }
#endif
    mapped_file_register(*f);
}

static inline void mapped_file_close(MappedFile* f) {
    if (f->map) {
        mapped_file_unregister(*f);
#ifdef XSA_FUZZ
        free(f->map);
#else
        munmap(f->map, f->map_bytes);
#endif
    }
    f->map = nullptr;
}

// The file must still be the one mapped, unchanged (see above); a stat costs about a microsecond.
static inline void mapped_file_check(const MappedFile& f) {
    struct stat st;
    if (stat(f.path.c_str(), &st) != 0 || st.st_dev != f.dev || st.st_ino != f.ino) return;  // gone or replaced: the mapping holds the old file
    if ((uint64_t)st.st_size != f.map_bytes || st.st_mtim.tv_sec != f.mtime.tv_sec || st.st_mtim.tv_nsec != f.mtime.tv_nsec)
        fail("%s '%s' changed while this run reads it (%zu bytes when opened, now %llu); a %s must not change during a run", f.what,
             f.path.c_str(), f.map_bytes, (unsigned long long)st.st_size, f.what);
}

// A token shard (layout at the top of this file)
struct Shard : MappedFile {
    int version = 0;          // 1: uint16 tokens, 2: uint32 tokens
    uint64_t ntokens = 0;
    uint32_t token(uint64_t i) const {
        const uint8_t* data = (const uint8_t*)map + SHARD_HEADER_BYTES;
        return version == 1 ? ((const uint16_t*)data)[i] : ((const uint32_t*)data)[i];
    }
};

// Maps a shard and checks its header against the file size. Token ids are checked as they are read.
static inline Shard shard_open(const std::string& path) {
    Shard s;
    int32_t header[SHARD_HEADER_INTS] = {};  // (initialised: nvcc cannot see that mapped_file_open fills it first)
    mapped_file_open(&s, path, "shard", header, SHARD_HEADER_BYTES, [&](uint64_t file_bytes) {
        if (header[0] != SHARD_MAGIC) fail("'%s' is not a token shard (magic %d, expected %d)", path.c_str(), header[0], SHARD_MAGIC);
        if (header[1] != 1 && header[1] != 2) fail("shard '%s' has version %d; this build reads 1 (uint16) and 2 (uint32)", path.c_str(), header[1]);
        s.version = header[1];
        s.ntokens = (uint64_t)(uint32_t)header[2] | ((uint64_t)(uint32_t)header[3] << 32);
        const uint64_t bytes_per_token = s.version == 1 ? 2 : 4;
        // compared by division: ntokens * bytes_per_token would wrap for a header claiming 2^63 tokens
        const uint64_t data_bytes = file_bytes - SHARD_HEADER_BYTES;
        if (data_bytes % bytes_per_token != 0 || s.ntokens != data_bytes / bytes_per_token)
            fail("shard '%s' is truncated or corrupt: its header promises %llu tokens of %llu bytes, the file has %llu bytes after its 1024-byte header",
                 path.c_str(), (unsigned long long)s.ntokens, (unsigned long long)bytes_per_token, (unsigned long long)data_bytes);
        if (s.ntokens == 0) fail("shard '%s' holds no tokens", path.c_str());
    });
    return s;
}

static inline void shard_close(Shard* s) { mapped_file_close(s); }
static inline void shard_check(const Shard& s) { mapped_file_check(s); }

// The files matching a glob pattern, sorted (glob sorts); possibly none.
static inline std::vector<std::string> matching_files(const std::string& pattern) {
    glob_t g;
    std::vector<std::string> files;
    if (glob(pattern.c_str(), 0, nullptr, &g) == 0) {
        for (size_t i = 0; i < g.gl_pathc; i++) files.push_back(g.gl_pathv[i]);
    }
    globfree(&g);
    return files;
}

// The files matching a glob pattern, sorted; none is an error.
static inline std::vector<std::string> expand_pattern(const std::string& pattern, const char* what) {
    std::vector<std::string> files = matching_files(pattern);
    if (files.empty()) fail("no %s files match '%s'", what, pattern.c_str());
    return files;
}

struct Document {
    int32_t shard;
    uint64_t start;   // offset of its BOS in the shard
    uint32_t length;  // tokens, BOS included
};

struct DataLoader {
    std::vector<Shard> shards;
    int vocab_size = 0, bos_id = 0;
    int B = 0, T = 0;
    int rank = 0, world = 1;
    int buffer_target = 1000;  // documents kept to choose from (nanochat: 1000)
    int chunk_docs = 128;      // documents added per refill, and the unit ranks stride over (nanochat: 128)
    // stream position: the next document to read
    int shard_idx = 0;
    uint64_t pos = 0;
    uint64_t doc_in_shard = 0;
    int64_t epoch = 1;
    std::vector<Document> buffer;
    std::vector<int> inputs, targets;  // (B, T) of the last batch
    std::vector<int> row;              // (T + 1) scratch
};

// Reads the document at the stream position and advances past it (wrapping to the next shard, and
// to the next epoch after the last shard). Checks every token id on the way.
static inline Document dataloader_read_document(DataLoader* dl) {
    const Shard& s = dl->shards[dl->shard_idx];
    if (s.token(dl->pos) != (uint32_t)dl->bos_id)
        fail("shard '%s': token %llu is %u, not BOS (%d); every document must start with BOS (was it written with this tokenizer?)",
             s.path.c_str(), (unsigned long long)dl->pos, s.token(dl->pos), dl->bos_id);
    uint64_t end = dl->pos + 1;
    while (end < s.ntokens) {
        uint32_t t = s.token(end);
        if (t == (uint32_t)dl->bos_id) break;
        if (t >= (uint32_t)dl->vocab_size)
            fail("shard '%s': token %llu has id %u >= vocab %d (shard and tokenizer do not match)", s.path.c_str(), (unsigned long long)end, t,
                 dl->vocab_size);
        end++;
    }
    if (end - dl->pos > 0xFFFFFFFFull) fail("shard '%s': a document of %llu tokens is too long", s.path.c_str(), (unsigned long long)(end - dl->pos));
    Document d{dl->shard_idx, dl->pos, (uint32_t)(end - dl->pos)};
    dl->pos = end;
    dl->doc_in_shard++;
    if (dl->pos == s.ntokens) {
        dl->pos = 0;
        dl->doc_in_shard = 0;
        if (++dl->shard_idx == (int)dl->shards.size()) {
            dl->shard_idx = 0;
            dl->epoch++;
        }
    }
    return d;
}

// Appends this rank's next chunk of documents to the buffer.
static inline void dataloader_refill(DataLoader* dl) {
    const int64_t start_epoch = dl->epoch;
    for (;;) {
        const uint64_t chunk = dl->doc_in_shard / dl->chunk_docs;
        const int shard = dl->shard_idx;
        const int64_t epoch = dl->epoch;
        const bool mine = (int)(chunk % dl->world) == dl->rank;
        shard_check(dl->shards[shard]);
        int added = 0;
        do {  // the rest of this chunk (a shard's last chunk may be short)
            Document d = dataloader_read_document(dl);
            if (mine) {
                dl->buffer.push_back(d);
                added++;
            }
        } while (dl->shard_idx == shard && dl->epoch == epoch && dl->doc_in_shard / dl->chunk_docs == chunk);
        if (added > 0) return;
        if (dl->epoch > start_epoch + 1)
            fail("rank %d of %d gets no documents: the %zu shard(s) from '%s' have too few %d-document chunks", dl->rank, dl->world,
                 dl->shards.size(), dl->shards[0].path.c_str(), dl->chunk_docs);
    }
}

static inline void dataloader_init(DataLoader* dl, const std::string& pattern, const char* what, int vocab_size, int bos_id, int B, int T,
                                   int rank, int world) {
    *dl = DataLoader();
    for (const std::string& path : expand_pattern(pattern, what)) dl->shards.push_back(shard_open(path));
    dl->vocab_size = vocab_size;
    dl->bos_id = bos_id;
    dl->B = B;
    dl->T = T;
    dl->rank = rank;
    dl->world = world;
    dl->inputs.resize((size_t)B * T);
    dl->targets.resize((size_t)B * T);
    dl->row.resize((size_t)T + 1);
}

static inline void dataloader_free(DataLoader* dl) {
    for (Shard& s : dl->shards) shard_close(&s);
    *dl = DataLoader();
}

// Back to the start of the first shard with an empty buffer (a fresh validation pass).
static inline void dataloader_reset(DataLoader* dl) {
    dl->shard_idx = 0;
    dl->pos = 0;
    dl->doc_in_shard = 0;
    dl->epoch = 1;
    dl->buffer.clear();
}

// Packs the next B rows into dl->inputs and dl->targets (B, T).
static inline void dataloader_next_batch(DataLoader* dl) {
    const int capacity = dl->T + 1;
    for (int b = 0; b < dl->B; b++) {
        int filled = 0;
        while (filled < capacity) {
            while ((int)dl->buffer.size() < dl->buffer_target) dataloader_refill(dl);
            const int remaining = capacity - filled;
            int best = -1, shortest = 0;
            for (int i = 0; i < (int)dl->buffer.size(); i++) {
                uint32_t len = dl->buffer[i].length;
                if (len <= (uint32_t)remaining && (best < 0 || len > dl->buffer[best].length)) best = i;
                if (len < dl->buffer[shortest].length) shortest = i;
            }
            const int pick = best >= 0 ? best : shortest;
            const Document d = dl->buffer[pick];
            dl->buffer.erase(dl->buffer.begin() + pick);
            const int take = best >= 0 ? (int)d.length : remaining;  // no fit: crop the shortest, drop its tail
            const Shard& s = dl->shards[d.shard];
            shard_check(s);
            for (int i = 0; i < take; i++) dl->row[filled + i] = (int)s.token(d.start + i);
            filled += take;
        }
        memcpy(&dl->inputs[(size_t)b * dl->T], dl->row.data(), dl->T * sizeof(int));
        memcpy(&dl->targets[(size_t)b * dl->T], dl->row.data() + 1, dl->T * sizeof(int));
    }
}

// The state as integers, for checkpoints: position, epoch, then (shard, start, length) per buffered document.
static inline std::vector<int64_t> dataloader_state(const DataLoader* dl) {
    std::vector<int64_t> s = {dl->shard_idx, (int64_t)dl->pos, (int64_t)dl->doc_in_shard, dl->epoch, (int64_t)dl->buffer.size()};
    for (const Document& d : dl->buffer) {
        s.push_back(d.shard);
        s.push_back((int64_t)d.start);
        s.push_back(d.length);
    }
    return s;
}

// Restores a state from a checkpoint (`source` names it), checking it against the shards: every index
// and span in range (without overflow), the stream position at a document's BOS, and every buffered
// document exactly a document of its shard (BOS first, no BOS inside, ids in the vocabulary, ending at
// the next BOS or the shard's end), as dataloader_read_document would have produced it.
static inline void dataloader_restore(DataLoader* dl, const std::vector<int64_t>& s, const char* source) {
    auto bad = [&](const char* what) {
        fail("%s: the data-loader state does not match these shards (%s; different -i pattern or files?)", source, what);
    };
    if (s.size() < 5) bad("too short");
    const int64_t n = s[4];
    if (n < 0 || (uint64_t)n > (s.size() - 5) / 3 || s.size() != 5 + 3 * (size_t)n) bad("wrong length");
    const int64_t nshards = (int64_t)dl->shards.size();
    if (s[0] < 0 || s[0] >= nshards) bad("shard index out of range");
    const Shard& at = dl->shards[s[0]];
    if (s[1] < 0 || (uint64_t)s[1] >= at.ntokens) bad("position out of range");
    if (at.token((uint64_t)s[1]) != (uint32_t)dl->bos_id) bad("position not at a document's BOS");
    if (s[2] < 0 || s[2] > s[1]) bad("document count out of range");  // every document read holds >= 1 token
    if (s[3] < 1) bad("epoch out of range");
    std::vector<Document> buffer;
    for (int64_t i = 0; i < n; i++) {
        const int64_t shard = s[5 + 3 * i], start = s[6 + 3 * i], length = s[7 + 3 * i];
        if (shard < 0 || shard >= nshards) bad("a buffered document's shard is out of range");
        const Shard& sh = dl->shards[shard];
        if (start < 0 || (uint64_t)start >= sh.ntokens || length < 1 || (uint64_t)length > sh.ntokens - (uint64_t)start ||
            length > 0xFFFFFFFFll)
            bad("a buffered document's span is out of range");
        const uint64_t b = (uint64_t)start, e = b + (uint64_t)length;
        if (sh.token(b) != (uint32_t)dl->bos_id || (e < sh.ntokens && sh.token(e) != (uint32_t)dl->bos_id)) bad("a buffered document is not a document");
        for (uint64_t t = b + 1; t < e; t++) {
            const uint32_t id = sh.token(t);
            if (id == (uint32_t)dl->bos_id || id >= (uint32_t)dl->vocab_size) bad("a buffered document is not a document");
        }
        buffer.push_back(Document{(int32_t)shard, b, (uint32_t)length});
    }
    dl->shard_idx = (int)s[0];
    dl->pos = (uint64_t)s[1];
    dl->doc_in_shard = (uint64_t)s[2];
    dl->epoch = s[3];
    dl->buffer = buffer;
}

// Restores this rank's state from the states of a run on another number of ranks (`states[r]`: old rank
// r's, each checked as dataloader_restore does), so that a checkpoint resumes on any number of ranks. No
// run on the new ranks could have reached this point, so this is a choice (dev/docs/data.md#ranks-and-epochs):
// every new rank goes on from the furthest stream position of the old ones, and the documents the old
// ranks had buffered are dealt out in turn (old rank 0's buffer in order, then rank 1's, ...: document i to
// new rank i mod the new ranks). No document is read twice; the chunks before that position that their old
// rank had not reached yet are skipped (fewer than the old ranks' count, of 128 documents each).
static inline void dataloader_restore_resharded(DataLoader* dl, const std::vector<std::vector<int64_t>>& states, const char* source) {
    std::vector<Document> dealt;
    bool first = true;
    for (size_t r = 0; r < states.size(); r++) {
        DataLoader old = *dl;  // shares the mapped shards; only its position and buffer are set
        old.buffer.clear();
        dataloader_restore(&old, states[r], source);
        const bool further = old.epoch != dl->epoch ? old.epoch > dl->epoch : old.shard_idx != dl->shard_idx ? old.shard_idx > dl->shard_idx
                                                                                                               : old.pos > dl->pos;
        if (first || further) {
            dl->shard_idx = old.shard_idx;
            dl->pos = old.pos;
            dl->doc_in_shard = old.doc_in_shard;
            dl->epoch = old.epoch;
            first = false;
        }
        dealt.insert(dealt.end(), old.buffer.begin(), old.buffer.end());
    }
    dl->buffer.clear();
    for (size_t i = dl->rank; i < dealt.size(); i += dl->world) dl->buffer.push_back(dealt[i]);
}
