/*
dev/test/test_infra.cu: the C++ tests of the trainer's infrastructure, on the CPU backend: the --xsa-layers
parser, phase timing, the safetensors round trip of a model's weights, the data loader (best-fit packing
on a hand-made stream, its state restored, 2 ranks' states resumed on 3, a shard truncated during a run),
bits per byte by hand, SFT packing of conversations, resume (bit-identical to an uninterrupted run),
`--ranks 2` against the same step in one process, CORE (rendering, centering, scores against the PyTorch
scorer, empty answer spans scored as nanochat) and ChatCORE's answer checkers, HumanEval's test process and its
boundary, and the calculator tool. Prints one line per check and ends with `N passed, N failed`; exits non-zero
on any failure. The numerics (the model against the PyTorch references, optimizers, kernels, the CUDA suite) are
test_xsa.cu's; the binaries end to end are tested by dev/test/test_e2e.py and the other dev/test/test_*.py.

CPU only: built with g++ (-I. for train_gpt.cu), not nvcc. It runs from the repository root: it reads
dev/data/ and dev/reference/data/, and test_ranks_step runs ./train_gpt_cpu ($XSA_BIN_DIR/train_gpt_cpu where
that is set, as make test-sanitize does).

Build and run: make test_infra_cpu train_gpt_cpu && ./test_infra_cpu (make test runs every suite:
dev/test/run_tests.py)
*/
#define TRAIN_GPT_NO_MAIN  // use train_gpt.cu as a library: everything but main() (built with -I. from the root)
#include "train_gpt.cu"
// the chat half (chat/): the SFT loader, ChatCORE, the calculator tool and the encoder have their tests here too
#include "chat/sft.h"
#include "chat/chatcore_evaluate.h"
#include "check.h"  // check(), the counters, tmp_path(), tiny_config(), run_program()

// ----------------------------------------------------------------------------------------------------
// 1. Layer selection (--xsa-layers)

static void test_layer_spec() {
    auto same = [](const std::vector<bool>& got, std::vector<int> want_on) {
        std::vector<bool> want(got.size(), false);
        for (int l : want_on) want[l] = true;
        return got == want;
    };
    check(same(parse_layer_spec("all", 4), {0, 1, 2, 3}) && same(parse_layer_spec("none", 4), {}) &&
              same(parse_layer_spec("6-11", 12), {6, 7, 8, 9, 10, 11}) && same(parse_layer_spec("last:3", 12), {9, 10, 11}) &&
              same(parse_layer_spec("0,2,5-6,last:1", 12), {0, 2, 5, 6, 11}),
          "--xsa-layers: all, none, 6-11, last:3 and a mixed list select the right layers");
}

// ----------------------------------------------------------------------------------------------------
// 2. Phase timing (the benchmark's breakdown): one micro-step of a 3-layer model gives the 12 phases of
// the model, each timed, each layer's time added to its phase's, and together the whole micro-step

static void test_phase_timing() {
    GPTConfig c = tiny_config(100, 3, 32, 2, 16, 32, 8);
    c.xsa_alpha = 1.0f;
    c.xsa_layer.assign(3, true);
    GPT model;
    gpt_build(&model, c);
    gpt_init_weights(&model, 5);
    std::vector<int> tokens(4 * 32 + 1, 7);
    gpt_train_micro_step(&model, tokens.data(), tokens.data() + 1, 4, 32, 1.0f);  // allocations happen here, untimed
    g_backend.phases = PhaseTimer();
    g_backend.phases.on = true;
    const double t0 = wall_ms();
    gpt_train_micro_step(&model, tokens.data(), tokens.data() + 1, 4, 32, 1.0f);
    backend_phases_collect();
    const double wall = wall_ms() - t0;
    g_backend.phases.on = false;
    double total = 0.0;
    bool positive = true;
    for (const auto& t : g_backend.phases.totals) total += t.second, positive &= t.second > 0.0;
    const size_t phases = g_backend.phases.totals.size();
    check(phases == 12 && positive && total <= wall && total >= 0.5 * wall,
          "phase timing: %zu phases (12 expected), each > 0: %s, together %.2f ms of the micro-step's %.2f ms", phases,
          positive ? "yes" : "NO", total, wall);
    g_backend.phases = PhaseTimer();
    gpt_free(&model);
}

// ----------------------------------------------------------------------------------------------------
// 3. The safetensors round trip: a model's configuration and weights written and read back (the
// initialisation of the same model is checked by test_xsa.cu)

static void test_weights_roundtrip() {
    GPT model;
    const GPTConfig c = build_init_model(&model);
    const std::string path = tmp_path("roundtrip.safetensors");
    gpt_save_weights(&model, path);
    SafetensorsFile file = safetensors_read(path);
    GPTConfig loaded_config = config_from_metadata(file);
    GPT loaded;
    gpt_build(&loaded, loaded_config);
    gpt_load_weights(&loaded, file);
    bool same = config_to_metadata(loaded_config) == config_to_metadata(c) && loaded.num_params == model.num_params &&
                memcmp(loaded.params, model.params, model.num_params * sizeof(float)) == 0;
    check(same, "safetensors round trip: configuration and all %zu parameters come back bit-identical", model.num_params);
    gpt_free(&model);
    gpt_free(&loaded);
}

// ----------------------------------------------------------------------------------------------------
// 4. Data: packing on a hand-made stream, the loader's saved state restored (2 ranks' states on 3 ranks too),
// a shard truncated during a run, bits per byte by hand

static void write_shard(const std::string& path, const std::vector<uint32_t>& tokens, int version) {
    FILE* f = fopen_or_fail(path.c_str(), "wb");
    int32_t header[256] = {0};
    header[0] = SHARD_MAGIC;
    header[1] = version;
    header[2] = (int32_t)tokens.size();
    fwrite(header, sizeof header, 1, f);
    for (uint32_t t : tokens) {
        if (version == 1) { uint16_t u = (uint16_t)t; fwrite(&u, 2, 1, f); }
        else fwrite(&t, 4, 1, f);
    }
    fclose(f);
}

// Seven documents (BOS = 0) of lengths 4, 3, 6, 2, 10, 4, 2; rows of T+1 = 8 tokens, a buffer of 3
// documents refilled 2 at a time. The expected rows below were worked out by hand from the packing rule of dev/docs/data.md#best-fit-packing.
static void test_packing() {
    const std::string path = tmp_path("packing.bin");
    std::vector<uint32_t> stream = {0, 1, 2, 3, 0, 4, 5, 0, 6, 7, 8, 9, 10, 0, 11, 0, 12, 13, 14, 15, 16, 17, 18, 19, 20, 0, 21, 22, 23, 0, 24};
    for (int version : {1, 2}) {
        write_shard(path, stream, version);
        DataLoader dl;
        dataloader_init(&dl, path, "test", 50, 0, 2, 7, 0, 1);
        dl.buffer_target = 3;
        dl.chunk_docs = 2;
        const std::vector<std::vector<int>> expected = {
            {0, 6, 7, 8, 9, 10, 0, 11},  // D2 (largest that fits), then D3 fills the last 2
            {0, 1, 2, 3, 0, 21, 22, 23}, // D0 (first of the two 4s), then D5
            {0, 4, 5, 0, 1, 2, 3, 0},    // D1, epoch 2's D0, then nothing fits 1 slot: the shortest (D6) cropped to its BOS
            {0, 6, 7, 8, 9, 10, 0, 11},  // epoch 2's D2 and D3; D4 (10 tokens) never fits and waits in the buffer
        };
        std::vector<std::vector<int>> rows;
        std::vector<int64_t> state_after_first;
        std::vector<int> second_batch_inputs;
        for (int batch = 0; batch < 2; batch++) {
            dataloader_next_batch(&dl);
            if (batch == 0) state_after_first = dataloader_state(&dl);
            else second_batch_inputs = dl.inputs;
            for (int b = 0; b < 2; b++) {
                std::vector<int> row(dl.inputs.begin() + b * 7, dl.inputs.begin() + (b + 1) * 7);
                row.push_back(dl.targets[b * 7 + 6]);
                bool shifted = std::equal(dl.targets.begin() + b * 7, dl.targets.begin() + b * 7 + 6, dl.inputs.begin() + b * 7 + 1);
                if (!shifted) row.push_back(-1);  // targets must be inputs shifted by one
                rows.push_back(row);
            }
        }
        check(rows == expected, "packing (uint%d shard): 4 rows of a hand-made stream exactly as worked out by hand", version == 1 ? 16 : 32);
        // a fresh loader restored from the saved state produces the same next batch
        DataLoader again;
        dataloader_init(&again, path, "test", 50, 0, 2, 7, 0, 1);
        again.buffer_target = 3;
        again.chunk_docs = 2;
        dataloader_restore(&again, state_after_first, "test");
        dataloader_next_batch(&again);
        check(again.inputs == second_batch_inputs, "data loader (uint%d shard): restoring the saved state reproduces the next batch exactly",
              version == 1 ? 16 : 32);
        dataloader_free(&dl);
        dataloader_free(&again);
    }
}

// --data-seed (dev/docs/data.md#ranks-and-epochs): 2 shards of 40 documents (every token of document d is d + 1,
// the second shard's ids offset by 40), row groups of 2, 3 ranks. Over one epoch the ranks together read every
// document exactly once, each rank whole row groups (2k, 2k + 1 together); the order differs from seed 0's and
// from another seed's and is the same for the same seed; a loader restored from a state saved mid-shard reads on
// exactly as the one that saved it.
static void test_data_seed() {
    const std::string paths[2] = {tmp_path("seed_a.bin"), tmp_path("seed_b.bin")};
    for (int f = 0; f < 2; f++) {
        std::vector<uint32_t> stream;
        for (uint32_t d = 0; d < 40; d++) {
            stream.push_back(0);
            for (uint32_t t = 0; t < 1 + d % 3; t++) stream.push_back(40 * f + d + 1);
        }
        write_shard(paths[f], stream, 2);
    }
    auto loader = [&](int rank, uint64_t seed) {
        DataLoader dl;
        dataloader_init(&dl, tmp_path("seed_*.bin"), "test", 100, 0, 1, 7, rank, 3);
        dl.chunk_docs = 2;
        dl.data_seed = seed;
        return dl;
    };
    auto doc = [](const DataLoader& dl, const Document& d) { return (int)dl.shards[d.shard].token(d.start + 1) - 1; };
    // the documents rank r reads in epoch 1, in order (the stream moves to epoch 2 right after its last row group)
    auto epoch_docs = [&](int rank, uint64_t seed) {
        DataLoader dl = loader(rank, seed);
        while (dl.epoch == 1) dataloader_refill(&dl);
        std::vector<int> docs;
        for (const Document& d : dl.buffer) docs.push_back(doc(dl, d));
        dataloader_free(&dl);
        return docs;
    };
    bool once = true, whole = true;
    std::vector<int> seen(80, 0);
    std::vector<std::vector<int>> by_rank;
    for (int r = 0; r < 3; r++) {
        const std::vector<int> mine = epoch_docs(r, 7);
        for (size_t i = 0; i < mine.size(); i += 2) whole = whole && i + 1 < mine.size() && mine[i] % 2 == 0 && mine[i + 1] == mine[i] + 1;
        for (int d : mine) seen[d]++;
        by_rank.push_back(mine);
    }
    for (int c : seen) once = once && c == 1;
    const bool shuffled = by_rank[0] != epoch_docs(0, 0) && epoch_docs(0, 7) != epoch_docs(0, 8), same = epoch_docs(1, 7) == epoch_docs(1, 7);
    // save mid-shard, restore into a fresh loader, both read on
    DataLoader a = loader(2, 7);
    for (int i = 0; i < 5; i++) dataloader_refill(&a);
    const std::vector<int64_t> state = dataloader_state(&a);
    DataLoader b = loader(2, 7);
    dataloader_restore(&b, state, "test");
    bool resumed = true;
    for (int i = 0; i < 30; i++) {
        a.buffer.clear();
        b.buffer.clear();
        dataloader_refill(&a);
        dataloader_refill(&b);
        resumed = resumed && a.buffer.size() == b.buffer.size() && doc(a, a.buffer[0]) == doc(b, b.buffer[0]) && a.epoch == b.epoch;
    }
    dataloader_free(&a);
    dataloader_free(&b);
    check(once && whole && shuffled && same && resumed,
          "--data-seed: the 3 ranks read every document of an epoch once (%s), in whole row groups (%s), in an order other than seed 0's "
          "and seed 8's (%s), the same for the same seed (%s); a restored state reads on identically (%s)",
          once ? "yes" : "NO", whole ? "yes" : "NO", shuffled ? "yes" : "NO", same ? "yes" : "NO", resumed ? "yes" : "NO");
}

// A checkpoint of 2 ranks resumed on 3 (dataloader_restore_resharded, dev/docs/data.md#ranks-and-epochs):
// 40 documents of 2-5 tokens, chunks of 2, buffers of 3; the old ranks pack 3 batches each. Each new rank
// must start at the furthest old position, the new buffers must be the old ones dealt out (document i of
// old rank 0's then rank 1's buffer to new rank i mod 3), and each new rank must read next only chunks at
// or past that position that are its own under the new stride (from the furthest position itself when its chunk
// is the rank's own).
static void test_resharded_restore() {
    const std::string path = tmp_path("reshard.bin");
    std::vector<uint32_t> stream;
    for (uint32_t d = 0; d < 40; d++) {
        stream.push_back(0);
        for (uint32_t t = 0; t < 1 + d % 4; t++) stream.push_back(d + 1);
    }
    write_shard(path, stream, 2);
    auto loader = [&](int rank, int world) {
        DataLoader dl;
        dataloader_init(&dl, path, "test", 64, 0, 1, 7, rank, world);
        dl.buffer_target = 3;
        dl.chunk_docs = 2;
        return dl;
    };
    std::vector<std::vector<int64_t>> states;
    std::vector<Document> old_buffers;
    uint64_t furthest = 0;
    for (int r = 0; r < 2; r++) {
        DataLoader dl = loader(r, 2);
        for (int b = 0; b < 3; b++) dataloader_next_batch(&dl);
        states.push_back(dataloader_state(&dl));
        old_buffers.insert(old_buffers.end(), dl.buffer.begin(), dl.buffer.end());
        furthest = std::max(furthest, dl.pos);
        dataloader_free(&dl);
    }
    bool dealt = true, position = true, stride = true;
    for (int r = 0; r < 3; r++) {
        DataLoader dl = loader(r, 3);
        dataloader_restore_resharded(&dl, states, "test");
        std::vector<Document> want;
        for (size_t i = r; i < old_buffers.size(); i += 3) want.push_back(old_buffers[i]);
        for (size_t i = 0; i < want.size() || i < dl.buffer.size(); i++)
            dealt = dealt && i < want.size() && i < dl.buffer.size() && want[i].start == dl.buffer[i].start && want[i].length == dl.buffer[i].length;
        // the furthest position's chunk (row group) if it is this rank's, else the start of its next own chunk
        const uint32_t furthest_doc = dl.shards[0].token(furthest + 1) - 1;
        uint32_t chunk = furthest_doc / 2;
        while (chunk % 3 != (uint32_t)r) chunk++;
        const uint32_t doc_at = dl.shards[0].token(dl.pos + 1) - 1;
        position = position && dl.epoch == 1 && (chunk == furthest_doc / 2 ? dl.pos == furthest : doc_at == 2 * chunk);
        const size_t kept = dl.buffer.size();
        dataloader_refill(&dl);
        for (size_t i = kept; i < dl.buffer.size(); i++) {
            const uint32_t doc = dl.shards[0].token(dl.buffer[i].start + 1) - 1;  // every token of document d is d + 1
            stride = stride && dl.buffer[i].start >= furthest && (doc / 2) % 3 == (uint32_t)r;
        }
        stride = stride && dl.buffer.size() > kept;
        dataloader_free(&dl);
    }
    check(!old_buffers.empty() && dealt && position && stride,
          "2 ranks' loader states resumed on 3: each starts at the furthest old position or its own next chunk (%s), gets the old buffers dealt in turn (%s), "
          "and reads on only its own chunks under the new stride (%s)", position ? "yes" : "NO", dealt ? "yes" : "NO", stride ? "yes" : "NO");
}

// A shard truncated while a run reads it ends in one error line naming it and exit code 1, not SIGBUS:
// when the check before a read sees the change (shard_check), and when the truncation falls between the
// check and the read (the SIGBUS handler of dataloader.h). Each case runs in a forked child.
static void test_shard_truncated_during_run() {
    const std::string path = tmp_path("truncated.bin");
    std::vector<uint32_t> stream;
    for (int doc = 0; doc < 3000; doc++) {
        stream.push_back(0);
        for (int i = 0; i < 1 + doc % 9; i++) stream.push_back(1 + (uint32_t)(doc + i) % 40);
    }
    for (int between : {0, 1}) {
        write_shard(path, stream, 2);
        int fds[2];
        if (pipe(fds) != 0) fail("pipe: %s", strerror(errno));
        fflush(stdout);
        const pid_t pid = fork();
        if (pid == 0) {
            dup2(fds[1], 2);
            close(fds[0]);
            DataLoader dl;
            dataloader_init(&dl, path, "test", 50, 0, 2, 7, 0, 1);
            dataloader_next_batch(&dl);
            if (truncate(path.c_str(), 2048) != 0) _exit(3);
            if (between) {  // a read of a page past the new end, with no check before it
                volatile uint32_t t = dl.shards[0].token(dl.shards[0].ntokens - 1);
                (void)t;
            }
            for (int i = 0; i < 1000; i++) dataloader_next_batch(&dl);
            _exit(0);
        }
        close(fds[1]);
        std::string err;
        char buf[512];
        ssize_t n;
        while ((n = read(fds[0], buf, sizeof buf)) > 0) err.append(buf, (size_t)n);
        close(fds[0]);
        int status = 0;
        waitpid(pid, &status, 0);
        const char* want = between ? "was truncated while this run read it" : "changed while this run reads it";
        const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 1 && err.rfind("error: ", 0) == 0 && err.find('\n') == err.size() - 1 &&
                        err.find(want) != std::string::npos && err.find(path) != std::string::npos;
        const std::string got = WIFSIGNALED(status) ? "killed by signal " + std::to_string(WTERMSIG(status))
                                                    : "exit " + std::to_string(WEXITSTATUS(status)) + ": " + err.substr(0, err.find('\n'));
        check(ok, "a shard truncated during a run (%s): exit 1 and one line 'error: ... %s' naming it (%s)",
              between ? "between the check and a read: SIGBUS handler" : "seen by the check before a read", want, got.c_str());
    }
}

static void test_bpb_by_hand() {
    // targets 5 (3 bytes), 1 = BOS (special, 0 bytes), 7 (1 byte), 9 (2 bytes); losses in nats
    std::vector<int> token_bytes(10, 1);
    token_bytes[1] = 0;
    token_bytes[5] = 3;
    token_bytes[9] = 2;
    const float losses[4] = {1.0f, 2.0f, 0.5f, 3.0f};
    const int targets[4] = {5, 1, 7, 9};
    double nats = 0.0, bytes = 0.0;
    bpb_accumulate(&nats, &bytes, losses, targets, 4, token_bytes);
    double bpb = nats / (log(2.0) * bytes);
    // by hand: (1 + 0.5 + 3) nats / (ln 2 x 6 bytes) = 0.75 / 0.693147 = 1.082021
    check(fabs(bpb - 1.0820212806) < 1e-9 && nats == 4.5 && bytes == 6.0, "bits per byte: %.10f (by hand 1.0820212806), BOS target excluded", bpb);
    // an ignored target (SFT's mask) counts in neither sum, whatever its loss
    const float losses_sft[5] = {1.0f, 2.0f, 0.5f, 3.0f, 7.0f};
    const int targets_sft[5] = {5, 1, IGNORE_INDEX, 9, IGNORE_INDEX};
    nats = bytes = 0.0;
    bpb_accumulate(&nats, &bytes, losses_sft, targets_sft, 5, token_bytes);
    check(nats == 4.0 && bytes == 5.0, "bits per byte: ignored targets excluded (%.1f nats, %.1f bytes; by hand 4.0 and 5.0)", nats, bytes);
}

// ----------------------------------------------------------------------------------------------------
// 5. SFT: nanochat's best-fit packing of conversations with padding, worked out by hand

// A conversation file (chat/sft_loader.h) of conversations c = 0, 1, ..: BOS (0) then lengths[c] - 1 tokens
// 10 c + 1, 10 c + 2, .., with mask 1 on the even positions
static void write_conversations(const std::string& path, const std::vector<int>& lengths, int vocab) {
    std::vector<uint64_t> offsets = {0};
    std::vector<uint32_t> tokens;
    std::vector<uint8_t> mask;
    for (size_t c = 0; c < lengths.size(); c++) {
        for (int i = 0; i < lengths[c]; i++) {
            tokens.push_back(i == 0 ? 0 : (uint32_t)(10 * c + i));
            mask.push_back(i > 0 && i % 2 == 0);
        }
        offsets.push_back(tokens.size());
    }
    int32_t header[256] = {CONVERSATION_MAGIC, 1, (int32_t)lengths.size(), 0, (int32_t)tokens.size(), 0, vocab, 0, 2048};
    FILE* f = fopen_or_fail(path.c_str(), "wb");
    fwrite(header, sizeof header, 1, f);
    fwrite(offsets.data(), sizeof(uint64_t), offsets.size(), f);
    fwrite(tokens.data(), sizeof(uint32_t), tokens.size(), f);
    fwrite(mask.data(), 1, mask.size(), f);
    fclose(f);
}

static void test_sft_packing() {
    const std::string path = tmp_path("conversations.bin");
    write_conversations(path, {5, 3, 7, 2, 9, 4}, 100);  // c0 .. c5
    SftLoader dl;
    sft_loader_init(&dl, path, 100, 0, 2, 8, 0, 1, -1);  // rows of 2 x (8 + 1)
    dl.buffer_target = 3;
    // by hand (buffer of 3, refilled one at a time; the longest that fits; none fits: pad):
    //   batch 1, row 0: buffer c0 c1 c2 -> c2 (7); + c3 -> c3 (2) fills the row
    //            row 1: buffer c0 c1 c4 -> c4 (9)                      (consumed 3 of 6: progress 0.5)
    //   batch 2, row 0: + c5 (the fetch wraps: epoch 2) -> c0 (5); + c0 again -> c5 (4)
    //            row 1: + c1 -> c0 (5); + c2 -> c1 (3, the first of the two); + c3 -> nothing fits 1: a BOS, masked
    //   consumed 7 >= 6: the epoch's last batch
    const int c0[] = {0, 1, 2, 3, 4}, c1[] = {0, 11, 12}, c2[] = {0, 21, 22, 23, 24, 25, 26}, c3[] = {0, 31}, c4[] = {0, 41, 42, 43, 44, 45, 46, 47, 48},
              c5[] = {0, 51, 52, 53};
    auto row_of = [](std::initializer_list<std::pair<const int*, int>> parts) {
        std::vector<int> row;
        for (auto [p, n] : parts) row.insert(row.end(), p, p + n);
        return row;
    };
    const std::vector<std::vector<int>> rows = {row_of({{c2, 7}, {c3, 2}}), row_of({{c4, 9}}), row_of({{c0, 5}, {c5, 4}}), row_of({{c0, 5}, {c1, 3}, {c0, 1}})};
    // targets: the next token where its mask is 1 (even positions inside a conversation), else ignored
    auto masked = [](int token) { return token != 0 && (token % 10) % 2 == 0; };
    std::vector<int64_t> state_after_first;
    std::vector<int> second_inputs, second_targets;
    bool all_equal = true, flags_right = true;
    for (int batch = 0; batch < 2; batch++) {
        dataloader_next_batch(&dl);
        for (int r = 0; r < 2; r++) {
            const std::vector<int>& row = rows[batch * 2 + r];
            for (int t = 0; t < 8; t++) {
                const int want_target = t + 1 == 8 && batch == 1 && r == 1 ? IGNORE_INDEX : masked(row[t + 1]) ? row[t + 1] : IGNORE_INDEX;
                all_equal &= dl.inputs[r * 8 + t] == row[t] && dl.targets[r * 8 + t] == want_target;
            }
        }
        if (batch == 0) {
            flags_right &= !dl.last_batch && dl.progress == 0.5 && dl.epoch == 1;
            state_after_first = dataloader_state(&dl);
        } else {
            flags_right &= dl.last_batch && dl.epoch == 2 && dl.consumed == 7;
            second_inputs = dl.inputs;
            second_targets = dl.targets;
        }
    }
    check(all_equal && flags_right, "SFT packing: 4 rows of 6 hand-made conversations exactly as worked out by hand (inputs, masked "
          "targets, padding), the epoch's end after batch 2");
    SftLoader fresh = dl;
    dataloader_reset(&fresh);
    check(sft_epoch_steps(&fresh, 1) == 1 && sft_epoch_steps(&fresh, 2) == 1,
          "SFT epoch: the last conversation taken by batch 2 -> 1 step of 1 or 2 micro-batches (nanochat draws one batch ahead)");
    SftLoader again;
    sft_loader_init(&again, path, 100, 0, 2, 8, 0, 1, -1);
    again.buffer_target = 3;
    dataloader_restore(&again, state_after_first, "test");
    dataloader_next_batch(&again);
    check(again.inputs == second_inputs && again.targets == second_targets && again.last_batch,
          "SFT loader: restoring the saved state reproduces the next batch exactly");
    // rank 1 of 2 fetches c1, c3, c5, c1, c3, ..: buffer c1 c3 c5 -> c5 (4); + c1 -> c1 (3); + c3 -> c3 (2) fills the row
    SftLoader rank1;
    sft_loader_init(&rank1, path, 100, 0, 1, 8, 1, 2, -1);
    rank1.buffer_target = 3;
    dataloader_next_batch(&rank1);
    const std::vector<int> want1 = row_of({{c5, 4}, {c1, 3}, {c3, 1}});
    check(rank1.inputs == want1 && rank1.consumed == 7 && rank1.last_batch,
          "SFT loader, rank 1 of 2: conversations 1, 3, 5, 1, 3 -> a row of c5, c1, c3 (consumed counted from 1 in steps of 2: 7)");
    // the schedules at a few points worked out by hand
    OptimConfig o;
    o.warmup_ratio = 0.0f;
    o.warmdown_ratio = 0.5f;
    o.final_lr_frac = 0.0f;
    o.muon_wd = 0.25f;
    const UpdateSchedule a = sft_schedule(o, 0, 0.25), b = sft_schedule(o, 150, 0.75), e = sft_schedule(o, 600, 1.0);
    check(a.lrm == 1.0 && a.momentum == 0.85 && fabs(b.lrm - 0.5) < 1e-12 && fabs(b.momentum - 0.9) < 1e-12 && e.lrm == 0.0 && e.momentum == 0.95 &&
          a.muon_wd == 0.25 && e.muon_wd == 0.25, "SFT schedule: lrm 1, 0.5, 0 at progress 0.25, 0.75, 1; momentum 0.85, 0.9, 0.95 at steps "
          "0, 150, 600; weight decay constant");
    for (SftLoader* l : {&dl, &again, &rank1}) dataloader_free(l);
}

// ----------------------------------------------------------------------------------------------------
// 6. Resume: k steps, checkpoint, a fresh process state restored from it, N - k more steps: the same
// losses and the same bits as N uninterrupted steps

static void test_resume_bit_identical(bool adamw_only) {
    const std::string shard = tmp_path("resume_shard.bin"), ckpt = tmp_path("resume.safetensors");
    Rng rng{21};
    std::vector<uint32_t> stream;
    for (int doc = 0; doc < 400; doc++) {
        stream.push_back(0);
        int len = 1 + (int)(rng_next_u64(&rng) % 40);
        for (int i = 0; i < len; i++) stream.push_back(1 + (uint32_t)(rng_next_u64(&rng) % 63));
    }
    write_shard(shard, stream, 1);
    GPTConfig c = tiny_config(64, 2, 32, 2, 16, 16, 4);
    c.xsa_alpha = 1.0f;
    c.xsa_layer = {false, true};
    OptimArgs a;
    a.optimizer = adamw_only ? "adamw" : "muon";
    a.total_batch = 2 * 2 * 16;  // 2 micro-batches of 2 rows
    a.num_iterations = 6;
    a.warmup_steps = 2;
    TrainingPlan plan = plan_training(c, a);
    struct Run {
        GPT model;
        Optimizer opt;
        DataLoader data;
    };
    auto start = [&](Run* r) {
        gpt_build(&r->model, c);
        gpt_init_weights(&r->model, 3);
        optimizer_init(&r->opt, &r->model, plan.optim);
        dataloader_init(&r->data, shard, "test", 64, 0, 2, 16, 0, 1);
    };
    auto stop = [](Run* r) {
        optimizer_free(&r->opt);
        dataloader_free(&r->data);
        gpt_free(&r->model);
    };
    Run full, first, resumed;
    start(&full);
    std::vector<double> full_losses;
    for (int s = 0; s < 6; s++) full_losses.push_back(train_step(&full.model, &full.opt, &full.data, 2, s).loss);
    start(&first);
    LoopState loop;
    for (int s = 0; s < 3; s++) loop.smooth_loss = train_step(&first.model, &first.opt, &first.data, 2, s).loss;
    loop.step = 3;
    save_checkpoint(ckpt, &first.model, &first.opt, &first.data, loop);
    stop(&first);
    start(&resumed);
    LoopState restored;
    load_checkpoint(ckpt, &resumed.model, &resumed.opt, &resumed.data, &restored, false);
    bool same_losses = restored.step == 3 && restored.smooth_loss == loop.smooth_loss;
    for (int s = 3; s < 6; s++) same_losses &= train_step(&resumed.model, &resumed.opt, &resumed.data, 2, s).loss == full_losses[s];
    bool same_params = memcmp(full.model.params, resumed.model.params, full.model.num_params * sizeof(float)) == 0;
    bool same_state = memcmp(full.opt.state, resumed.opt.state, full.opt.layout.state_floats * sizeof(float)) == 0;
    bool same_loader = dataloader_state(&full.data) == dataloader_state(&resumed.data);
    check(same_losses && same_params && same_params && same_state && same_loader,
          "resume (%s): 3 steps + checkpoint + 3 steps == 6 steps (losses %s, weights %s, optimizer state %s, loader %s)",
          adamw_only ? "AdamW" : "Muon", same_losses ? "same" : "DIFFER", same_params ? "same" : "DIFFER", same_state ? "same" : "DIFFER",
          same_loader ? "same" : "DIFFER");
    stop(&full);
    stop(&resumed);
}

// ----------------------------------------------------------------------------------------------------
// 7. --ranks 2 against the same step computed here in one process. The rest of the command line (presets,
// bad flags and files, the main job, resume through the CLI) is tested end to end by dev/test/test_e2e.py;
// this check stays here because its reference is the model run in this process, and it runs
// ./train_gpt_cpu --ranks 2 because the ranks cannot be forked from here (they must start before any
// OpenMP thread does).

static const char* TINY = "-d 1 --dim 32 --heads 2 -t 32 -b 2 -B 128 --warmup-steps 2 --eval-every 3 --eval-tokens 256 --sample-every -1";

// the raw losses of metrics.jsonl's train lines, by step
static std::map<int, std::string> train_losses(const std::string& metrics) {
    std::map<int, std::string> out;
    for (size_t pos = 0; (pos = metrics.find("\"kind\": \"train\"", pos)) != std::string::npos; pos++) {
        size_t line = metrics.rfind('\n', pos);
        line = line == std::string::npos ? 0 : line + 1;
        int step = atoi(metrics.c_str() + metrics.find("\"step\": ", line) + 8);
        size_t l = metrics.find("\"loss\": ", pos) + 8;
        out[step] = metrics.substr(l, metrics.find(',', l) - l);
    }
    return out;
}

// --ranks 2 on the CPU backend (forked processes, shared-memory sums) against the same step done here in
// one process: the first batch of each rank's share of the data (loaders for rank 0 and 1 of 2), each
// weighing 1/2, summed into one gradient, then one optimizer step.
static void test_ranks_step() {
    const std::string dir = tmp_path("ranks");
    std::string out;
    // -b 2 -B 128 -t 32: 1 micro-batch per rank
    const std::string flags = std::string(TINY) + " -n 1 --core-every 1 --core-max-per-task 8 -x 1 --ranks 2";
    int code = run_program("./train_gpt_cpu", flags + " -o " + dir + " --export-safetensors " + dir + "/final.safetensors", &out, true);
    const std::string metrics = read_file(dir + "/metrics.jsonl");
    if (code != 0 || metrics.empty()) {
        check(false, "train_gpt %s: exit %d\n%s", flags.c_str(), code, out.c_str());
        return;
    }
    SafetensorsFile exported = safetensors_read(dir + "/final.safetensors");
    GPTConfig c = config_from_metadata(exported);
    OptimArgs a;
    a.total_batch = 128;
    a.num_iterations = 1;
    a.warmup_steps = 2;
    TrainingPlan plan = plan_training(c, a);
    bool same_optimizer = true;  // the run's optimizer settings, as its run line records them
    for (const auto& kv : optim_to_metadata(plan.optim)) same_optimizer &= metrics.find("\"" + kv.first + "\": " + kv.second) != std::string::npos;
    Tokenizer tok;
    tokenizer_load(&tok, "dev/data/devil/tokenizer.bin");
    GPT model;
    gpt_build(&model, c);
    gpt_init_weights(&model, 42);
    const std::vector<float> init(model.params, model.params + model.num_params);
    Optimizer opt;
    optimizer_init(&opt, &model, plan.optim);
    gpt_zero_grad(&model);
    backend_zero(model.step_sums, sizeof(float));
    for (int r = 0; r < 2; r++) {
        DataLoader dl;
        dataloader_init(&dl, "dev/data/devil/train_*.bin", "training shard", tok.vocab_size, tok.bos_id, 2, 32, r, 2);
        dataloader_next_batch(&dl);
        gpt_train_micro_step(&model, dl.inputs.data(), dl.targets.data(), 2, 32, 0.5f);
        dataloader_free(&dl);
    }
    float loss = 0.0f;
    backend_download(&loss, model.step_sums, sizeof(float));
    optimizer_step(&opt, &model, base_schedule(opt.config, opt.step));
    double diff = 0.0, norm = 0.0;  // of the updates: W after the step - W before
    for (const ParamTensor& t : model.table) {
        const float* w = exported.get_f32(t.name, t.numel);
        for (size_t i = 0; i < t.numel; i++) {
            const double u_ranks = (double)w[i] - init[t.offset + i], u_here = (double)model.params[t.offset + i] - init[t.offset + i];
            diff += (u_ranks - u_here) * (u_ranks - u_here);
            norm += u_here * u_here;
        }
    }
    const double rel = sqrt(diff / std::max(norm, 1e-300));
    std::map<int, std::string> losses = train_losses(metrics);
    const double ranks_loss = losses.count(0) ? atof(losses[0].c_str()) : NAN;
    check(same_optimizer && rel <= 1e-4 && fabs(ranks_loss - loss) <= 1e-5 * fabs(loss),
          "train_gpt --ranks 2 (CPU, 2 processes) = the two ranks' batches summed in one process: update relative L2 %.1e (<= 1e-4), "
          "step-0 loss %.6f vs %.6f, the same optimizer settings",
          rel, ranks_loss, loss);
    optimizer_free(&opt);
    gpt_free(&model);
}

// ----------------------------------------------------------------------------------------------------
// 8. CORE: rendering and spans of the first item of each embedded task (expected prompts and answers
// written by hand from the rendering rules of dev/docs/evaluation.md#prompt-rendering, see dev/data/core_bundle/EXPECTED.md), centering by hand,
// the C++ scores against the PyTorch scorer (dev/reference/score_core.py) on the same model. (core.py
// reproducing these task files: dev/data/test_core.py; bad task files: dev/test/test_e2e.py.)

struct ExpectedPrompt {
    const char* text;    // the prompt after BOS
    int length, start, end;
    const char* answer;  // the tokens of the span
};

static void test_core_rendering(const Tokenizer& tok, const std::string& file, int type, int gold, std::vector<ExpectedPrompt> want) {
    CoreTask task = core_task_load("dev/data/core_tasks/" + file, tok.vocab_size, tok.bos_id);
    const CoreItem& item = task.items[0];
    bool ok = task.type == type && item.gold == gold && item.prompts.size() == want.size();
    for (size_t p = 0; ok && p < want.size(); p++) {
        const CorePrompt& cp = item.prompts[p];
        ok = (int)cp.tokens.size() == want[p].length && cp.span_start == want[p].start && cp.span_end == want[p].end &&
             tokenizer_decode(&tok, cp.tokens.data() + 1, cp.tokens.size() - 1) == want[p].text &&
             tokenizer_decode(&tok, cp.tokens.data() + cp.span_start, cp.span_end - cp.span_start) == want[p].answer;
    }
    check(ok, "CORE %s (%s): first item's %zu prompt(s) render, tokenize and span as worked out by hand; gold %d", file.c_str(), CORE_TYPE_NAMES[type],
          want.size(), gold);
}

// ChatCORE's answer checkers on hand-made answers (chatcore.h: nanochat's tasks/gsm8k.py and humaneval.py),
// HumanEval's test process on programs that pass, fail, crash, loop, eat memory or spawn a process, and
// the calculator tool's token protocol.
static void test_chatcore_checkers(const Tokenizer& tok) {
    struct { const char* text; bool found; const char* answer; } gsm[] = {
        {"So she earns 12 * 5 = 60.\n#### 60", true, "60"},
        {"#### 1,200 dollars", true, "1200"},
        {"the answer: #### -3.5\n#### 7", true, "-3.5"},        // the first one
        {"#### - 5 then #### 42", true, "42"},                 // "#### - 5" is not a number: the next one
        {"#### -,", true, "-"},                                // the regex takes [0-9.,]+ after the optional '-': "-,"
        {"####42 and # ### 5", false, ""},                     // no space after ####
        {"", false, ""},
    };
    bool gsm_ok = true;
    for (const auto& c : gsm) {
        std::string got;
        const bool found = gsm8k_extract_answer(c.text, &got);
        if (found != c.found || (found && got != c.answer)) {
            gsm_ok = false;
            printf("     gsm8k '%s': %s '%s', expected %s '%s'\n", c.text, found ? "found" : "none", got.c_str(), c.found ? "found" : "none", c.answer);
        }
    }
    check(gsm_ok, "GSM8K answers: the first '#### NUMBER', commas removed, on 7 hand-made answers");
    struct { const char* text; const char* program; } code[] = {
        {"Here:\n```python\ndef f(x):\n    return x + 1\n```\nDone.", "def f(x):\n    return x + 1"},
        {"```\nx = 1\n```", "x = 1"},
        {"```python   \n\n  y = 2  \n```", "y = 2"},                // the code starts after the last newline of the whitespace
        {"```\n\n```", ""},                                            // backtracking: the block is empty
        {"```python x = 1```\n  def g(): pass  ", "```python x = 1```\n  def g(): pass"},  // no block: all of it, stripped
        {"text ```python\nunclosed", "text ```python\nunclosed"},
        {"```py\na\n```\n```python\nb\n```", "```python\nb"},         // "py" fails; the first block then opens at the second fence
    };
    bool code_ok = true;  // (the expected programs are what Python's re gives for nanochat's pattern on these strings)
    for (const auto& c : code) {
        const std::string got = humaneval_extract_program(c.text);
        if (got != c.program) {
            code_ok = false;
            printf("     program of '%s': '%s', expected '%s'\n", c.text, got.c_str(), c.program);
        }
    }
    check(code_ok, "HumanEval programs: the first ```python block (regex backtracking included), else the whole answer, on 7 hand-made answers");
    check(!python_path().empty(), "HumanEval's test process: python3 found on PATH");
    {
        const std::string test = "def check(candidate):\n    assert candidate(2) == 3\n    assert candidate(-1) == 0\n";
        ChatTask task;
        task.checker = CHECK_HUMANEVAL;
        ChatItem item;
        item.refs = {"import math", test, "add_one"};
        struct { const char* answer; bool pass; const char* what; } runs[] = {
            {"```python\ndef add_one(x):\n    return x + 1\n```", true, "a correct function"},
            {"def add_one(x):\n    return x + 2", false, "a wrong one"},
            {"def add_one(x):\n    raise ValueError('no')", false, "one that raises"},
            {"def add_one(x):\n    while True: pass", false, "one that loops (killed after 5 s)"},
            {"def add_one(x):\n    return len(bytearray(1 << 30)) and x + 1", false, "one that asks for 1 GiB (256 MB limit)"},
            {"import os\ndef add_one(x):\n    os.remove('/tmp/nothing')\n    return x + 1", false, "one that deletes a file (disabled)"},
            {"def add_one(x):\n    return x + 1\nimport sys\nsys.exit(0)", false, "one that exits with 0 before the test (no pass marker)"},
        };
        for (const auto& r : runs) {
            const double t0 = wall_ms();
            const bool pass = chat_check(task, item, r.answer);
            check(pass == r.pass, "HumanEval test process: %s %s (%.1f s)", r.what, r.pass ? "passes" : "fails", (wall_ms() - t0) / 1000.0);
        }
    }
    // the tool: <|python_start|> 12/60 <|python_end|> -> <|output_start|> 0.2 <|output_end|> forced in; a refused expression, nothing
    const CalculatorTool tool = calculator_tool(&tok);
    auto forced_after = [&](const std::string& expr) {
        ToolRow row;
        tool_step(tool, &row, tool.python_start);
        for (int id : tokenizer_encode(&tok, expr)) tool_step(tool, &row, id);
        tool_step(tool, &row, tool.python_end);
        return std::vector<int>(row.forced.rbegin(), row.forced.rend());
    };
    std::vector<int> want = {tool.output_start};
    for (int id : tokenizer_encode(&tok, "0.2")) want.push_back(id);
    want.push_back(tool.output_end);
    check(tool.tok != nullptr && forced_after("12/60") == want && forced_after("2**8").empty() && forced_after("1/0").empty(),
          "calculator tool: 12/60 forces <|output_start|> 0.2 <|output_end|>; 2**8 and 1/0 force nothing");
}

// ChatCORE's answer text as nanochat reads it, with Python itself as the judge: python3 runs one of these functions
// on each byte string of a corpus, decoded as nanochat's tokenizer decodes an answer (errors="replace"), and its
// results are compared with ours on utf8_replace_invalid of the same bytes (what chat_check reads). The regexes
// are nanochat's (tasks/humaneval.py, tasks/gsm8k.py), copied.
static const char* const PYTHON_TEXT_FUNCTIONS = R"PY(
import re, struct, sys
def program(t):
    m = re.findall(r'```(?:python)?\s*\n(.*?)\n```', t, re.DOTALL)
    return m[0].strip() if m else t.strip()
def gsm8k(t):
    m = re.search(r"#### (\-?[0-9\.\,]+)", t)
    return m.group(1).strip().replace(",", "") if m else "None"
f = {"decode": lambda t: t, "strip": str.strip, "program": program, "gsm8k": gsm8k}[sys.argv[1]]
data, pos, out = open(sys.argv[2], "rb").read(), 0, []
while pos < len(data):
    (n,) = struct.unpack_from("<I", data, pos)
    r = f(data[pos + 4:pos + 4 + n].decode("utf-8", errors="replace")).encode("utf-8")
    out.append(struct.pack("<I", len(r)) + r)
    pos += 4 + n
open(sys.argv[3], "wb").write(b"".join(out))
)PY";

// Python's `function` (above) of every string of corpus, against ours; prints the first differences.
static void check_as_python(const char* function, const std::vector<std::string>& corpus, std::string (*ours)(const std::string&), const char* what) {
    const std::string script = tmp_path("text_functions.py"), in = tmp_path("text_in.bin"), out = tmp_path("text_out.bin");
    FILE* f = fopen_or_fail(script.c_str(), "wb");
    fputs(PYTHON_TEXT_FUNCTIONS, f);
    fclose(f);
    f = fopen_or_fail(in.c_str(), "wb");
    for (const std::string& s : corpus) {
        const uint32_t n = (uint32_t)s.size();
        fwrite(&n, 4, 1, f);
        fwrite(s.data(), 1, n, f);
    }
    fclose(f);
    std::vector<std::string> want;
    if (system((python_path() + " " + script + " " + function + " " + in + " " + out).c_str()) == 0) {
        const std::string data = read_file(out);
        for (size_t pos = 0; pos + 4 <= data.size();) {
            uint32_t n;
            memcpy(&n, data.data() + pos, 4);
            want.push_back(data.substr(pos + 4, n));
            pos += 4 + n;
        }
    }
    auto ascii = [](const std::string& bytes) {  // every byte outside printable ASCII as \xNN: whitespace made visible
        std::string out;
        char buf[8];
        for (unsigned char c : bytes) {
            if (c >= 0x20 && c < 0x7F) out += (char)c;
            else snprintf(buf, sizeof buf, "\\x%02x", c), out += buf;
        }
        return out;
    };
    size_t differ = 0;
    for (size_t i = 0; i < corpus.size() && want.size() == corpus.size(); i++) {
        const std::string got = ours(corpus[i]);
        if (got != want[i] && ++differ <= 3)
            printf("     %s of '%s': '%s', Python '%s'\n", function, ascii(corpus[i]).c_str(), ascii(got).c_str(), ascii(want[i]).c_str());
    }
    check(want.size() == corpus.size() && differ == 0, "%s as Python's on %zu strings (%zu differ)", what, corpus.size(), differ);
}

static void test_chatcore_text_as_python() {
    // byte strings: all of one and two bytes, then longer ones over the bytes where UTF-8's rules change (ASCII's
    // end; the continuation ranges 80-8F, 90-9F, A0-BF; C0, C1 and F5-FF, never valid; E0, ED, F0 and F4, whose
    // second byte is narrowed against overlongs, surrogates and code points past U+10FFFF), and random ones
    const unsigned char edge[] = {0x00, 0x41, 0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xC0, 0xC1, 0xC2, 0xDF, 0xE0, 0xE1, 0xED, 0xEF, 0xF0, 0xF3, 0xF4, 0xF5, 0xFF};
    std::vector<std::string> bytes;
    for (int a = 0; a < 256; a++) {
        bytes.push_back(std::string(1, (char)a));
        for (int b = 0; b < 256; b++) bytes.push_back({(char)a, (char)b});
    }
    for (int a = 0xC0; a < 0x100; a++)
        for (unsigned char b : edge)
            for (unsigned char c : edge) bytes.push_back({(char)a, (char)b, (char)c});
    for (unsigned char a : edge)
        for (unsigned char b : edge)
            for (unsigned char c : edge)
                for (unsigned char d : edge)
                    if (a >= 0xE0) bytes.push_back({(char)a, (char)b, (char)c, (char)d});
    Rng rng = {5};
    for (int k = 0; k < 5000; k++) {
        std::string s;
        for (int n = (int)(rng_next_u64(&rng) % 17); n > 0; n--) {
            const uint64_t r = rng_next_u64(&rng);
            s += (char)(r % 10 < 7 ? edge[(r >> 8) % sizeof edge] : (r >> 8) % 256);
        }
        bytes.push_back(s);
    }
    check_as_python("decode", bytes, utf8_replace_invalid, "UTF-8 decoding of bytes (U+FFFD per maximal subpart)");
    // answers: random strings of pieces that matter to the checkers: fences, "python", line ends, Python's
    // whitespace (ASCII, \x1c-\x1f, and U+0085 .. U+3000), characters that are not whitespace (U+200B, U+FEFF,
    // U+00A1), GSM8K's marker and number characters, code, and broken UTF-8 (a stray byte, truncated sequences,
    // a surrogate, an overlong); every other answer only of the first 12, so that blocks open and close often
    const char* pieces[] = {"```", "```python", "\n```", "\n", " ", "\xc2\xa0", "\xc2\x85", "\xe3\x80\x80", "\xe2\x80\xa8", "\xe2\x80\x8b",
                            "x", "\xff", "python", "py", "\r\n", "\t", "\x0b", "\x0c", "\x1c", "\x1f", "\xe1\x9a\x80", "\xe2\x80\x80",
                            "\xe2\x80\x8a", "\xe2\x80\xa9", "\xe2\x80\xaf", "\xe2\x81\x9f", "\xef\xbb\xbf", "\xc2\xa1", "def f(): return 1",
                            "\xc3\xa9", "#### ", "-", "1", ",", ".", "\xc2", "\xe3\x80", "\xe2\x80", "\xed\xa0\x80", "\xc0\x8a", "\x80"};
    std::vector<std::string> answers;
    for (int k = 0; k < 6000; k++) {
        const size_t n_pieces = k % 2 ? 12 : sizeof pieces / sizeof pieces[0];
        std::string s;
        for (int n = (int)(rng_next_u64(&rng) % 13); n > 0; n--) s += pieces[rng_next_u64(&rng) % n_pieces];
        answers.push_back(s);
    }
    check_as_python("decode", answers, utf8_replace_invalid, "UTF-8 decoding of answers");
    check_as_python("strip", answers, [](const std::string& s) { return py_strip(utf8_replace_invalid(s)); }, "str.strip() (py_strip)");
    check_as_python("program", answers, [](const std::string& s) { return humaneval_extract_program(utf8_replace_invalid(s)); },
                    "HumanEval's program (\\s and strip Unicode)");
    check_as_python("gsm8k", answers, [](const std::string& s) {
        std::string got;
        return gsm8k_extract_answer(utf8_replace_invalid(s), &got) ? got : std::string("None");
    }, "GSM8K's number");
    // verdicts that only the decoding and Unicode whitespace decide (dev/data/test_chat_eval.py checks that the
    // reference scorer, nanochat's code, gives these same verdicts on these answers)
    ChatTask task;
    task.checker = CHECK_HUMANEVAL;
    ChatItem item;
    item.refs = {"import math", "def check(candidate):\n    assert candidate(2) == 3\n    assert candidate(-1) == 0\n", "add_one"};
    struct { const char* answer; bool pass; const char* what; } runs[] = {
        {"```python\ndef add_one(x):\n    # one more \xff\xe3\x80\n    return x + 1\n```", true, "broken UTF-8 in a comment (U+FFFD there)"},
        {"```python\xc2\xa0\ndef add_one(x):\n    return x + 1\n```", true, "a no-break space after ```python"},
        {"def add_one(x):\n    return x + 1\xe3\x80\x80", true, "a trailing U+3000 (stripped)"},
        {"```python\xe2\x80\x8b\ndef add_one(x):\n    return x + 1\n```", false, "U+200B after ```python (no whitespace: no block, a syntax error)"},
    };
    for (const auto& r : runs) check(chat_check(task, item, r.answer) == r.pass, "HumanEval verdict as nanochat's: %s %s", r.what, r.pass ? "passes" : "fails");
}

// A program's process that escapes the deadline's kill and the death signal (its own session, started by a process
// the program started) and burns CPU dies of RLIMIT_CPU, ceil(timeout) + 2 s of CPU: the program starts a watcher
// that way, which starts the burner and records how it ended. (Without the limit the burner would run forever: it
// is killed here after 30 s.) Without namespaces: with them the burner dies with PID 1 (test_humaneval_boundary).
static void test_humaneval_cpu_limit() {
    const std::string pid_file = tmp_path("burner.pid"), status_file = tmp_path("burner.status");
    const std::string burner = "import os\nopen(" + python_literal(pid_file) + ", 'w').write(str(os.getpid()))\nwhile True: pass\n";
    const std::string watcher = "import os, subprocess, sys\nos.chdir('/')\np = subprocess.Popen([sys.executable, '-c', " + python_literal(burner) +
                                "])\np.wait()\nopen(" + python_literal(status_file) + ", 'w').write(str(p.returncode))\n";
    const std::string program = "import os, sys\nos.posix_spawn(sys.executable, [sys.executable, '-c', " + python_literal(watcher) + "], {}, setsid=True)\n";
    const double t0 = wall_ms();
    const bool passed = python_run_passes(program, 1.0, false);
    std::string status;
    while ((status = read_file(status_file)).empty() && wall_ms() - t0 < 30000.0) usleep(20000);
    const std::string pid = read_file(pid_file);
    if (status.empty() && !pid.empty()) kill(atoi(pid.c_str()), SIGKILL);
    check(passed && status == std::to_string(-SIGXCPU), "HumanEval test process: a detached process burning CPU dies of SIGXCPU (RLIMIT_CPU 3 s at a "
          "1 s deadline): status '%s' after %.1f s", status.c_str(), (wall_ms() - t0) / 1000.0);
}

// HumanEval's boundary (chatcore.h; dev/docs/evaluation.md#humanevals-boundary says what it stops), each measure against a
// program written to cross it. The programs end normally iff the boundary held (an assert says what crossed it
// otherwise), except the early exits, whose verdict is the point. The measures that hold without namespaces are
// checked both ways; the namespaces' only with them, where this system allows them.

// The processes whose command line holds `mark`, killed: how many there were.
static int kill_processes_with(const std::string& mark) {
    int n = 0;
    DIR* proc = opendir("/proc");
    for (struct dirent* e; proc && (e = readdir(proc));) {
        const int pid = atoi(e->d_name);
        if (pid > 0 && read_file("/proc/" + std::string(e->d_name) + "/cmdline").find(mark) != std::string::npos) n++, kill(pid, SIGKILL);
    }
    if (proc) closedir(proc);
    return n;
}

static void test_humaneval_boundary() {
    const bool namespaces = humaneval_namespaces();
    printf("     HumanEval's test process %s here\n", namespaces ? "gets its namespaces" : "runs without namespaces (the kernel refuses them)");
    const std::string tests = "def check(candidate):\n    assert candidate(2) == 3\n";  // a HumanEval item's, as chat_check joins them
    for (bool isolate : {true, false}) {
        if (isolate && !namespaces) continue;
        const char* how = isolate ? "with namespaces" : "without namespaces";
        const int fd = open(tmp_path("inherited.txt").c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND, 0600);  // no O_CLOEXEC, as a run's metrics.jsonl
        const int high = fcntl(fd, F_DUPFD, 200);
        const bool alone = python_run_passes("import os\nassert [os.readlink('/proc/self/fd/%d' % fd) for fd in (0, 1, 2)] == ['/dev/null'] * 3\n"
                                             "written = []\nfor fd in range(4, 1024):\n    try:\n        os.write(fd, b'leaked\\n')\n"
                                             "        written.append(fd)\n    except OSError:\n        pass\nassert not written, written\n", 5.0, isolate);
        close(fd);
        close(high);
        check(alone && read_file(tmp_path("inherited.txt")).empty(), "HumanEval boundary %s: no descriptor of ours reaches the program (a file left open at "
              "%d and %d): 0-2 are /dev/null, nothing past 3 (the marker) is open, the file stays empty", how, fd, high);
        struct { const char* answer; bool pass; const char* what; } runs[] = {
            {"def add_one(x):\n    return x + 1", true, "a correct function passes"},
            {"def add_one(x):\n    return x + 2\nimport sys\nsys.exit(0)", false, "a wrong one that calls sys.exit(0) before the tests fails"},
            {"def add_one(x):\n    return x + 2\nimport os\nos._exit(0)", false, "a wrong one that calls os._exit(0) before the tests fails"},
        };
        for (const auto& r : runs) {
            const std::string program = "import math\n\n" + std::string(r.answer) + "\n\n" + tests + "\ncheck(add_one)";
            check(python_run_passes(program, 5.0, isolate) == r.pass, "HumanEval boundary %s: %s (a pass needs the marker written after check())", how, r.what);
        }
        check(python_run_passes("import errno, os, signal\nsignal.signal(signal.SIGXFSZ, signal.SIG_IGN)\nf = open('big', 'wb', buffering=0)\n"
                                "try:\n    for _ in range(100):\n        f.write(bytes(1 << 20))\n    raise AssertionError('wrote 100 MB')\n"
                                "except OSError as e:\n    size = os.path.getsize('big')\n    assert e.errno == errno.EFBIG and size == 16 << 20, (e, size)\n",
                                5.0, isolate),
              "HumanEval boundary %s: writing 100 MB stops at 16 MiB (RLIMIT_FSIZE, EFBIG)", how);
        const std::string limits = std::string("limits = {l[:26].strip(): l[26:].split()[:2] for l in open('/proc/self/limits').read().splitlines()[1:]}\n"
                                               "want = {'Max address space': '268435456', 'Max data size': '268435456', 'Max stack size': '268435456', "
                                               "'Max file size': '16777216', 'Max open files': '64', 'Max core file size': '0'") +
                                   (isolate ? ", 'Max processes': '64'" : "") + "}\n"
                                   "assert all(limits[k] == [v, v] for k, v in want.items()), limits\n"
                                   "assert open('/proc/self/environ', 'rb').read() == b'PATH=/usr/bin:/bin\\0'\n";
        check(python_run_passes(limits, 5.0, isolate), "HumanEval boundary %s: hard limits (address space, data and stack 256 MB, files 16 MiB, 64 "
              "descriptors, no core%s) and an environment of PATH only", how, isolate ? ", 64 processes" : "");
        const std::string mark = "xsa_left_behind_" + std::to_string(getpid()) + (isolate ? "_ns" : "_plain");
        const double t0 = wall_ms();
        const bool looped = python_run_passes("import posix, sys\nif posix.fork() == 0:\n    posix.execv(sys.executable, [sys.executable, '-c', "
                                              "'import time; time.sleep(60)', " + python_literal(mark) + "])\nwhile True: pass\n", 1.0, isolate);
        usleep(100000);
        const int left = kill_processes_with(mark);
        check(!looped && left == 0, "HumanEval boundary %s: a program that started a process then loops is killed at its deadline with that process "
              "(%.1f s, %d left)", how, (wall_ms() - t0) / 1000.0, left);
    }
    if (!namespaces) return;
    // the evaluator survives a program that kills its parent and the process it knows to be the evaluator (a forked
    // copy of this test, which then exits with 3)
    const pid_t evaluator = fork();
    if (evaluator == 0) {
        python_run_passes("import os, posix\nfor pid in (os.getppid(), " + std::to_string(getpid()) + "):\n    try:\n        posix.kill(pid, 9)\n"
                          "    except OSError:\n        pass\n");
        _exit(3);
    }
    int status = 0;
    waitpid(evaluator, &status, 0);
    check(WIFEXITED(status) && WEXITSTATUS(status) == 3, "HumanEval boundary: the evaluator survives posix.kill(os.getppid(), 9) and a kill of its pid "
          "(it exited with %d, signal %d)", WIFEXITED(status) ? WEXITSTATUS(status) : -1, WIFSIGNALED(status) ? WTERMSIG(status) : 0);
    const std::string sleeper = "import os, posix, sys\nif posix.fork() == 0:\n    os.setsid()\n    posix.execv(sys.executable, [sys.executable, '-c', "
                                "'import time; time.sleep(60)', ";  // + the mark, "])\n"
    const std::string mark = "xsa_survivor_" + std::to_string(getpid());
    const bool forked = python_run_passes(sleeper + python_literal(mark) + "])\n");
    const int left = kill_processes_with(mark);
    check(forked && left == 0, "HumanEval boundary: a process the program started in a session of its own (setsid) does not outlive it (%d left)", left);
    const std::string keep = tmp_path("keep.txt"), made = tmp_path("made.txt");
    FILE* f = fopen(keep.c_str(), "w");
    fputs("keep", f);
    fclose(f);
    python_run_passes("import posix\nfor attempt in (lambda: posix.unlink(" + python_literal(keep) + "), lambda: open(" + python_literal(keep) + ", 'w'), "
                      "lambda: open(" + python_literal(made) + ", 'w'), lambda: posix.rename(" + python_literal(keep) + ", " + python_literal(made) + ")):\n"
                      "    try:\n        attempt()\n    except OSError:\n        pass\n");
    check(read_file(keep) == "keep" && access(made.c_str(), F_OK) != 0, "HumanEval boundary: files outside its directory cannot be deleted "
          "(posix.unlink), truncated, renamed or created");
    check(python_run_passes("import os, socket\nassert [d for d in os.listdir('/proc') if d.isdigit()] == ['1'], os.listdir('/proc')\n"
                            "assert not os.path.exists('/proc/" + std::to_string(getpid()) + "/environ')\n"
                            "assert os.getuid() == 1000 and [l.split()[1] for l in open('/proc/self/status') if l.startswith('CapEff')] == ['0' * 16]\n"
                            "assert [name for _, name in socket.if_nameindex()] == ['lo']\n"),
          "HumanEval boundary: the program sees no process but itself (nor the evaluator's environment), is uid 1000 with no capability, "
          "and has no network but a loopback device");
}

static void test_core() {
    Tokenizer tok;
    tokenizer_load(&tok, "dev/data/devil/tokenizer.bin");
    const char* when = "When it began to rain, Mary opened her";
    test_core_rendering(tok, "01_completion_zeroshot.bin", CORE_MULTIPLE_CHOICE, 1,
                        {{(std::string(when) + " piano.").c_str(), 19, 15, 19, " piano."},
                         {(std::string(when) + " umbrella.").c_str(), 21, 15, 21, " umbrella."},
                         {(std::string(when) + " letter to the king.").c_str(), 20, 15, 20, " letter to the king."},
                         {(std::string(when) + " oven.").c_str(), 18, 15, 18, " oven."}});
    // 2-shot LM: trimmed examples joined by "\n\n", the context, the delimiter, the continuation
    test_core_rendering(tok, "02_devil_lm.bin", CORE_LANGUAGE_MODELING, 0,
                        {{"HATCHET, n.  A young axe\n\nNOISE, n.  A stench in the ear\n\nLAWYER, n.  One skilled in circumvention of the law", 47, 46,
                          47, " law"}});
    // 3-shot MC with the "\nAnswer: " delimiter; the span starts where the choices' tokens first differ
    const std::string q = "Which word does The Devil's Dictionary define as ";
    const std::string shots = q + "\"a vagrant opinion without visible means of support\"?\nAnswer: Prejudice\n\n" + q +
                              "\"a young axe\"?\nAnswer: Hatchet\n\n" + q + "\"a stench in the ear\"?\nAnswer: Noise\n\n" + q +
                              "\"a favorable occasion for grasping a disappointment\"?\nAnswer:";
    const std::string c0 = shots + " Luck", c1 = shots + " Hope", c2 = shots + " Opportunity", c3 = shots + " Ambition";
    test_core_rendering(tok, "03_devil_definitions.bin", CORE_MULTIPLE_CHOICE, 2,
                        {{c0.c_str(), 136, 134, 136, " Luck"}, {c1.c_str(), 136, 134, 136, " Hope"}, {c2.c_str(), 136, 134, 136, " Opportunity"},
                         {c3.c_str(), 137, 134, 137, " Ambition"}});
    // schema: the options differ in the context; the span is the common ending, at different offsets
    test_core_rendering(tok, "04_devil_schema.bin", CORE_SCHEMA, 0,
                        {{"The lawyer could not lend money to his friend because the lawyer had already spent all of his own.", 25, 16, 25,
                          " had already spent all of his own."},
                         {"The lawyer could not lend money to his friend because the friend had already spent all of his own.", 24, 15, 24,
                          " had already spent all of his own."}});

    // centering by hand: (acc - rb) / (1 - rb)
    CoreResult r;
    r.tasks.resize(3);
    r.tasks[0].correct = {1, 1, 0, 0};  // 0.5 at a 25% baseline: (0.5 - 0.25) / 0.75 = 1/3
    r.tasks[0].random_baseline = 25.0;
    r.tasks[1].correct = {1, 0};  // 0.5 at a 50% baseline: 0
    r.tasks[1].random_baseline = 50.0;
    r.tasks[2].correct = {1, 1, 1, 0, 0};  // 0.6 at 0%: 0.6
    r.tasks[2].random_baseline = 0.0;
    core_finish(&r);
    double want = (1.0 / 3.0 + 0.0 + 0.6) / 3.0;
    check(fabs(r.tasks[0].centered - 1.0 / 3.0) < 1e-12 && fabs(r.tasks[1].centered) < 1e-12 && fabs(r.tasks[2].centered - 0.6) < 1e-12 &&
              fabs(r.core - want) < 1e-12,
          "CORE centering: 1/3, 0, 0.6 and their mean %.6f (by hand %.6f)", r.core, want);

    // the same model scored by the PyTorch reference (float64): every item's verdict and the CORE value
    // exactly, every option's mean span loss to 1e-4
    SafetensorsFile model_file = safetensors_read("dev/reference/data/core_model.safetensors");
    SafetensorsFile ref = safetensors_read("dev/reference/data/core_scores.safetensors");
    GPTConfig c = config_from_metadata(model_file);
    GPT model;
    gpt_build(&model, c);
    gpt_load_weights(&model, model_file);
    CoreResult ours = core_evaluate(&model, core_tasks_load("dev/data/core_tasks", tok.vocab_size, tok.bos_id), -1);
    int verdicts = 0, verdict_diffs = 0, options = 0;
    double worst_loss = 0.0;
    for (const CoreTaskResult& t : ours.tasks) {
        const int* correct = ref.get_i32("core." + t.label + ".correct", t.correct.size());
        for (size_t i = 0; i < t.correct.size(); i++) {
            verdicts++;
            verdict_diffs += t.correct[i] != correct[i];
        }
        if (t.type == CORE_LANGUAGE_MODELING) continue;
        const size_t k = t.option_loss[0].size();
        const float* losses = ref.get_f32("core." + t.label + ".losses", t.correct.size() * k);
        for (size_t i = 0; i < t.correct.size(); i++)
            for (size_t o = 0; o < k; o++, options++) worst_loss = std::max(worst_loss, fabs(t.option_loss[i][o] - losses[i * k + o]) / fabs((double)losses[i * k + o]));
    }
    const float ref_core = ref.get_f32("core.value", 1)[0];
    check(verdicts > 0 && verdict_diffs == 0 && fabs(ours.core - ref_core) < 1e-6 && worst_loss <= 1e-4,
          "CORE vs the PyTorch scorer on the same model: %d/%d item verdicts equal, CORE %.6f vs %.6f, %d option losses rel err %.1e <= 1e-4",
          verdicts - verdict_diffs, verdicts, ours.core, ref_core, options, worst_loss);
    gpt_free(&model);
}

// CORE items with an empty answer span, as dev/data/core.py writes them from real data (ARC-Easy, PIQA; they used
// to make core_task_load refuse the whole task): (a) a choice that is a token prefix of every other choice ("a liar"
// / "a liar and a thief": span [n, n) at its prompt's end), (b) choices all identical (every span [n, n)), (c) a
// schema item whose options are all identical (the whole prompt is the common suffix: span [0, n)). nanochat's
// core_eval.py scores option i as losses[i, start-1:end-1].mean(), NaN for these empty slices (Python reads -1 as
// the last column), and predicts mean_losses.index(min(mean_losses)): Python's min keeps its first element and
// takes a later one only when it is smaller, never true with a NaN. So a NaN first option is the prediction,
// whatever the other losses are, and a later NaN option is never picked; the item counts in the accuracy. The
// expected predictions below follow from that rule alone.
static void write_core_task(const std::string& path, int type, const char* label, const Tokenizer& tok, const std::vector<CoreItem>& items) {
    int32_t header[256] = {0};
    header[0] = CORE_MAGIC;
    header[1] = CORE_VERSION;
    header[2] = type;
    header[3] = (int32_t)items.size();
    header[5] = tok.vocab_size;
    header[6] = tok.bos_id;
    header[7] = -1;
    const float baseline = 0.0f;
    memcpy(&header[8], &baseline, 4);
    memcpy(&header[9], label, strlen(label));
    FILE* f = fopen_or_fail(path.c_str(), "wb");
    fwrite(header, sizeof header, 1, f);
    for (const CoreItem& item : items) {
        const uint32_t head[2] = {(uint32_t)item.prompts.size(), (uint32_t)item.gold};
        fwrite(head, 4, 2, f);
        for (const CorePrompt& p : item.prompts) {
            const uint32_t span[3] = {(uint32_t)p.tokens.size(), (uint32_t)p.span_start, (uint32_t)p.span_end};
            fwrite(span, 4, 3, f);
            for (int id : p.tokens) fwrite(&id, 4, 1, f);
        }
    }
    fclose(f);
}

static void test_core_empty_spans(const Tokenizer& tok) {
    // prompts [BOS] + encoded text, spanned as core.py does (nanochat's batch_sequences_mc / _schema): multiple
    // choice from the common token prefix to the end, schema the common token suffix
    auto make_item = [&](int type, const std::vector<std::string>& texts, int gold) {
        CoreItem item;
        item.gold = gold;
        size_t shortest = SIZE_MAX, common = 0;
        for (const std::string& text : texts) {
            CorePrompt p;
            p.tokens = {tok.bos_id};
            for (int id : tokenizer_encode(&tok, text)) p.tokens.push_back(id);
            item.prompts.push_back(p);
            shortest = std::min(shortest, p.tokens.size());
        }
        auto at = [&](size_t o, size_t k) { const std::vector<int>& t = item.prompts[o].tokens; return type == CORE_SCHEMA ? t[t.size() - 1 - k] : t[k]; };
        auto agree = [&](size_t k) {
            for (size_t o = 1; o < item.prompts.size(); o++)
                if (at(o, k) != at(0, k)) return false;
            return true;
        };
        while (common < shortest && agree(common)) common++;
        for (CorePrompt& p : item.prompts) {
            p.span_end = (int)p.tokens.size();
            p.span_start = type == CORE_SCHEMA ? p.span_end - (int)common : (int)common;
        }
        return item;
    };
    const std::string q = "Q: What do you call a man who lies and steals?\nA: ";
    const std::vector<CoreItem> prefix_items = {
        make_item(CORE_MULTIPLE_CHOICE, {q + "a liar", q + "a liar and a thief"}, 0),  // option 0 NaN: predicted 0, gold 0: right
        make_item(CORE_MULTIPLE_CHOICE, {q + "a liar and a thief", q + "a liar"}, 1),  // option 1 NaN, passed over: 0, gold 1: wrong
    };
    const std::vector<CoreItem> same_items = {make_item(CORE_MULTIPLE_CHOICE, {q + "a liar", q + "a liar", q + "a liar"}, 0)};  // all NaN: 0, right
    const std::vector<CoreItem> schema_items = {make_item(CORE_SCHEMA, {"The man is a liar.", "The man is a liar."}, 1)};      // all NaN: 0, wrong
    const int n0 = (int)prefix_items[0].prompts[0].tokens.size(), n1 = (int)prefix_items[0].prompts[1].tokens.size();
    const int n_schema = (int)schema_items[0].prompts[0].tokens.size();
    check(prefix_items[0].prompts[0].span_start == n0 && prefix_items[0].prompts[0].span_end == n0 && prefix_items[0].prompts[1].span_start == n0 &&
              prefix_items[0].prompts[1].span_end == n1 && n1 > n0 && same_items[0].prompts[2].span_start == same_items[0].prompts[2].span_end &&
              schema_items[0].prompts[1].span_start == 0 && schema_items[0].prompts[1].span_end == n_schema,
          "CORE empty spans: 'a liar' is a token prefix of 'a liar and a thief' (its span [%d, %d), the other's [%d, %d)); identical choices "
          "[n, n); identical schema options [0, %d)", n0, n0, n0, n1, n_schema);
    const std::string dir = tmp_path("core_empty_spans");
    if (mkdir(dir.c_str(), 0755) != 0) fail("cannot create '%s': %s", dir.c_str(), strerror(errno));
    write_core_task(dir + "/01_prefix_choice.bin", CORE_MULTIPLE_CHOICE, "prefix_choice", tok, prefix_items);
    write_core_task(dir + "/02_same_choices.bin", CORE_MULTIPLE_CHOICE, "same_choices", tok, same_items);
    write_core_task(dir + "/03_same_schema.bin", CORE_SCHEMA, "same_schema", tok, schema_items);
    const std::vector<CoreTask> tasks = core_tasks_load(dir, tok.vocab_size, tok.bos_id);  // refused whole before

    // the rule on made-up losses: option 0 at 2.0 per token, option 2 at 1.0, option 1 (empty) at 0.0 where
    // its span would be read: the NaN in the middle is passed over and option 2, the smaller, is predicted
    CoreItem mid = make_item(CORE_MULTIPLE_CHOICE, {q + "a liar and a thief", q + "a liar", q + "a liar and a cheat"}, 2);
    size_t T = 0;
    for (const CorePrompt& p : mid.prompts) T = std::max(T, p.tokens.size());
    std::vector<std::vector<float>> losses;
    std::vector<std::vector<int>> argmax(3);
    for (float v : {2.0f, 0.0f, 1.0f}) losses.push_back(std::vector<float>(T, v));
    std::vector<double> option_loss;
    const bool mid_right = core_score_item(tasks[0], mid, losses, argmax, &option_loss);
    mid.gold = 1;
    std::vector<double> unused;
    const bool nan_gold_right = core_score_item(tasks[0], mid, losses, argmax, &unused);
    check(mid_right && !nan_gold_right && option_loss.size() == 3 && option_loss[0] == 2.0 && std::isnan(option_loss[1]) && option_loss[2] == 1.0,
          "CORE empty spans on made-up losses: options 2.0, NaN, 1.0 -> option 2 predicted (the NaN passed over), never the NaN option 1");

    // the committed tiny model: the predictions do not depend on its losses (see above), so the accuracies are
    // 1/2 (a), 1 (b) and 0 (c), every item counted; an option's loss is NaN exactly where its span is empty
    SafetensorsFile model_file = safetensors_read("dev/reference/data/core_model.safetensors");
    GPT model;
    gpt_build(&model, config_from_metadata(model_file));
    gpt_load_weights(&model, model_file);
    const CoreResult r = core_evaluate(&model, tasks, -1);
    bool nan_where_empty = true;
    for (size_t k = 0; k < tasks.size(); k++)
        for (size_t i = 0; i < tasks[k].items.size(); i++)
            for (size_t o = 0; o < tasks[k].items[i].prompts.size(); o++)
                nan_where_empty = nan_where_empty && std::isfinite(r.tasks[k].option_loss[i][o]) != core_span_empty(tasks[k].items[i].prompts[o]);
    check(r.tasks.size() == 3 && r.tasks[0].items == 2 && r.tasks[0].accuracy == 0.5 && r.tasks[1].items == 1 && r.tasks[1].accuracy == 1.0 &&
              r.tasks[2].items == 1 && r.tasks[2].accuracy == 0.0 && nan_where_empty && std::isfinite(r.core),
          "CORE empty spans on the tiny model: accuracies %.2f (a choice a prefix of the other, 2 items), %.2f (identical choices), %.2f "
          "(identical schema options), as nanochat scores them (0.50, 1.00, 0.00); option losses NaN exactly at the empty spans: %s",
          r.tasks.size() > 0 ? r.tasks[0].accuracy : -1.0, r.tasks.size() > 1 ? r.tasks[1].accuracy : -1.0,
          r.tasks.size() > 2 ? r.tasks[2].accuracy : -1.0, nan_where_empty ? "yes" : "NO");
    gpt_free(&model);
}

int main(int argc, char** argv) {
    setvbuf(stdout, nullptr, _IOLBF, 0);  // keep PASS/FAIL lines in order with any error message on stderr
    if (argc != 1) fail("usage: %s", argv[0]);
    test_phase_timing();
    test_core();
    {
        Tokenizer tok;
        tokenizer_load(&tok, "dev/data/devil/tokenizer.bin");
        test_core_empty_spans(tok);
        test_chatcore_checkers(tok);
        test_chatcore_text_as_python();
        test_humaneval_cpu_limit();
        test_humaneval_boundary();
    }
    test_packing();
    test_resharded_restore();
    test_data_seed();
    test_sft_packing();
    test_shard_truncated_during_run();
    test_resume_bit_identical(false);
    test_resume_bit_identical(true);
    test_bpb_by_hand();
    test_weights_roundtrip();
    test_layer_spec();
    test_ranks_step();
    return finish_checks();
}
