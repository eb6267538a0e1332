/*
dev/test/test_infra.cu: the C++ tests of the trainer's infrastructure, on the CPU backend: the --xsa-layers
parser, phase timing, the safetensors round trip of a model's weights, the data loader (best-fit packing
on a hand-made stream, its state restored, 2 ranks' states resumed on 3, a shard truncated during a run),
bits per byte by hand, SFT packing of conversations, resume (bit-identical to an uninterrupted run),
`--ranks 2` against the same step in one process, CORE (rendering, centering, scores against the PyTorch
scorer) and ChatCORE's answer checkers, HumanEval's test process and the calculator tool. Prints one line
per check and ends with `N passed, N failed`; exits non-zero on any failure. The numerics (the model
against the PyTorch references, optimizers, kernels, the CUDA suite) are test_xsa.cu's; the binaries end to
end are tested by dev/test/test_e2e.py and the other dev/test/test_*.py.

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

// A checkpoint of 2 ranks resumed on 3 (dataloader_restore_resharded, dev/docs/data.md#ranks-and-epochs):
// 40 documents of 2-5 tokens, chunks of 2, buffers of 3; the old ranks pack 3 batches each. Each new rank
// must start at the furthest old position, the new buffers must be the old ones dealt out (document i of
// old rank 0's then rank 1's buffer to new rank i mod 3), and each new rank must read next only chunks at
// or past that position that are its own under the new stride.
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
        position = position && dl.pos == furthest && dl.epoch == 1;
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
          "2 ranks' loader states resumed on 3: each starts at the furthest old position (%s), gets the old buffers dealt in turn (%s), "
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
            {"def add_one(x):\n    return x + 1\nimport sys\nsys.exit(0)", true, "one that exits with 0 before the test: passes, as in nanochat"},
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

int main(int argc, char** argv) {
    setvbuf(stdout, nullptr, _IOLBF, 0);  // keep PASS/FAIL lines in order with any error message on stderr
    if (argc != 1) fail("usage: %s", argv[0]);
    test_phase_timing();
    test_core();
    {
        Tokenizer tok;
        tokenizer_load(&tok, "dev/data/devil/tokenizer.bin");
        test_chatcore_checkers(tok);
    }
    test_packing();
    test_resharded_restore();
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
