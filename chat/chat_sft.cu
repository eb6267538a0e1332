/*
chat_sft.cu: SFT, nanochat's chat_sft, on a model trained by train_gpt (dev/docs/optim.md#sft).

    make chat_sft
    ./chat_sft --init-from out/ckpt_000150.safetensors --sft dev/data/sft_mini_tokens -o sft

Fine-tunes the model of --init-from (a base checkpoint, whose optimizer state warm-starts it, or exported
weights) on the conversations DIR/sft_train.bin that dev/data/sft.py writes, for one epoch (or -n steps),
with nanochat's SFT plan: the base run's optimizer, lrs and total batch (each lr x --init-lr-frac), the lr
following the fraction of the data read, Muon's momentum 0.85 -> 0.95 over 300 steps. Val bpb on
DIR/sft_val.bin (the masked tokens only) and ChatCORE (chatcore_evaluate.h) at its own intervals. The
model, its XSA settings and its tokenizer come from the base run's file. Everything else is train_gpt's:
this file builds on train_gpt.cu as a library and drives its training loop (run_train) with the SFT loader
(sft_loader.h) instead of the token shards.
*/
#define TRAIN_GPT_NO_MAIN
#include "../train_gpt.cu"
#include "sft.h"
#include "chatcore_evaluate.h"

// An SFT run: train_gpt's Run on conversations, and what only SFT has
struct SftRun {
    Run<SftLoader> run;
    SftArgs sft;
    std::vector<ChatTask> chat_tasks;  // ChatCORE's tasks (empty: off)
    std::string source;                // the base model's file, or the checkpoint to resume
};

static const char* const SFT_USAGE =
        "usage: chat_sft --init-from BASE --sft DIR [options]   (every option takes a value)\n"
        "\n"
        "SFT (nanochat's chat_sft: dev/docs/optim.md#sft). The model, its XSA settings, lrs, -B and tokenizer\n"
        "come from the base run's file.\n"
        "  --init-from FILE       the base model: a checkpoint of train_gpt (its optimizer state warm-starts\n"
        "                         SFT) or exported weights\n"
        "  --sft DIR              the conversations DIR/sft_train.bin (one epoch, or -n steps) and DIR/sft_val.bin\n"
        "                         (dev/data/sft.py writes them)\n"
        "  --init-lr-frac F       every lr x F (0.8)\n"
        "  --warmup-ratio F       lr warmup over this fraction of the data (0)\n"
        "  --warmdown-ratio F     lr warmdown over the last fraction of the data (0.5)\n"
        "  --final-lr-frac F      lr multiplier at the end of the warmdown (0)\n"
        "  --matrix-lr F, --embedding-lr F, --unembedding-lr F  the base run's lrs unless given\n"
        "  --load-optimizer 0|1   warm-start the optimizer from the base checkpoint (default 1)\n"
        "  -b, --batch N          rows per micro-batch (default: the base run's)\n"
        "  -B, --total-batch N    tokens per optimizer step (default: the base run's)\n"
        "  -n, --steps N          optimizer steps (default: one epoch; 0 = print the model and the plan)\n"
        "  --tokenizer FILE       the base model's tokenizer, if not where its file says\n"
        "Evaluation\n"
        "  --eval-every N         val bpb every N steps, and at step 0 and the end (200)\n"
        "  --eval-tokens N        tokens per validation pass (40 x 524288, capped at one pass)\n"
        "  --chatcore-every N     ChatCORE every N steps and at the end (200; -1 = never)\n"
        "  --chatcore-tasks DIR   task files from dev/data/chat_eval.py (default dev/data/chat_tasks for the embedded\n"
        "                         tokenizer, else chat_tasks/ beside the model's tokenizer file)\n"
        "  --chatcore-max-cat N   items per categorical task (ARC, MMLU) (-1 = all)\n"
        "  --chatcore-max-sample N  items per generative task (GSM8K, HumanEval) (24)\n";

static const char* const SFT_USAGE_MORE = "Finer settings and debugging (rarely set)\n";

// Without --init-from: the option a resume refuses (the run goes on from its own checkpoint), left out of the
// arguments a stopped run recorded and of the command it prints to resume.
static std::vector<std::string> without_init_from(std::vector<std::string> words) {
    for (size_t i = 0; i < words.size();) {
        if (words[i] == "--init-from") words.erase(words.begin() + i, words.begin() + std::min(words.size(), i + 2));
        else i++;
    }
    return words;
}

// The options, as words (argument_words: "--name=value" split in two); on --resume DIR, after the arguments the run
// recorded in DIR/metrics.jsonl (recorded_arguments), so that `--resume DIR` alone goes on as the run started.
static void parse_sft_args(SftRun* s, const std::vector<std::string>& words) {
    std::vector<char*> argv_words = {(char*)"chat_sft"};
    for (const std::string& w : words) argv_words.push_back((char*)w.c_str());
    const int argc = (int)argv_words.size();
    char** argv = argv_words.data();
    Args& args = s->run.args;
    SftArgs& sft = s->sft;
    args.eval_every = 200;  // chat_sft's defaults
    args.eval_tokens = 40L * 524288;
    args.core_every = -1;  // CORE is the base model's metric; samples of base-style prompts say little of a chat model
    args.sample_every = -1;
    args.tokenizer_path.clear();  // the base model's own
    parse_command_line(argc, argv, std::string(SFT_USAGE) + RUN_USAGE + SFT_USAGE_MORE + RUN_USAGE_MORE, [&](const std::string& flag, const char* value) {
        const char* f = flag.c_str();
        auto lr = [&] {  // given, an lr must be >= 0 (-1, the unset value, is not one a user can give)
            const double v = parse_double(f, value);
            if (v < 0.0) fail("%s must be >= 0, got %g", f, v);
            return v;
        };
        if (flag == "--sft") sft.dir = value;
        else if (flag == "--init-lr-frac") sft.init_lr_frac = parse_double(f, value);
        else if (flag == "--warmup-ratio") sft.warmup_ratio = parse_double(f, value);
        else if (flag == "--warmdown-ratio") sft.warmdown_ratio = parse_double(f, value);
        else if (flag == "--final-lr-frac") sft.final_lr_frac = parse_double(f, value);
        else if (flag == "--matrix-lr") sft.matrix_lr = lr();
        else if (flag == "--embedding-lr") sft.embedding_lr = lr();
        else if (flag == "--unembedding-lr") sft.unembedding_lr = lr();
        else if (flag == "--load-optimizer") sft.load_optimizer = parse_bool(f, value);
        else if (flag == "--chatcore-every") sft.chatcore_every = parse_int32(f, value);
        else if (flag == "--chatcore-tasks") sft.chatcore_dir = value;
        else if (flag == "--chatcore-max-cat") sft.chatcore_max_cat = parse_int32(f, value);
        else if (flag == "--chatcore-max-sample") sft.chatcore_max_sample = parse_int32(f, value);
        else return parse_run_flag(&args, flag, value);
        return true;
    });
    check_run_args(args);
    if (sft.dir.empty()) fail("chat_sft needs --sft DIR (the conversations dev/data/sft.py writes; see --help)");
    if (args.init_from.empty() && args.resume_dir.empty()) fail("chat_sft needs --init-from BASE (a checkpoint of base training, or exported weights)");
    if (!(sft.init_lr_frac > 0.0)) fail("--init-lr-frac must be > 0, got %g", sft.init_lr_frac);
    if (!(sft.warmup_ratio >= 0.0 && sft.warmup_ratio <= 1.0)) fail("--warmup-ratio must be in [0, 1], got %g", sft.warmup_ratio);
    if (!(sft.warmdown_ratio >= 0.0 && sft.warmdown_ratio <= 1.0)) fail("--warmdown-ratio must be in [0, 1], got %g", sft.warmdown_ratio);
    if (!(sft.final_lr_frac >= 0.0 && sft.final_lr_frac <= 1.0)) fail("--final-lr-frac must be in [0, 1], got %g", sft.final_lr_frac);
    if (sft.chatcore_every < 1 && sft.chatcore_every != -1) fail("--chatcore-every must be >= 1 or -1, got %d", sft.chatcore_every);
    for (int v : {sft.chatcore_max_cat, sft.chatcore_max_sample})
        if (v < 1 && v != -1) fail("--chatcore-max-cat and --chatcore-max-sample must be >= 1 or -1, got %d", v);
    sft.total_batch = args.optim.total_batch;
}

// ----------------------------------------------------------------------------------------------------
// Set-up, ChatCORE, main

// The model, its tokenizer and how it was trained, from the base run's file (--init-from) or, on --resume,
// the SFT run's latest checkpoint; nanochat's SFT plan and the micro-batch. Leaves the file to read the
// weights from in s->source.
static void sft_setup_plan(SftRun* s) {
    Run<SftLoader>* run = &s->run;
    Args& a = run->args;
    const bool resuming = !a.resume_dir.empty();
    if (resuming && !a.init_from.empty())
        fail("--resume and --init-from exclude each other: an SFT run resumes from its own checkpoints (leave --init-from out)");
    s->source = resuming ? latest_checkpoint(a.resume_dir) : a.init_from;
    if (s->source.empty()) fail("--resume: no checkpoint ckpt_*.safetensors in '%s'", a.resume_dir.c_str());
    const std::string& source = s->source;
    SafetensorsFile file = safetensors_read(source);
    if (!file.metadata.count("n_layer"))
        fail("'%s' has no xsa-train model configuration: --init-from takes a checkpoint (ckpt_*.safetensors) or --export-safetensors weights",
             source.c_str());
    GPTConfig& c = a.config;
    c = config_from_metadata(file);
    const OptimConfig base = checkpoint_optim_config(file);
    if (resuming && !base.sft) fail("'%s' is a checkpoint of base training: resume it with train_gpt", source.c_str());
    if (a.tokenizer_path.empty()) {
        if (!file.metadata.count("tokenizer")) fail("'%s' does not name its tokenizer; pass --tokenizer FILE", source.c_str());
        a.tokenizer_path = file.meta("tokenizer");
    }
    tokenizer_load(&run->tok, a.tokenizer_path);
    if (file.metadata.count("tokenizer_fingerprint") && file.meta("tokenizer_fingerprint") != tokenizer_fingerprint(&run->tok))
        fail("'%s' was trained with another tokenizer than '%s' (fingerprints differ)", source.c_str(), a.tokenizer_path.c_str());
    if (run->tok.vocab_size != c.vocab_size)
        fail("the tokenizer '%s' has %d tokens, the model in '%s' %d", a.tokenizer_path.c_str(), run->tok.vocab_size, source.c_str(), c.vocab_size);
    sft_check_meta(s->sft.dir, a.tokenizer_path);  // the conversations were made with this tokenizer
    a.train_pattern = s->sft.dir + "/sft_train.bin";
    a.val_pattern = s->sft.dir + "/sft_val.bin";
    // Muon's weight decay: nanochat loads the base optimizer's state together with its last weight decay
    // (the cosine schedule's value at the last update, about 0), else 0; an SFT checkpoint holds its own
    const bool is_checkpoint = file.metadata.count("format") && file.meta("format") == CHECKPOINT_FORMAT;
    double muon_wd = 0.0;
    if (base.sft) muon_wd = base.muon_wd;
    else if (s->sft.load_optimizer && is_checkpoint) muon_wd = muon_weight_decay(base, (int)metadata_int(file, "optimizer_step", 1, INT_MAX) - 1);
    run->plan = plan_sft(c, base, a.optim, s->sft, muon_wd);
    if (a.batch < 0 && file.metadata.count("batch")) a.batch = (int)metadata_int(file, "batch", 1, INT_MAX);  // nanochat inherits it too
    run_setup_batch(run);
}

// The conversation loaders and the step count (one epoch, or -n), then the model and optimizer: the base
// model's weights and (with --load-optimizer 1, from a checkpoint) its optimizer state, or the SFT run's
// checkpoint; and the metrics log.
static void sft_setup(SftRun* s) {
    Run<SftLoader>* run = &s->run;
    Args& a = run->args;
    const SftArgs& sft = s->sft;
    const GPTConfig& c = a.config;
    const Tokenizer& tok = run->tok;
    const int world = g_ranks.world;
    sft_loader_init(&run->train, a.train_pattern, tok.vocab_size, tok.bos_id, run->B, run->T, g_ranks.rank, world,
                    a.steps > 0 ? (long)a.steps * run->accum : -1);
    sft_loader_init(&run->val, a.val_pattern, tok.vocab_size, tok.bos_id, run->B, run->T, 0, 1, -1);  // evaluate_bpb splits it
    sft_check_targets(run->train.file, true, tok.token_bytes);
    sft_check_targets(run->val.file, false, tok.token_bytes);
    const std::string identity = sft_data_identity(run->train.file, run->val.file);  // what checkpoints record of the data
    run->train.identity = identity;
    if (sft.chatcore_every > 0) {
        std::string dir = sft.chatcore_dir;
        if (dir.empty()) {  // the embedded bundle belongs to the embedded tokenizer; else the files made beside the tokenizer
            const size_t slash = a.tokenizer_path.rfind('/');
            const std::string beside = (slash == std::string::npos ? std::string(".") : a.tokenizer_path.substr(0, slash)) + "/chat_tasks";
            dir = a.tokenizer_path == "dev/data/devil/tokenizer.bin" ? "dev/data/chat_tasks" : beside;
            if (access((dir + "/index.txt").c_str(), R_OK) != 0) {
                printf("ChatCORE: off, no task files in %s (make them: python3 dev/data/chat_eval.py --tokenizer %s --out %s)\n", dir.c_str(),
                       a.tokenizer_path.c_str(), dir.c_str());
                dir.clear();
            }
        }
        if (!dir.empty()) {
            s->chat_tasks = chat_tasks_load(dir, tok.vocab_size, tok.bos_id);
            auto cap = [](int n) { return n > 0 ? "up to " + std::to_string(n) + " items" : std::string("all items"); };
            printf("ChatCORE: %zu tasks from %s (categorical: %s, generative: %s), every %d steps and at the end\n", s->chat_tasks.size(),
                   dir.c_str(), cap(sft.chatcore_max_cat).c_str(), cap(sft.chatcore_max_sample).c_str(), sft.chatcore_every);
        }
    }
    // --eval-tokens, capped at one pass over the validation conversations (nanochat's loader wraps around and
    // evaluates them again: its default of 40 x 524,288 tokens is ~1.7 passes over its validation mixture)
    SftLoader val_pass = run->val;
    while (!val_pass.last_batch) dataloader_next_batch(&val_pass);
    run->eval_steps = (int)std::max<long>(1, std::min<long>(a.eval_tokens / ((long)run->B * run->T), val_pass.batches));
    run->num_steps = a.steps > 0 ? a.steps : sft_epoch_steps(&run->train, run->accum);
    if (run->num_steps < 1) fail("'%s' fills less than one step of %ld tokens; set a smaller -B", a.train_pattern.c_str(), run->plan.total_batch);
    run->plan.num_iterations = run->plan.optim.num_iterations = run->num_steps;
    const ConversationFile &tf = run->train.file, &vf = run->val.file;
    printf("data: %llu conversations (%llu tokens) in %s, %llu in %s; %d steps (%s) x %ld tokens (%d micro-batch%s%s); %d batch%s per "
           "evaluation%s\n", (unsigned long long)tf.count, (unsigned long long)tf.ntokens, a.train_pattern.c_str(), (unsigned long long)vf.count,
           a.val_pattern.c_str(), run->num_steps, a.steps > 0 ? "-n" : "one epoch", run->plan.total_batch, run->accum, run->accum == 1 ? "" : "es",
           world > 1 ? (" on each of " + std::to_string(world) + " ranks").c_str() : "", run->eval_steps, run->eval_steps == 1 ? "" : "es",
           world > 1 ? ", shared by the ranks" : "");
    const OptimConfig& o = run->plan.optim;
    std::string lrs;
    for (int g = 0; g < NUM_GROUPS; g++) {
        char buf[64];
        snprintf(buf, sizeof buf, "%s%s %.6g", g ? ", " : "", GROUP_NAMES[g], o.lr[g]);
        lrs += buf;
    }
    printf("SFT plan: lrs %s (the base run's x %.3g, width-scaled) | warmup %.2f, warmdown %.2f of the data to %.3f | Muon wd %.4g | "
           "Muon momentum 0.85 -> 0.95 over 300 steps\n", lrs.c_str(), sft.init_lr_frac, o.warmup_ratio, o.warmdown_ratio, o.final_lr_frac, o.muon_wd);

    gpt_build(&run->model, c);
    run->model.tokenizer_path = a.tokenizer_path;
    run->model.tokenizer_fingerprint = tokenizer_fingerprint(&tok);
    optimizer_init(&run->opt, &run->model, o, optimizer_shards(a));
    if (a.overlap_reduce) optimizer_overlap_reduction(&run->opt, &run->model);
    run->out_dir = !a.output_dir.empty() ? a.output_dir : a.resume_dir;
    const std::string& source = s->source;
    if (!a.resume_dir.empty()) {
        if (!a.allow_other_data) sft_check_resume_data(source, a.resume_dir, s->sft.dir, &run->train);
        load_checkpoint(source, &run->model, &run->opt, &run->train, &run->loop, a.allow_other_data);
        run->train.identity = identity;  // (a checkpoint from before identities was compared by its legacy fingerprint)
        printf("resumed from %s at step %d\n", source.c_str(), run->loop.step);
        if (run->loop.step > run->num_steps) fail("'%s' is at step %d, past the %d steps of this run", source.c_str(), run->loop.step, run->num_steps);
    } else {
        SafetensorsFile file = safetensors_read(source);
        gpt_load_weights(&run->model, file);
        if (!s->sft.load_optimizer) {
            printf("weights loaded from %s; the optimizer starts fresh (--load-optimizer 0)\n", source.c_str());
        } else if (!file.find("optimizer.state")) {
            printf("warning: %s holds no optimizer state (exported weights): the optimizer starts fresh (nanochat finds SFT slightly worse "
                   "so; --init-from a checkpoint warm-starts it)\n", source.c_str());
        } else {
            optimizer_load_state(&run->opt, &run->model, file, source);
            run->opt.step = (int)metadata_int(file, "optimizer_step", 0, INT_MAX);  // AdamW's bias correction goes on from there
            printf("weights and optimizer state (momenta and second moments, %d updates) loaded from %s\n", run->opt.step, source.c_str());
        }
    }
    run_open_metrics(run);
}

// ChatCORE: the task table, the value, a metrics line and DIR/chatcore_STEP.csv.
static void sft_chatcore(SftRun* s, int step) {
    Run<SftLoader>* run = &s->run;
    const double t0 = wall_ms();
    const ChatResult r = chatcore_evaluate(&run->model, &run->tok, s->chat_tasks, s->sft.chatcore_max_cat, s->sft.chatcore_max_sample);
    if (g_ranks.rank == 0) chat_print(r);
    printf("step %d/%d | ChatCORE %s | %.1f s\n", step, run->num_steps, std::isfinite(r.chatcore) ? std::to_string(r.chatcore).c_str() : "n/a",
           (wall_ms() - t0) / 1000.0);
    if (run->metrics.fd < 0) return;
    JsonLine accuracy;
    for (const ChatTaskResult& t : r.tasks) accuracy.num(t.label.c_str(), t.accuracy, "%.8f");
    JsonLine line;
    line.num("step", (long long)step).str("kind", "chatcore");
    if (std::isfinite(r.chatcore)) line.num("chatcore", r.chatcore, "%.8f").num("chatcore_tasks", (long long)r.chatcore_tasks);
    if (std::isfinite(r.chatcore_cat)) line.num("chatcore_cat", r.chatcore_cat, "%.8f");
    metrics_write(&run->metrics, line.raw("accuracy", accuracy.text()));
    char name[64];
    snprintf(name, sizeof name, "/chatcore_%06d.csv", step);
    chat_write_csv(r, run->out_dir + name);
}

int main(int argc, char** argv) {
    openmp_short_spin(argv);  // first: it may start the program again (common.h says why)
    setvbuf(stdout, nullptr, _IOLBF, 0);  // every line reaches a pipe or log file as it is printed
    SftRun s;
    const std::vector<std::string> given = argument_words(argc, argv);
    const std::string resume = flag_value(given, "--resume");
    std::vector<std::string> words = resume.empty() ? given : without_init_from(recorded_arguments(resume, "chat_sft"));
    if (!resume.empty()) words.insert(words.end(), given.begin(), given.end());
    parse_sft_args(&s, words);
    s.run.program = "chat_sft";
    s.run.recorded_words = without_outputs(words);  // the run line's record: what a later --resume DIR alone takes again
    run_begin(&s.run, argc, argv);
    s.run.argv.resize(1);  // the command a stop prints to resume (run_stop: these words with --resume DIR)
    for (const std::string& w : without_init_from(words)) s.run.argv.push_back(w);
    sft_setup_plan(&s);
    if (s.run.args.steps == 0) return 0;  // -n 0: the model and the plan only
    sft_setup(&s);
    run_train(&s.run, [&](int step, bool last) {
        if (!s.chat_tasks.empty() && (last || step % s.sft.chatcore_every == 0)) sft_chatcore(&s, step);
    });
    return 0;
}
