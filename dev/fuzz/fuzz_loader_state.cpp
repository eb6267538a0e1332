// fuzz_loader_state: the data-loader state a checkpoint carries (dataloader.h: dataloader_restore). The
// input is the state, little-endian int64 values (trailing bytes ignored), restored against two fixed
// shards made here (a uint16 and a uint32 one, documents of 1 to 40 tokens, some longer than a row). An
// accepted state must be usable: batches are packed from it (ASan sees any span past a shard), and its
// state round trip must give the same batches.
//
// XSA_FUZZ_WRITE_SEEDS=DIR ./fuzz_loader_state writes seed states (a real loader's after 0, 1, 2, 5 and
// 20 batches) to DIR and exits.
#include "dev/fuzz/fuzz_util.h"
#include "dataloader.h"

static const int VOCAB = 300, BOS = 256;
static const char* SOURCE = "ckpt_000007.safetensors";  // what the rejections must name

static std::vector<Shard> g_shards;

static std::vector<uint8_t> make_shard(int version, uint64_t seed, int docs) {
    Rng rng{seed};
    std::vector<uint32_t> tokens;
    for (int d = 0; d < docs; d++) {
        tokens.push_back(BOS);
        const int len = d % 7 == 3 ? 40 : (int)(rng_next_u64(&rng) % 12);
        for (int i = 0; i < len; i++) tokens.push_back((uint32_t)(rng_next_u64(&rng) % BOS));
    }
    int32_t header[256] = {SHARD_MAGIC, version, (int32_t)tokens.size(), 0};
    std::vector<uint8_t> out((uint8_t*)header, (uint8_t*)header + sizeof header);
    for (uint32_t t : tokens) {
        const uint8_t b[4] = {(uint8_t)t, (uint8_t)(t >> 8), (uint8_t)(t >> 16), (uint8_t)(t >> 24)};
        out.insert(out.end(), b, b + (version == 1 ? 2 : 4));
    }
    return out;
}

static DataLoader make_loader() {
    DataLoader dl;
    dl.shards = g_shards;
    dl.vocab_size = VOCAB;
    dl.bos_id = BOS;
    dl.B = 2;
    dl.T = 15;
    dl.buffer_target = 6;
    dl.chunk_docs = 4;
    dl.inputs.resize(dl.B * dl.T);
    dl.targets.resize(dl.B * dl.T);
    dl.row.resize(dl.T + 1);
    return dl;
}

extern "C" int LLVMFuzzerInitialize(int*, char***) {
    static FuzzFile files[2] = {fuzz_file("shard_a"), fuzz_file("shard_b")};
    for (int i = 0; i < 2; i++) {
        std::vector<uint8_t> bytes = make_shard(1 + i, 11 + i, i == 0 ? 60 : 25);
        g_shards.push_back(shard_open(fuzz_write(files[i], bytes.data(), bytes.size())));
    }
    if (const char* dir = getenv("XSA_FUZZ_WRITE_SEEDS")) {
        DataLoader dl = make_loader();
        int done = 0;
        for (int batches : {0, 1, 2, 5, 20}) {
            while (done < batches) {
                dataloader_next_batch(&dl);
                done++;
            }
            std::vector<int64_t> s = dataloader_state(&dl);
            fuzz_write_seed(dir, "state_after_" + std::to_string(batches), s.data(), s.size() * sizeof(int64_t));
        }
        exit(0);
    }
    return 0;
}

// The state as given, and folded into the shards' ranges (shard index modulo 3, positions and lengths
// modulo a little more than the first shard's length), so that most inputs also reach the checks of
// a span's end, BOS and contents rather than stopping at the first out-of-range value.
static void restore_and_use(const std::vector<int64_t>& state) {
    DataLoader dl = make_loader();
    if (!fuzz_parse(SOURCE, [&] { dataloader_restore(&dl, state, SOURCE); })) return;
    DataLoader again = make_loader();
    dataloader_restore(&again, dataloader_state(&dl), "the round trip");  // must not fail
    for (int i = 0; i < 2; i++) {
        dataloader_next_batch(&dl);
        dataloader_next_batch(&again);
        if (dl.inputs != again.inputs || dl.targets != again.targets) abort();
    }
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    std::vector<int64_t> state(size / 8);
    if (!state.empty()) memcpy(state.data(), data, state.size() * 8);
    restore_and_use(state);
    const int64_t span = (int64_t)g_shards[0].ntokens + 3;
    for (size_t i = 0; i < state.size(); i++) {
        const int64_t m = i == 0 || (i >= 5 && (i - 5) % 3 == 0) ? 3 : i == 4 ? INT64_MAX : span;  // shard indices, count, positions
        if (m != INT64_MAX) state[i] = ((state[i] % m) + m) % m;
    }
    restore_and_use(state);
    return 0;
}
