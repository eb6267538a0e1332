// fuzz_shard: a token shard (dataloader.h: shard_open, then the loader reading and packing it).
// The input is the whole shard file. An accepted shard is read as training data would be: batches packed
// on one rank and as rank 1 of 2, and the loader state round trip (what a checkpoint saves must restore,
// and give the same next batch). Vocabulary 4096 with BOS 4087, as the embedded corpus's tokenizer.
#include "dev/fuzz/fuzz_util.h"
#include "dataloader.h"

static const int VOCAB = 4096, BOS = 4087;

static void read_batches(const Shard& shard, int rank, int world) {
    DataLoader dl;
    dl.shards.push_back(shard);
    dl.vocab_size = VOCAB;
    dl.bos_id = BOS;
    dl.B = 2;
    dl.T = 15;
    dl.rank = rank;
    dl.world = world;
    dl.buffer_target = 4;  // small, so that a short shard wraps into new epochs quickly
    dl.chunk_docs = 2;
    dl.inputs.resize(dl.B * dl.T);
    dl.targets.resize(dl.B * dl.T);
    dl.row.resize(dl.T + 1);
    for (int i = 0; i < 3; i++) dataloader_next_batch(&dl);
    // the state round trip: a fresh loader restored from the state continues identically
    const std::vector<int64_t> state = dataloader_state(&dl);
    DataLoader again = dl;
    dataloader_reset(&again);
    dataloader_restore(&again, state, "state");
    dataloader_next_batch(&dl);
    dataloader_next_batch(&again);
    if (dl.inputs != again.inputs || dl.targets != again.targets || dataloader_state(&dl) != dataloader_state(&again)) {
        fprintf(stderr, "finding: a restored loader state gives another batch\n");
        abort();
    }
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static FuzzFile file = fuzz_file("shard");
    const std::string& path = fuzz_write(file, data, size);
    Shard shard;
    if (!fuzz_parse(path, [&] { shard = shard_open(path); })) return 0;
    // reading names the shard too (a token past the vocabulary, no BOS where a document starts); the
    // round trip's rejections would name "state", and there must be none: only the shard's own errors
    fuzz_parse(path, [&] { read_batches(shard, 0, 1); });
    fuzz_parse(path, [&] { read_batches(shard, 1, 2); });
    shard_close(&shard);
    return 0;
}
