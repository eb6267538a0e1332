// dataloader.h: token shards and nanochat's BOS-aligned best-fit packing, with a state that resumes
// exactly (dev/docs/data.md#the-data-loader).
//
// Shard layout (llm.c's): int32 header[256]: [0] = 20240520 (magic), [1] = version (1: uint16 tokens,
// 2: uint32 tokens), [2] = token count low 32 bits, [3] = high 32 bits (0 in llm.c files); then the
// tokens. Every document starts with BOS, so documents are the spans between BOS tokens.
//
// Row groups: a shard made from a parquet file (dev/data/climbmix.py) has beside it SHARD.rowgroups, where
// the file's row groups begin and how many documents each holds (layout at RowGroupFile below). Ranks stride
// over row groups as nanochat does: rank r reads the row groups r, r+W, r+2W, ... of every shard, in order.
// A shard without that file (made from other text, or before it existed) is read as row groups of 128
// documents, counted from the shard's start. With a data seed (--data-seed, not nanochat's) the row groups of
// each shard are visited in an order shuffled per shard and epoch, and the ranks stride over that order.
//
// Packing, per row of T+1 tokens: keep a buffer of >= 1000 documents, refilled with the next slice of at
// most 128 documents of this rank's current row group (nanochat's _document_batches); put in the largest
// document that still fits; when none fits, crop the shortest to the space left and drop its tail. Every row
// starts with BOS and no document spans two rows. inputs = row[0:T], targets = row[1:T+1].
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
#include <algorithm>
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
// * a truncation between a check and a read still raises SIGBUS: the handler of common.h
//   (file_mapping_register) names the file whose mapping holds the faulting address, as an `error:` line, and
//   exits 1.
struct MappedFile {
    std::string path;
    const char* what = "";    // "shard", "conversation file": how errors name it
    void* map = nullptr;      // the whole file
    size_t map_bytes = 0;
    dev_t dev = 0;            // the file that was mapped, to notice it changing under the run (mapped_file_check)
    ino_t ino = 0;
    struct timespec mtime = {};
};

// Opens `path` (a `what`), reads its first header_bytes into `header` (shorter is an error), lets
// check_header(file_bytes) refuse a header that does not fit the file (before anything is mapped, so a
// failure leaks nothing), then maps the whole file.
template <typename CheckHeader>
static inline void mapped_file_open(MappedFile* f, const std::string& path, const char* what, void* header, size_t header_bytes,
                                    CheckHeader check_header) {
    f->path = path;
    f->what = what;
    int fd = open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);  // (a FIFO must not block the open: refused below)
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
    file_mapping_register(f->map, f->map_bytes, f->what, f->path);
}

static inline void mapped_file_close(MappedFile* f) {
    if (f->map) {
        file_mapping_unregister(f->map);
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

// A row group: documents that were stored together in the parquet file a shard was made from
struct RowGroup {
    uint64_t start;      // the token offset of its first document's BOS
    uint64_t documents;  // how many (parquet allows a row group of none)
};

// A token shard (layout at the top of this file)
struct Shard : MappedFile {
    int version = 0;          // 1: uint16 tokens, 2: uint32 tokens
    uint64_t ntokens = 0;
    // the row groups: from SHARD.rowgroups when it exists (read with the shard), else found by
    // shard_row_groups the first time they are needed (a scan for BOS tokens)
    std::vector<RowGroup> groups;
    bool groups_from_file = false;
    uint32_t token(uint64_t i) const {
        const uint8_t* data = (const uint8_t*)map + SHARD_HEADER_BYTES;
        return version == 1 ? ((const uint16_t*)data)[i] : ((const uint32_t*)data)[i];
    }
};

static inline void shard_read_row_groups(Shard* s);

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
    shard_read_row_groups(&s);
    return s;
}

// SHARD.rowgroups, little-endian: int32 header[8]: [0] = 20261205 (magic), [1] = 1 (version), [2] = row-group count G,
// [3] = 0, [4] = the shard's token count low 32 bits, [5] = high 32 bits, [6..7] = 0; then per row group two
// uint64: the token offset of its first document's BOS, and its document count. Offsets start at 0 and never
// decrease; a group with documents ends where the next one with documents starts (or at the shard's end).
static const int ROWGROUP_MAGIC = 20261205;
static const char* ROWGROUP_SUFFIX = ".rowgroups";

// Reads the row-group file of `s`, if it has one, checking it against the shard's size (the documents of each
// group are counted as they are read: dataloader_refill).
static inline void shard_read_row_groups(Shard* s) {
    const std::string path = s->path + ROWGROUP_SUFFIX;
    FILE* f = fopen(path.c_str(), "rb");
    if (!f) {
        if (errno == ENOENT) return;
        fail("cannot open row-group file '%s': %s", path.c_str(), strerror(errno));
    }
    struct Closer {
        FILE* f;
        ~Closer() { fclose(f); }
    } closer{f};
    int32_t header[8];
    if (fread(header, sizeof header, 1, f) != 1) fail("row-group file '%s' is truncated (no 32-byte header)", path.c_str());
    if (header[0] != ROWGROUP_MAGIC || header[1] != 1) fail("'%s' is not a row-group file (magic %d version %d)", path.c_str(), header[0], header[1]);
    const uint64_t ntokens = (uint64_t)(uint32_t)header[4] | ((uint64_t)(uint32_t)header[5] << 32);
    if (ntokens != s->ntokens)
        fail("row-group file '%s' describes a shard of %llu tokens, but '%s' has %llu (rewrite it: dev/data/climbmix.py)", path.c_str(),
             (unsigned long long)ntokens, s->path.c_str(), (unsigned long long)s->ntokens);
    if (header[2] < 1) fail("row-group file '%s' has %d row groups", path.c_str(), header[2]);
    std::vector<uint64_t> pairs((size_t)header[2] * 2);
    if (fread(pairs.data(), sizeof(uint64_t), pairs.size(), f) != pairs.size() || fgetc(f) != EOF)
        fail("row-group file '%s' does not hold exactly the %d row groups its header announces", path.c_str(), header[2]);
    std::vector<RowGroup> groups;
    for (int g = 0; g < header[2]; g++) {
        const uint64_t start = pairs[2 * g], documents = pairs[2 * g + 1];
        if ((g == 0 && start != 0) || (g > 0 && start < groups.back().start) || start > s->ntokens || documents > s->ntokens - start ||
            (documents > 0 && start == s->ntokens))
            fail("row-group file '%s': row group %d (first token %llu, %llu documents) does not fit shard '%s' of %llu tokens", path.c_str(), g,
                 (unsigned long long)start, (unsigned long long)documents, s->path.c_str(), (unsigned long long)s->ntokens);
        groups.push_back({start, documents});
    }
    s->groups = groups;
    s->groups_from_file = true;
}

// Without a row-group file: row groups of `docs_per_group` documents from the shard's start (one scan for BOS).
static inline void shard_row_groups(Shard* s, int docs_per_group, int bos_id) {
    if (!s->groups.empty()) return;
    mapped_file_check(*s);
    uint64_t docs = 0;
    for (uint64_t i = 0; i < s->ntokens; i++) {
        if (s->token(i) != (uint32_t)bos_id) {
            if (i == 0) fail("shard '%s': token 0 is %u, not BOS (%d); every document must start with BOS (was it written with this tokenizer?)",
                             s->path.c_str(), s->token(0), bos_id);
            continue;
        }
        if (docs % docs_per_group == 0) s->groups.push_back({i, 0});
        s->groups.back().documents++;
        docs++;
    }
}

// The token where row group g ends: the start of the next group with documents, or the shard's end.
static inline uint64_t row_group_end(const Shard& s, size_t g) {
    for (size_t h = g + 1; h < s.groups.size(); h++)
        if (s.groups[h].documents > 0) return s.groups[h].start;
    return s.ntokens;
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
    int chunk_docs = 128;      // documents added per refill (nanochat: 128), and the row groups of a shard without a row-group file
    // --data-seed: 0 (nanochat's order) reads each shard's row groups in order; another value visits them in an order
    // shuffled per shard and epoch by that seed (then the ranks stride over that order)
    uint64_t data_seed = 0;
    std::vector<uint32_t> order;  // the current shard's row groups in visiting order (dataloader_order)
    int order_shard = -1;
    int64_t order_epoch = -1;
    // stream position: the next document to read, in the row group visited `group`-th in shard shard_idx (this rank's)
    bool positioned = false;   // false: at the start of the first shard, not yet moved to this rank's first row group
    int shard_idx = 0;
    size_t group = 0;
    uint64_t doc_in_group = 0;
    uint64_t pos = 0;
    int64_t epoch = 1;
    std::vector<Document> buffer;
    std::vector<int> inputs, targets;  // (B, T) of the last batch
    std::vector<int> row;              // (T + 1) scratch
};

// The order in which the stream's shard's row groups are visited in the stream's epoch: in order, or with a data
// seed a permutation (Fisher-Yates with splitmix64 seeded by the seed, the shard and the epoch: a resumed run
// recomputes it).
static inline const std::vector<uint32_t>& dataloader_order(DataLoader* dl) {
    if (dl->order_shard == dl->shard_idx && dl->order_epoch == dl->epoch) return dl->order;
    Shard& s = dl->shards[dl->shard_idx];
    shard_row_groups(&s, dl->chunk_docs, dl->bos_id);
    dl->order.resize(s.groups.size());
    for (size_t g = 0; g < s.groups.size(); g++) dl->order[g] = (uint32_t)g;
    if (dl->data_seed != 0) {
        Rng rng{dl->data_seed};
        rng.state = rng_next_u64(&rng) ^ ((uint64_t)dl->shard_idx << 32) ^ (uint64_t)dl->epoch;
        for (size_t i = dl->order.size(); i > 1; i--) std::swap(dl->order[i - 1], dl->order[rng_next_u64(&rng) % i]);
    }
    dl->order_shard = dl->shard_idx;
    dl->order_epoch = dl->epoch;
    return dl->order;
}

// Moves the stream to the first document of this rank's next row group with documents: the one visited k-th
// in the current shard if it is one, else a later one (k + W, k + 2W, ...), else the next shards' (from the
// r-th), wrapping to a new epoch after the last shard.
static inline void dataloader_seek_group(DataLoader* dl, size_t k) {
    for (size_t shards_left = dl->shards.size() + 1;;) {
        const Shard& s = dl->shards[dl->shard_idx];
        const std::vector<uint32_t>& order = dataloader_order(dl);
        while (k < order.size() && s.groups[order[k]].documents == 0) k += dl->world;
        if (k < order.size()) {
            dl->group = k;
            dl->doc_in_group = 0;
            dl->pos = s.groups[order[k]].start;
            dl->positioned = true;
            return;
        }
        if (--shards_left == 0)
            fail("rank %d of %d gets no documents: the %zu shard(s) from '%s' have too few row groups", dl->rank, dl->world, dl->shards.size(),
                 dl->shards[0].path.c_str());
        if (++dl->shard_idx == (int)dl->shards.size()) {
            dl->shard_idx = 0;
            dl->epoch++;
        }
        k = dl->rank;
    }
}

// Reads the document at the stream position, ending before `end`, and moves past it. Checks every token id.
static inline Document dataloader_read_document(DataLoader* dl, uint64_t end) {
    const Shard& s = dl->shards[dl->shard_idx];
    if (s.token(dl->pos) != (uint32_t)dl->bos_id)
        fail("shard '%s': token %llu is %u, not BOS (%d); every document must start with BOS (%s)", s.path.c_str(), (unsigned long long)dl->pos,
             s.token(dl->pos), dl->bos_id, s.groups_from_file ? "does its row-group file belong to it?" : "was it written with this tokenizer?");
    uint64_t next = dl->pos + 1;
    while (next < end) {
        uint32_t t = s.token(next);
        if (t == (uint32_t)dl->bos_id) break;
        if (t >= (uint32_t)dl->vocab_size)
            fail("shard '%s': token %llu has id %u >= vocab %d (shard and tokenizer do not match)", s.path.c_str(), (unsigned long long)next, t,
                 dl->vocab_size);
        next++;
    }
    if (next - dl->pos > 0xFFFFFFFFull) fail("shard '%s': a document of %llu tokens is too long", s.path.c_str(), (unsigned long long)(next - dl->pos));
    Document d{dl->shard_idx, dl->pos, (uint32_t)(next - dl->pos)};
    dl->pos = next;
    return d;
}

// Appends this rank's next slice of documents to the buffer: at most chunk_docs of its current row group.
static inline void dataloader_refill(DataLoader* dl) {
    if (!dl->positioned) dataloader_seek_group(dl, dl->rank);
    const Shard& s = dl->shards[dl->shard_idx];
    shard_check(s);
    const size_t group = dataloader_order(dl)[dl->group];
    const RowGroup& g = s.groups[group];
    const uint64_t end = row_group_end(s, group);
    const uint64_t n = std::min<uint64_t>((uint64_t)dl->chunk_docs, g.documents - dl->doc_in_group);
    for (uint64_t i = 0; i < n; i++) {
        if (dl->pos == end)
            fail("shard '%s': row group %zu holds fewer than the %llu documents its row-group file gives", s.path.c_str(), group,
                 (unsigned long long)g.documents);
        dl->buffer.push_back(dataloader_read_document(dl, end));
    }
    dl->doc_in_group += n;
    if (dl->doc_in_group == g.documents) {
        if (dl->pos != end)
            fail("shard '%s': row group %zu holds more than the %llu documents its row-group file gives", s.path.c_str(), group,
                 (unsigned long long)g.documents);
        dataloader_seek_group(dl, dl->group + dl->world);
    }
}

static inline void dataloader_init(DataLoader* dl, const std::string& pattern, const char* what, int vocab_size, int bos_id, int B, int T,
                                   int rank, int world) {
    *dl = DataLoader();
    const size_t suffix = strlen(ROWGROUP_SUFFIX);
    for (const std::string& path : expand_pattern(pattern, what))  // (a pattern such as train_* matches the row-group files too)
        if (path.size() < suffix || path.compare(path.size() - suffix, suffix, ROWGROUP_SUFFIX) != 0) dl->shards.push_back(shard_open(path));
    if (dl->shards.empty()) fail("no %s files match '%s' (only row-group files)", what, pattern.c_str());
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
    dl->positioned = false;
    dl->shard_idx = 0;
    dl->group = 0;
    dl->doc_in_group = 0;
    dl->pos = 0;
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

// The documents of the stream's shard before its position (the state records the position as both)
static inline uint64_t dataloader_doc_in_shard(const DataLoader* dl) {
    if (!dl->positioned) return 0;
    uint64_t docs = dl->doc_in_group;
    for (size_t g = 0; g < dl->order[dl->group]; g++) docs += dl->shards[dl->shard_idx].groups[g].documents;
    return docs;
}

// The state as integers, for checkpoints: position (shard, token, documents before it in the shard), epoch, then
// (shard, start, length) per buffered document.
static inline std::vector<int64_t> dataloader_state(const DataLoader* dl) {
    std::vector<int64_t> s = {dl->shard_idx, (int64_t)dl->pos, (int64_t)dataloader_doc_in_shard(dl), dl->epoch, (int64_t)dl->buffer.size()};
    for (const Document& d : dl->buffer) {
        s.push_back(d.shard);
        s.push_back((int64_t)d.start);
        s.push_back(d.length);
    }
    return s;
}

// Puts the stream at document `doc` of shard `shard` (at token `pos`) in epoch `epoch`, checked against the
// shard's row groups (`bad` refuses): when its row group is this rank's, there, else at the start of this rank's
// next row group (a state written by another number of ranks, or when the row groups were not known).
template <typename Bad>
static inline void dataloader_set_position(DataLoader* dl, int shard, uint64_t pos, uint64_t doc, int64_t epoch, Bad bad) {
    Shard& s = dl->shards[shard];
    shard_row_groups(&s, dl->chunk_docs, dl->bos_id);
    size_t g = 0;
    uint64_t before = 0;
    while (g < s.groups.size() && doc >= before + s.groups[g].documents) before += s.groups[g++].documents;
    if (g == s.groups.size()) bad("document count out of range");
    const uint64_t in_group = doc - before;
    if (pos < s.groups[g].start || pos >= row_group_end(s, g)) bad("position outside its row group");
    uint64_t bos_before = 0;
    for (uint64_t t = s.groups[g].start; t < pos; t++) bos_before += s.token(t) == (uint32_t)dl->bos_id;
    if (bos_before != in_group) bad("position and document count disagree");
    dl->shard_idx = shard;
    dl->epoch = epoch;
    const std::vector<uint32_t>& order = dataloader_order(dl);
    const size_t k = (size_t)(std::find(order.begin(), order.end(), (uint32_t)g) - order.begin());  // visited k-th
    if ((int)(k % dl->world) == dl->rank) {
        dl->group = k;
        dl->doc_in_group = in_group;
        dl->pos = pos;
        dl->positioned = true;
    } else {
        dataloader_seek_group(dl, k + (dl->rank + dl->world - k % dl->world) % dl->world);
    }
}

// Restores a state from a checkpoint (`source` names it), checking it against the shards: every index
// and span in range (without overflow), the stream position at a document's BOS and in the row group its
// document count gives, and every buffered document exactly a document of its shard (BOS first, no BOS inside,
// ids in the vocabulary, ending at the next BOS or the shard's end), as dataloader_read_document would have
// produced it.
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
    dataloader_set_position(dl, (int)s[0], (uint64_t)s[1], (uint64_t)s[2], s[3], bad);
    dl->buffer = buffer;
}

// Restores this rank's state from the states of a run on another number of ranks (`states[r]`: old rank
// r's, each checked as dataloader_restore does), so that a checkpoint resumes on any number of ranks. No
// run on the new ranks could have reached this point, so this is a choice (dev/docs/data.md#ranks-and-epochs):
// every new rank goes on from the furthest stream position of the old ones (in that position's row group if it
// is the new rank's, else from its next row group after it), and the documents the old ranks had buffered are
// dealt out in turn (old rank 0's buffer in order, then rank 1's, ...: document i to new rank i mod the new
// ranks). No document is read twice; the row groups before that position that their old rank had not reached
// yet are skipped (fewer than the old ranks' count), and the rest of the furthest position's row group when it
// is not the new rank's.
static inline void dataloader_restore_resharded(DataLoader* dl, const std::vector<std::vector<int64_t>>& states, const char* source) {
    std::vector<Document> dealt;
    int shard = 0;
    uint64_t pos = 0, doc = 0;
    int64_t epoch = 0;
    for (size_t r = 0; r < states.size(); r++) {
        DataLoader old = *dl;  // shares the mapped shards; its rank, position and buffer are the old rank's
        old.rank = (int)r;
        old.world = (int)states.size();
        old.buffer.clear();
        dataloader_restore(&old, states[r], source);
        const bool further = old.epoch != epoch ? old.epoch > epoch : old.shard_idx != shard ? old.shard_idx > shard : old.pos > pos;
        if (r == 0 || further) {
            shard = old.shard_idx;
            pos = old.pos;
            doc = dataloader_doc_in_shard(&old);
            epoch = old.epoch;
        }
        dealt.insert(dealt.end(), old.buffer.begin(), old.buffer.end());
    }
    dataloader_set_position(dl, shard, pos, doc, epoch, [&](const char* what) {
        fail("%s: the data-loader state does not match these shards (%s)", source, what);
    });
    dl->buffer.clear();
    for (size_t i = dl->rank; i < dealt.size(); i += dl->world) dl->buffer.push_back(dealt[i]);
}
