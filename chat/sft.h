// sft.h: nanochat's chat_sft, the parts of it that are not the program (chat_sft.cu): its settings, its
// plan and schedules (the lr following the data read), the steps of an epoch, and what its checkpoints
// record of the data. Included after train_gpt.cu (as a library), whose training step and checkpoints take
// the SFT loader through these overloads.
#pragma once

#include "sft_loader.h"

// SFT's settings (nanochat's chat_sft flags and defaults)
struct SftArgs {
    std::string dir;              // --sft: DIR/sft_train.bin and DIR/sft_val.bin
    double init_lr_frac = 0.8;    // every lr x this
    double warmup_ratio = 0.0, warmdown_ratio = 0.5, final_lr_frac = 0.0;  // doubles, as nanochat's Python floats
    bool load_optimizer = true;   // warm-start the optimizer from the base checkpoint's state
    // the base run's, unless given (-1)
    double embedding_lr = -1.0, unembedding_lr = -1.0, matrix_lr = -1.0;
    long total_batch = -1;
    int chatcore_every = 200, chatcore_max_cat = -1, chatcore_max_sample = 24;
    std::string chatcore_dir;     // "": the default for the model's tokenizer (sft_setup)
};

// ----------------------------------------------------------------------------------------------------
// The data: resuming checks it, and rank counts

static std::string data_fingerprint(const SftLoader* dl) {
    Fnv1a fnv;
    fingerprint_file(&fnv, dl->file.path);
    return fnv.hex();
}

static uint64_t loader_data_seed(const SftLoader*) { return 0; }  // SFT's order is nanochat's

static void loader_restore_resharded(SftLoader*, const SafetensorsFile&, int ranks, const std::string& path) {
    fail("'%s' was written by %d ranks, this run has %d; an SFT run resumes only on its number of ranks: --ranks %d", path.c_str(), ranks,
         g_ranks.world, ranks);
}

// The steps of one SFT epoch. nanochat draws each batch one ahead and stops before the step after the one
// whose draw took the last conversation: with L the batch that took it, after ceil((L - 1) / accum) steps.
// Counted by packing a copy of the loader to the end (which also checks every conversation of the epoch);
// with several ranks, the fewest of any rank (nanochat stops all ranks when the first is done).
static int sft_epoch_steps(const SftLoader* train, int accum) {
    SftLoader probe = *train;  // shares the file's mapping, which outlives it
    while (!probe.last_batch) dataloader_next_batch(&probe);
    const long steps = (probe.batches - 1 + accum - 1) / accum;
    long fewest = steps;
    for (const std::vector<int64_t>& r : ranks_gather({steps})) fewest = std::min<long>(fewest, r[0]);
    if (fewest > INT_MAX) fail("one epoch of '%s' is %ld steps; set -n", train->file.path.c_str(), fewest);
    return (int)fewest;
}

// The data read at an update, as nanochat's lr schedule sees it: after the step's batches and the next
// one (drawn ahead), capped at 1 (nanochat's can pass 1 by a few conversations on the last step and make
// its lr slightly negative); the largest over the ranks, so that every rank applies the same update.
static double sft_progress(const SftLoader* train) {
    SftLoader ahead = *train;
    dataloader_next_batch(&ahead);
    std::vector<double> progress(g_ranks.world, 0.0);
    progress[g_ranks.rank] = std::min(1.0, ahead.progress);
    ranks_sum_doubles(progress.data(), progress.size());
    return *std::max_element(progress.begin(), progress.end());
}

// ----------------------------------------------------------------------------------------------------
// The plan and the schedules

// SFT's (nanochat's chat_sft) at update `it`, when `progress` of the data has been read (the fraction of the
// conversations taken, or of the -n steps): lr multiplier linear warmup, flat, linear warmdown to
// final_lr_frac; Muon momentum 0.85 -> 0.95 over the first 300 updates; Muon weight decay constant.
static UpdateSchedule sft_schedule(const OptimConfig& o, int it, double progress) {
    double lrm = 1.0;
    if (progress < o.warmup_ratio) lrm = (progress + 1e-8) / o.warmup_ratio;
    else if (progress > 1.0 - o.warmdown_ratio) {
        const double decay = (progress - (1.0 - o.warmdown_ratio)) / o.warmdown_ratio;
        lrm = (1.0 - decay) * 1.0 + decay * o.final_lr_frac;
    }
    const double frac = std::min(it / 300.0, 1.0);
    return {lrm, (1.0 - frac) * 0.85 + frac * 0.95, o.muon_wd};
}

// The schedules of an SFT step (train_gpt.cu's run_train_step calls it with the loader it trains on)
static UpdateSchedule update_schedule(const OptimConfig& o, const SftLoader* train, int step) { return sft_schedule(o, step, sft_progress(train)); }

// The optimizer settings a checkpoint was written with (optim.* metadata). Exported weights have none: then
// nanochat's defaults (Muon with MuonEq and Muon+, base_train's lrs) and no total batch (0).
static OptimConfig checkpoint_optim_config(const SafetensorsFile& f) {
    OptimConfig o;
    OptimArgs defaults;
    o.given_embedding_lr = defaults.embedding_lr;
    o.given_unembedding_lr = defaults.unembedding_lr;
    o.given_matrix_lr = defaults.matrix_lr;
    o.given_xsa_lr = defaults.xsa_lr;
    if (f.metadata.count("optim.muon_eq") == 0) return o;
    auto flag = [&](const char* key) { return metadata_int(f, key, 0, 1) == 1; };
    auto number = [&](const char* key, double* out) {
        if (f.metadata.count(key)) *out = metadata_double(f, key);
    };
    o.adamw_only = flag("optim.adamw_only");
    o.muon_eq = flag("optim.muon_eq");
    o.muon_plus = flag("optim.muon_plus");
    o.sft = f.metadata.count("optim.sft") && flag("optim.sft");
    o.muon_wd = metadata_double(f, "optim.muon_wd");
    o.num_iterations = (int)metadata_int(f, "optim.num_iterations", 0, INT_MAX);
    number("optim.given_embedding_lr", &o.given_embedding_lr);
    number("optim.given_unembedding_lr", &o.given_unembedding_lr);
    number("optim.given_matrix_lr", &o.given_matrix_lr);
    number("optim.given_xsa_lr", &o.given_xsa_lr);
    if (f.metadata.count("optim.total_batch")) o.total_batch = metadata_int(f, "optim.total_batch", 0, LONG_MAX);
    return o;
}

// SFT's plan (nanochat's chat_sft): the base run's optimizer (`base`: Muon variant or AdamW mode) with the
// lrs its command line gave (unless given here), each x init_lr_frac and scaled by the width rule only
// (nanochat's setup_optimizer, without the batch scaling); the scalar and smear lrs at their flags'
// defaults (nanochat's setup_optimizer defaults: chat_sft does not inherit them); the base run's total
// batch; Muon's weight decay `muon_wd` throughout; num_iterations is set once the data is counted.
static TrainingPlan plan_sft(const GPTConfig& model, const OptimConfig& base, const OptimArgs& flags, const SftArgs& a, double muon_wd) {
    TrainingPlan plan = {};
    OptimConfig& o = plan.optim;
    o.adamw_only = base.adamw_only;
    o.muon_eq = base.muon_eq;
    o.muon_plus = base.muon_plus;
    o.sft = true;
    o.given_embedding_lr = a.embedding_lr >= 0.0 ? a.embedding_lr : base.given_embedding_lr;
    o.given_unembedding_lr = a.unembedding_lr >= 0.0 ? a.unembedding_lr : base.given_unembedding_lr;
    o.given_matrix_lr = a.matrix_lr >= 0.0 ? a.matrix_lr : base.given_matrix_lr;
    o.given_xsa_lr = base.given_xsa_lr;
    plan.total_batch = o.total_batch = a.total_batch > 0 ? a.total_batch : base.total_batch;
    if (plan.total_batch <= 0) fail("the base model's file does not say its total batch (exported weights); give SFT's with -B");
    plan.batch_lr_scale = 1.0;
    plan.dmodel_lr_scale = pow((double)model.n_embd / 768.0, -0.5);
    set_group_lrs(&o, o.given_unembedding_lr, o.given_embedding_lr, flags.scalar_lr, flags.smear_lr, o.given_xsa_lr, o.given_matrix_lr,
                  plan.batch_lr_scale, plan.dmodel_lr_scale, a.init_lr_frac);
    o.muon_wd = muon_wd;
    o.matrix_adamw_wd = flags.adamw_matrix_wd;
    o.warmup_steps = 0;
    o.warmup_ratio = a.warmup_ratio;
    o.warmdown_ratio = a.warmdown_ratio;
    o.final_lr_frac = a.final_lr_frac;
    return plan;
}

