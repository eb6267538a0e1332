// fuzz_conversations: an SFT conversation file (chat/sft_loader.h: conversation_file_open, then the SftLoader
// packing it). The input is the whole file, opened for the embedded corpus's tokenizer (vocabulary 4096,
// BOS 4087). An accepted file is read as SFT reads it: batches packed on one rank and as rank 1 of 2 (every
// conversation fetched is checked then, so the errors name the file), and the state round trip (what a
// checkpoint saves must restore, and give the same next batch).
#include "dev/fuzz/fuzz_util.h"
#include "chat/sft_loader.h"

static const int VOCAB = 4096, BOS = 4087;

static void read_batches(const ConversationFile& file, int rank, int world) {
    SftLoader dl;
    dl.file = file;
    dl.B = 2;
    dl.T = 15;
    dl.rank = rank;
    dl.world = world;
    dl.buffer_target = 4;  // small, so that a short file wraps into new epochs quickly
    dl.inputs.resize(dl.B * dl.T);
    dl.targets.resize(dl.B * dl.T);
    dl.row.resize(dl.T + 1);
    dl.row_mask.resize(dl.T + 1);
    dataloader_reset(&dl);
    for (int i = 0; i < 3; i++) dataloader_next_batch(&dl);
    for (size_t n = 0; n < dl.targets.size(); n++)
        if (dl.inputs[n] < 0 || dl.inputs[n] >= VOCAB || dl.targets[n] < IGNORE_INDEX || dl.targets[n] >= VOCAB) abort();
    const std::vector<int64_t> state = dataloader_state(&dl);
    SftLoader again = dl;
    dataloader_reset(&again);
    dataloader_restore(&again, state, "state");
    dataloader_next_batch(&dl);
    dataloader_next_batch(&again);
    if (dl.inputs != again.inputs || dl.targets != again.targets || dataloader_state(&dl) != dataloader_state(&again)) {
        fprintf(stderr, "finding: a restored SFT loader state gives another batch\n");
        abort();
    }
    g_fuzz_sink += (uint64_t)dl.consumed + (uint64_t)dl.last_batch;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static FuzzFile file = fuzz_file("conversations");
    const std::string& path = fuzz_write(file, data, size);
    ConversationFile conversations;
    if (!fuzz_parse(path, [&] { conversation_file_open(&conversations, path, VOCAB, BOS); })) return 0;
    fuzz_parse(path, [&] { read_batches(conversations, 0, 1); });
    fuzz_parse(path, [&] { read_batches(conversations, 1, 2); });
    mapped_file_close(&conversations);
    return 0;
}
