// fuzz_checkpoint: checkpoint and weight-file metadata, as train_gpt.cu reads it: config_from_metadata
// (eval_core and --init-from build a model from a file's metadata) and load_checkpoint (llmc/checkpoint.h;
// --resume: the checksums of the header and the tensors, where the header has them (llmc/safetensors.h), the
// model and optimizer keys compared with the run's, ranks, batch, the training and validation data
// fingerprints, step counters, loss, the weights, optimizer.state and the data-loader state restored).
//
// The input is the JSON header of a safetensors file; the harness completes the file with the u64 header
// length in front and, behind, the data section of a real checkpoint of a tiny model (2 layers, width 24,
// 2 query heads on 1 kv head, vocabulary 64) that it writes at start-up with save_checkpoint, so the
// fuzzer mutates what a header says (metadata, dtypes, shapes, offsets) without having to carry 150 KB of
// weights and optimizer state. A checkpoint that loads is then used: the restored loader packs a batch.
//
// XSA_FUZZ_WRITE_SEEDS=DIR ./fuzz_checkpoint writes the tiny checkpoint's header to DIR twice, without its
// "checksums" (as a checkpoint from before them: a mutated metadata value then reaches load_checkpoint's own
// checks instead of the header's checksum) and with them, the whole file, and a small checksummed weights file
// (a seed of fuzz_safetensors), and exits.
#define TRAIN_GPT_NO_MAIN  // train_gpt.cu as a library, as test_xsa.cu and eval_core.cpp use it
#include "train_gpt.cu"
#include "dev/fuzz/fuzz_util.h"

struct Tiny {
    GPT model;
    Optimizer opt;
    DataLoader data;
    LoopState loop;
    std::vector<uint8_t> data_section;  // of the real checkpoint
};
static Tiny g;
static FuzzFile g_file;

extern "C" int LLVMFuzzerInitialize(int*, char***) {
    try {
        const char* tmp = getenv("TMPDIR");  // run_fuzz.py points it into its working directory
        std::string dir_name = std::string(tmp && *tmp ? tmp : "/tmp") + "/xsa_fuzz_checkpoint_XXXXXX";
        char* dir = &dir_name[0];
        if (!mkdtemp(dir)) fail("cannot create a temporary directory: %s", strerror(errno));
        const std::string shard = std::string(dir) + "/train_000000.bin", ckpt = std::string(dir) + "/ckpt_000003.safetensors";
        // a shard of 300 documents of 1 to 20 tokens, BOS 0
        Rng rng{5};
        std::vector<uint32_t> tokens;
        for (int d = 0; d < 300; d++) {
            tokens.push_back(0);
            for (int i = 0, n = 1 + (int)(rng_next_u64(&rng) % 20); i < n; i++) tokens.push_back(1 + (uint32_t)(rng_next_u64(&rng) % 63));
        }
        int32_t header[256] = {SHARD_MAGIC, 2, (int32_t)tokens.size(), 0};
        FILE* f = fopen(shard.c_str(), "wb");
        if (!f || fwrite(header, 4, 256, f) != 256 || fwrite(tokens.data(), 4, tokens.size(), f) != tokens.size() || fclose(f) != 0)
            fail("cannot write '%s'", shard.c_str());

        GPTConfig c;
        c.vocab_size = 64;
        c.padded_vocab = padded_vocab_size(64);
        c.n_layer = 2;
        c.n_embd = 24;
        c.n_head = 2;
        c.n_kv_head = 1;
        c.head_dim = 12;
        c.seq_len = 16;
        c.short_window = 4;
        c.window_pattern = "SL";
        c.xsa_alpha = 1.0f;
        c.xsa_layer = {false, true};
        OptimArgs a;
        a.total_batch = 2 * 16;
        a.num_iterations = 6;
        a.warmup_steps = 2;
        TrainingPlan plan = plan_training(c, a);
        gpt_build(&g.model, c);
        gpt_init_weights(&g.model, 3);
        optimizer_init(&g.opt, &g.model, plan.optim);
        dataloader_init(&g.data, shard, "training shard", 64, 0, 2, 16, 0, 1);
        g.data.buffer_target = 16;  // a short loader state: quicker to restore, more of it mutated
        g.data.chunk_docs = 8;
        for (int s = 0; s < 3; s++) g.loop.smooth_loss = train_step(&g.model, &g.opt, &g.data, 1, s).loss;
        g.loop.step = 3;
        save_checkpoint(ckpt, &g.model, &g.opt, &g.data, &g.data, g.loop);  // (the shard as the validation data too)
        std::vector<uint8_t> file = fuzz_read_all(ckpt);
        uint64_t header_len;
        memcpy(&header_len, file.data(), 8);
        g.data_section.assign(file.begin() + 8 + header_len, file.end());
        if (const char* out = getenv("XSA_FUZZ_WRITE_SEEDS")) {
            // the same file without its checksums (the same tensors in the same order: the same data section)
            const SafetensorsFile st = safetensors_read(ckpt);
            std::vector<SafeTensorOut> tensors;
            for (const SafeTensor& t : st.tensors) tensors.push_back({t.name, t.dtype, t.shape, st.data.data() + t.begin});
            const std::string plain = std::string(dir) + "/plain.safetensors";
            safetensors_write(plain, st.metadata, tensors, false);
            std::vector<uint8_t> unchecked = fuzz_read_all(plain);
            uint64_t plain_len;
            memcpy(&plain_len, unchecked.data(), 8);
            fuzz_write_seed(out, "tiny_checkpoint_header", unchecked.data() + 8, plain_len);
            fuzz_write_seed(out, "tiny_checkpoint_header_checksums", file.data() + 8, header_len);
            // a small weights file with checksums: the model's scalar tensors
            std::vector<SafeTensorOut> small;
            for (const ParamTensor& t : g.model.table)
                if (t.numel <= 24) small.push_back({t.name, "F32", t.shape, g.model.params_host + t.offset});
            safetensors_write(std::string(out) + "/checksummed_small.safetensors", model_metadata(&g.model), small);
            const std::string whole = std::string(out) + "/tiny_checkpoint.safetensors";
            if (rename(ckpt.c_str(), whole.c_str()) != 0 && system(("cp '" + ckpt + "' '" + whole + "'").c_str()) != 0) exit(1);
            printf("wrote %s\n", whole.c_str());
        }
        // the shard stays: load_checkpoint reads it again (the data fingerprint)
        static std::string g_dir = dir;
        atexit([] {
            if (system(("rm -rf '" + g_dir + "'").c_str()) != 0) fprintf(stderr, "warning: could not remove %s\n", g_dir.c_str());
        });
        if (getenv("XSA_FUZZ_WRITE_SEEDS")) exit(0);
    } catch (const FuzzReject& r) {
        fprintf(stderr, "fuzz_checkpoint: setting up the tiny model failed: %s\n", r.msg);
        exit(1);
    }
    g_file = fuzz_file("checkpoint");
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    std::vector<uint8_t> file(8);
    const uint64_t header_len = size;
    memcpy(file.data(), &header_len, 8);
    file.insert(file.end(), data, data + size);
    file.insert(file.end(), g.data_section.begin(), g.data_section.end());
    const std::string& path = fuzz_write(g_file, file.data(), file.size());
    // eval_core's and --init-from's path: a model configuration from the metadata
    fuzz_parse(path, [&] {
        SafetensorsFile st = safetensors_read(path);
        GPTConfig c = config_from_metadata(st);
        (void)c;
    });
    // --resume's path, into the tiny model
    if (fuzz_parse(path, [&] { load_checkpoint(path, &g.model, &g.opt, &g.data, &g.data, &g.loop, false); })) dataloader_next_batch(&g.data);
    return 0;
}

// A third of the mutations are structural (fuzz_mutate_json: shifted data_offsets, edge values in the
// metadata, shapes and offsets); the rest are libFuzzer's own.
extern "C" size_t LLVMFuzzerMutate(uint8_t* data, size_t size, size_t max_size);
extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size, unsigned int seed) {
    if (seed % 3 == 0) {
        std::string json((const char*)data, size);
        if (fuzz_mutate_json(&json, seed / 3) && json.size() <= max_size) {
            memcpy(data, json.data(), json.size());
            return json.size();
        }
    }
    return LLVMFuzzerMutate(data, size, max_size);
}
