// args.h: the command line of the two training programs, train_gpt and chat/chat_sft.cu: what a run is
// given (Args), the options both take (output, ranks, debugging; batch, steps and evaluation, which each
// documents in its own words), the parser (every option takes a value; an unknown one is answered with the
// nearest documented one), the default data, and the output paths checked before any work. Each program
// keeps its own options and usage beside its main. Part of train_gpt.cu, included after the optimizer
// (Args holds the model's and the optimizer's settings).
#pragma once

// The options train_gpt and chat/chat_sft.cu share (parse_run_flag): output and ranks
static const char* const RUN_USAGE =
        "Output\n"
        "  -o, --output DIR       write DIR/metrics.jsonl and checkpoints DIR/ckpt_STEP.safetensors\n"
        "  --save-every N         checkpoint every N steps (default -1: only at the end); needs -o\n"
        "  --keep-checkpoints K   keep only the K latest checkpoints, deleting older ones once a newer one is\n"
        "                         written (default -1: keep all; a d24 checkpoint is tens of GB)\n"
        "  --resume DIR           continue from the latest checkpoint in DIR, bit-identically (same flags)\n"
        "  --overwrite 0|1        with -o DIR: delete the files of an earlier run in DIR first (default 0: refused)\n"
        "  --new-log 0|1          with --resume DIR whose metrics.jsonl is lost: start a new one from the checkpoint\n"
        "                         (default 0: refused; give the run's flags again, its run line held them)\n"
        "  --export-safetensors FILE  write the final weights as safetensors (nanochat names, fp32)\n"
        "Distributed\n"
        "  --threads N            CPU threads per rank (default: $OMP_NUM_THREADS, else the cores, shared by the\n"
        "                         ranks on a machine): the speed only, the numbers are the same for any count\n"
        "  --ranks N              data parallel over N ranks: N GPUs (CUDA, with NCCL) or N processes (CPU);\n"
        "                         each rank trains on its share of every step's batch (default 1); across\n"
        "                         nodes, start one process per rank with mpirun, srun or a torchrun-style\n"
        "                         launcher instead (dev/docs/multinode.md)\n"
        "  --rendezvous FILE      ranks started by a launcher without MPI (RANK, WORLD_SIZE, LOCAL_RANK set)\n"
        "                         meet in FILE, a path every rank can reach (CPU: on this machine)\n";

// The shared options a run rarely sets: the end of the last group of each program's --help
static const char* const RUN_USAGE_MORE =
        "  --allow-other-data 0|1 with --resume: continue on training or validation shards other than the checkpoint's\n"
        "                         (default 0)\n"
        "  --shard-optimizer 0|1  with several ranks, split the optimizer's work and state over them as nanochat\n"
        "                         does (ZeRO-2; default 1), or let every rank run all of it (0); the same result\n"
        "  --overlap-reduce 0|1   CUDA with several ranks: sum each layer's gradient over the ranks while the\n"
        "                         backward goes on (default 1), or after it (0); the same result\n"
        "  --progress-every S     while an evaluation runs, a progress line every S seconds (30)\n"
        "  --xsa-fused 0|1        CUDA: XSA inside attention's kernels (default 1) or as its own kernels\n"
        "  --cuda-graphs 0|1      CUDA: replay each training micro-step as a CUDA graph (default 1)\n"
        "  --matmul-tune 0|1      CUDA: time cuBLASLt's candidate algorithms for each GEMM of the first micro-step and\n"
        "                         keep the fastest (default 1; checkpoints record the choice), or take the\n"
        "                         heuristic's first (0: two fresh runs then match bit for bit)\n"
        "  -h, --help             this text\n";

// The documented option nearest to an unknown one, from the program's usage text, so the list of options
// has one source; "" if none is near: an edit distance (letter case free) of at most a third of the
// option's length, and 3.
static std::string nearest_option(const std::string& usage, const std::string& unknown) {
    std::string best;
    size_t best_distance = SIZE_MAX;
    for (size_t i = usage.find("\n  -"); i != std::string::npos; i = usage.find("\n  -", i + 1)) {
        size_t p = i + 3;
        while (p < usage.size() && usage[p] == '-') {  // "-d, --depth N": every option name on the line
            const size_t end = usage.find_first_of(" ,=\n", p);
            const std::string name = usage.substr(p, end - p);
            std::vector<size_t> row(name.size() + 1);  // Levenshtein distance, one row at a time
            for (size_t j = 0; j <= name.size(); j++) row[j] = j;
            for (size_t a = 1; a <= unknown.size(); a++) {
                size_t diagonal = row[0];
                row[0] = a;
                for (size_t j = 1; j <= name.size(); j++) {
                    const size_t change = tolower((unsigned char)unknown[a - 1]) != tolower((unsigned char)name[j - 1]);
                    const size_t next = std::min({row[j] + 1, row[j - 1] + 1, diagonal + change});
                    diagonal = row[j];
                    row[j] = next;
                }
            }
            if (row[name.size()] < best_distance && row[name.size()] <= std::min<size_t>(3, name.size() / 3))
                best_distance = row[name.size()], best = name;
            p = usage.compare(end, 2, ", ") == 0 ? end + 2 : usage.size();
        }
    }
    return best;
}

struct Args {
    GPTConfig config;
    OptimArgs optim;
    std::string train_pattern = "dev/data/devil/train_*.bin", val_pattern = "dev/data/devil/val_*.bin";
    std::string tokenizer_path = "dev/data/devil/tokenizer.bin";
    std::string output_dir, resume_dir, init_from, export_path;
    bool allow_other_data = false;
    bool overwrite = false;  // --overwrite: -o DIR may hold an earlier run's files, deleted before this run writes
    bool new_log = false;    // --new-log: --resume DIR without DIR/metrics.jsonl starts a new one
    int batch = -1;  // -1: default_batch
    int steps = -1;
    uint64_t seed = 42;
    uint64_t data_seed = 0;  // --data-seed (train_gpt): 0 = the row groups in order
    int eval_every = 250;
    long eval_tokens = 80L * 524288;
    int sample_every = 2000;
    int save_every = -1;
    int keep_checkpoints = -1;  // -1: all
    bool xsa_fused = true;
    bool cuda_graphs = true;
    bool matmul_tune = true;
    int ranks = 1;
    int threads = -1;  // --threads: -1 = OpenMP's default (OMP_NUM_THREADS, or the cores shared by the ranks)
    std::string rendezvous;
    bool shard_optimizer = true;
    bool overlap_reduce = true;
    int core_every = 2000;
    int core_max_per_task = 500;
    std::string core_dir = "dev/data/core_tasks";
    float progress_every = 30.0f;  // seconds
};

// Without -i, -j and --tokenizer: the ClimbMix shards dev/data/climbmix.py wrote into its default directory
// (~/.cache/xsa-train/climbmix, or $XSA_DATA_DIR), when they are there, with the CORE task files that
// dev/data/core.py made for them in its core/ (else CORE is off: the embedded tasks belong to the embedded
// tokenizer); otherwise the embedded corpus.
// report: say what was found (not when parsing a resumed run's recorded arguments, which the resume parses again)
static void default_data(Args* args, bool core_given, bool report) {
    const char* env = getenv("XSA_DATA_DIR");
    if (env && !strcmp(env, "none")) return;  // XSA_DATA_DIR=none: the embedded corpus whatever the cache holds (the test suites)
    const char* home = getenv("HOME");
    const std::string dir = env && *env ? env : std::string(home ? home : "") + "/.cache/xsa-train/climbmix";
    auto exists = [](const std::string& pattern) { return !matching_files(pattern).empty(); };
    if (!exists(dir + "/tokenizer.bin") || !exists(dir + "/train_*.bin") || !exists(dir + "/val_*.bin")) {
        if (env && *env)  // named on purpose: never a silent fallback to the embedded corpus
            fail("XSA_DATA_DIR is '%s', which lacks %s (python3 dev/data/climbmix.py --out %s prepares it; unset XSA_DATA_DIR for the "
                 "embedded corpus)", dir.c_str(), !exists(dir + "/tokenizer.bin") ? "tokenizer.bin" : !exists(dir + "/train_*.bin") ? "train_*.bin" : "val_*.bin",
                 dir.c_str());
        return;
    }
    args->train_pattern = dir + "/train_*.bin";
    args->val_pattern = dir + "/val_*.bin";
    args->tokenizer_path = dir + "/tokenizer.bin";
    if (report) printf("data: the ClimbMix shards in %s (found there; -i, -j and --tokenizer choose others)\n", dir.c_str());
    if (core_given || args->core_every < 0) return;
    if (exists(dir + "/core/*.bin")) {
        args->core_dir = dir + "/core";
    } else {
        args->core_every = -1;
        if (report) printf("CORE: off, no task files in %s/core (make them: python3 dev/data/core.py --bundle-zip --tokenizer %s/tokenizer.bin "
               "--out %s/core --max-per-task %d)\n", dir.c_str(), dir.c_str(), dir.c_str(), args->core_max_per_task);
    }
}

// The ranks that share the optimizer's work: all of them, unless --shard-optimizer 0.
static int optimizer_shards(const Args& a) { return a.shard_optimizer ? g_ranks.world : 1; }

// The command line of train_gpt and chat_sft: every option takes a value (-d 12, --depth 12 or --depth=12);
// -h / --help prints `usage` and exits 0; handle(flag, value) returns false for an unknown option, which is
// refused with the documented option nearest to it. Returns the options given, in order.
template <typename Handler>
static std::vector<std::string> parse_command_line(int argc, char** argv, const std::string& usage, Handler handle) {
    std::vector<std::string> given;
    for (int i = 1; i < argc; i++) {
        std::string flag = argv[i];
        if (flag == "-h" || flag == "--help") {
            fputs(usage.c_str(), stdout);
            exit(0);
        }
        if (flag.empty() || flag[0] != '-')  // e.g. `./train_gpt out`: a directory given without -o
            fail("'%s' is not an option (options start with -; every option takes a value, e.g. -o %s to write into %s; see --help)",
                 flag.c_str(), flag.c_str(), flag.c_str());
        std::string inline_value;  // --name=value is the same as --name value
        const size_t eq = flag.find('=');
        const bool has_inline = flag.rfind("--", 0) == 0 && eq != std::string::npos;
        if (has_inline) {
            inline_value = flag.substr(eq + 1);
            flag = flag.substr(0, eq);
        } else if (i + 1 >= argc) fail("option %s needs a value (see --help)", flag.c_str());
        const char* value = has_inline ? inline_value.c_str() : argv[++i];
        given.push_back(flag);
        if (*value == '\0') fail("option %s needs a value, got an empty one", flag.c_str());
        if (handle(flag, value)) continue;
        if (const std::string near = nearest_option(usage, flag); !near.empty())
            fail("unknown option '%s'; did you mean %s? (see --help)", flag.c_str(), near.c_str());
        fail("unknown option '%s' (see --help)", flag.c_str());
    }
    return given;
}

// A value given must be valid: -1 never silently means "the default".
static long at_least(const char* flag, long v, long lo) {
    if (v < lo) fail("%s must be >= %ld, got %ld", flag, lo, v);
    return v;
}

// The options both programs take (RUN_USAGE, and the batch, steps, evaluation and tokenizer options each
// documents in its own words); false for any other.
static bool parse_run_flag(Args* args, const std::string& flag, const char* value) {
    const char* f = flag.c_str();
    if (flag == "-b" || flag == "--batch") args->batch = (int)at_least(f, parse_int32(f, value), 1);
    else if (flag == "-B" || flag == "--total-batch") args->optim.total_batch = at_least(f, parse_int(f, value), 1);
    else if (flag == "-n" || flag == "--steps") args->steps = (int)at_least(f, parse_int32(f, value), 0);
    else if (flag == "--tokenizer") args->tokenizer_path = value;
    else if (flag == "--eval-every") args->eval_every = parse_int32(f, value);
    else if (flag == "--eval-tokens") args->eval_tokens = parse_int(f, value);
    else if (flag == "--progress-every") args->progress_every = parse_double(f, value);
    else if (flag == "-o" || flag == "--output") args->output_dir = value;
    else if (flag == "--save-every") args->save_every = parse_int32(f, value);
    else if (flag == "--keep-checkpoints") args->keep_checkpoints = parse_int32(f, value);
    else if (flag == "--resume") args->resume_dir = value;
    else if (flag == "--allow-other-data") args->allow_other_data = parse_bool(f, value);
    else if (flag == "--overwrite") args->overwrite = parse_bool(f, value);
    else if (flag == "--new-log") args->new_log = parse_bool(f, value);
    else if (flag == "--init-from") args->init_from = value;
    else if (flag == "--export-safetensors") args->export_path = value;
    else if (flag == "--ranks") args->ranks = parse_int32(f, value);
    else if (flag == "--threads") args->threads = (int)at_least(f, parse_int32(f, value), 1);
    else if (flag == "--rendezvous") args->rendezvous = value;
    else if (flag == "--shard-optimizer") args->shard_optimizer = parse_bool(f, value);
    else if (flag == "--overlap-reduce") args->overlap_reduce = parse_bool(f, value);
    else if (flag == "--xsa-fused") args->xsa_fused = parse_bool(f, value);
    else if (flag == "--cuda-graphs") args->cuda_graphs = parse_bool(f, value);
    else if (flag == "--matmul-tune") args->matmul_tune = parse_bool(f, value);
    else return false;
    return true;
}

// ----------------------------------------------------------------------------------------------------
// --resume DIR alone: a run records its arguments (but its output options) as "argv" in its run line, the
// first line of DIR/metrics.jsonl; a resume puts them before its own, so that flags need not be typed again.

// The arguments as words, each "--name=value" split in two (so that a flag's value is always the next word).
static std::vector<std::string> argument_words(int argc, char** argv) {
    std::vector<std::string> words;
    for (int i = 1; i < argc; i++) {
        const std::string w = argv[i];
        const size_t eq = w.find('=');
        if (w.rfind("--", 0) == 0 && eq != std::string::npos) {
            words.push_back(w.substr(0, eq));
            words.push_back(w.substr(eq + 1));
        } else {
            words.push_back(w);
        }
    }
    return words;
}

// The value of the last `flag` among the words ("" if none).
static std::string flag_value(const std::vector<std::string>& words, const char* flag) {
    std::string value;
    for (size_t i = 0; i + 1 < words.size(); i++)
        if (words[i] == flag) value = words[++i];
    return value;
}

// The output options: where a run writes, whether it may overwrite, whether it starts a new log. A run does not record
// them, and the command a stopped run prints to resume it leaves them out (it gives --resume DIR).
static bool is_output_option(const std::string& flag) {
    return flag == "-o" || flag == "--output" || flag == "--resume" || flag == "--overwrite" || flag == "--new-log";
}

// The words without the output options: what a run records.
static std::vector<std::string> without_outputs(const std::vector<std::string>& words) {
    std::vector<std::string> kept;
    for (size_t i = 0; i < words.size(); i++) {
        if (is_output_option(words[i])) {
            i++;
            continue;
        }
        kept.push_back(words[i]);
    }
    return kept;
}

// The words as a JSON array (the run line's "argv")
static std::string json_words(const std::vector<std::string>& words) {
    std::string json = "[";
    for (size_t i = 0; i < words.size(); i++) json += (i ? ", \"" : "\"") + json_escape(words[i]) + "\"";
    return json + "]";
}

// The arguments the run in `dir` recorded, from the first line of dir/metrics.jsonl; none when it has no such
// line, no "argv" in it (a run from before they were recorded: its flags are given again, as then) or when it
// was run by another program than `program` (its arguments are not this one's; the checkpoint check says why).
static std::vector<std::string> recorded_arguments(const std::string& dir, const char* program) {
    std::vector<std::string> words;
    struct stat st;  // (not a regular file, e.g. a FIFO that would block: check_resume_log says so)
    if (stat((dir + "/metrics.jsonl").c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return words;
    FILE* f = fopen((dir + "/metrics.jsonl").c_str(), "rb");
    if (!f) return words;
    std::string line;
    for (int c; (c = fgetc(f)) != EOF && c != '\n';) line += (char)c;
    fclose(f);
    // "argv" is the run line's last key, and a key's text cannot occur unescaped inside a string value
    const std::string tail = ", \"argv\": [", by = ", \"program\": \"" + std::string(program) + "\"" + tail;
    const size_t at = line.rfind(tail);
    if (line.rfind("{\"step\": 0, \"kind\": \"run\"", 0) != 0 || at == std::string::npos || at < by.size() - tail.size() ||
        line.compare(at - (by.size() - tail.size()), by.size(), by) != 0)
        return words;
    const std::string path = dir + "/metrics.jsonl";
    JsonReader r{line, at + tail.size() - 1, path.c_str(), "run line"};
    r.expect('[');
    if (!r.consume(']')) {
        do words.push_back(r.string_value());
        while (r.consume(','));
        r.expect(']');
    }
    return words;
}

// The checks of parse_run_flag's values.
static void check_run_args(const Args& args) {
    if (args.ranks < 1 || args.ranks > MAX_RANKS) fail("--ranks must be in [1, %d], got %d", MAX_RANKS, args.ranks);
    if (args.eval_every < 1) fail("--eval-every must be >= 1, got %d", args.eval_every);
    if (args.eval_tokens < 1) fail("--eval-tokens must be >= 1, got %ld", args.eval_tokens);
    if (!(args.progress_every > 0.0f)) fail("--progress-every must be > 0 seconds, got %g", args.progress_every);
    if (args.save_every < 1 && args.save_every != -1) fail("--save-every must be >= 1 or -1, got %d", args.save_every);
    if (args.save_every > 0 && args.output_dir.empty() && args.resume_dir.empty()) fail("--save-every needs -o DIR for the checkpoints");
    if (args.keep_checkpoints < 1 && args.keep_checkpoints != -1) fail("--keep-checkpoints must be >= 1 or -1, got %d", args.keep_checkpoints);
}

// Before any work: creates the output directory (-o), and checks that a weights file goes into an existing
// directory, not onto a directory.
// The files a run writes into its directory: metrics.jsonl, checkpoints (and a .tmp a crash left), the CORE and
// ChatCORE tables. Another run's in -o DIR would mix with this one's (and "--resume DIR" would take the old
// checkpoint), so check_outputs refuses them unless --overwrite, and run_open_metrics deletes them then.
static std::vector<std::string> run_files(const std::string& dir) {
    std::vector<std::string> files;
    for (const char* pattern : {"/metrics.jsonl", "/ckpt_*.safetensors", "/ckpt_*.tmp", "/core_*.csv", "/chatcore_*.csv"})
        for (const std::string& f : matching_files(dir + pattern)) files.push_back(f);
    return files;
}

// Whether two paths name one existing file (device and inode: a link or another spelling of the path is the same)
static bool same_file(const std::string& x, const std::string& y) {
    struct stat sx, sy;
    return stat(x.c_str(), &sx) == 0 && stat(y.c_str(), &sy) == 0 && sx.st_dev == sy.st_dev && sx.st_ino == sy.st_ino;
}

// --export-safetensors must not overwrite what the run reads (its data, tokenizer, weights, CORE tasks) or its own
// files (checkpoints, metrics), existing ones or those it will write into its directory.
static void check_export_path(const Args& a) {
    const std::string& out = !a.output_dir.empty() ? a.output_dir : a.resume_dir;
    std::vector<std::string> files = {a.tokenizer_path, a.init_from};
    for (const std::string& pattern : {a.train_pattern, a.val_pattern, a.core_dir + "/*"})
        for (const std::string& f : matching_files(pattern)) files.push_back(f);
    if (!out.empty())
        for (const std::string& f : run_files(out)) files.push_back(f);
    for (const std::string& f : files)
        if (!f.empty() && same_file(a.export_path, f))
            fail("--export-safetensors '%s' is '%s', which this run reads or writes; export to another path", a.export_path.c_str(), f.c_str());
    const size_t slash = a.export_path.rfind('/');
    const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : a.export_path.substr(0, slash);
    const std::string name = a.export_path.substr(slash == std::string::npos ? 0 : slash + 1);
    if (!out.empty() && same_file(dir, out) && (name == "metrics.jsonl" || (name.rfind("ckpt_", 0) == 0 && name != "ckpt_best.safetensors")))
        fail("--export-safetensors '%s' is a name this run gives its own files in '%s'; export to another name", a.export_path.c_str(), out.c_str());
}

// --resume DIR needs the run's log, DIR/metrics.jsonl, beginning with its run line: it holds the run's settings
// (train_gpt takes its flags from there) and its metrics up to now, which the resumed run continues. Without it a
// resume would start a log with neither (and train_gpt would take the default settings), so it is refused unless
// --new-log 1 asks for a new log, started from the checkpoint with a run line of this command's flags.
static void check_resume_log(const Args& a) {
    const std::string path = a.resume_dir + "/metrics.jsonl";
    struct stat st;
    if (stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) fail("'%s' is not a regular file", path.c_str());
    FILE* f = fopen(path.c_str(), "rb");
    if (f == nullptr && errno != ENOENT) fail("--resume: cannot read '%s': %s", path.c_str(), strerror(errno));
    if (f == nullptr) {
        if (a.new_log) return;
        fail("--resume %s: the run's log '%s' is missing (its run line held the run's settings, and it holds the metrics so far): "
             "restore it, or add --new-log 1 to start a new metrics.jsonl from the checkpoint (give the run's flags again: the "
             "checkpoint checks those of the model and the optimizer)", a.resume_dir.c_str(), path.c_str());
    }
    char start[32] = "";
    const size_t got = fread(start, 1, sizeof start - 1, f);
    fclose(f);
    static const char RUN_LINE[] = "{\"step\": 0, \"kind\": \"run\"";
    const bool has_run_line = got >= sizeof RUN_LINE - 1 && memcmp(start, RUN_LINE, sizeof RUN_LINE - 1) == 0;
    if (a.new_log)
        fail("--new-log 1 starts a new metrics.jsonl in '%s', which has one%s: leave --new-log out%s", a.resume_dir.c_str(),
             has_run_line ? "" : " (without a run line)", has_run_line ? "" : ", or move the file away first");
    if (!has_run_line)
        fail("--resume %s: the run's log '%s' does not start with its run line ({\"step\": 0, \"kind\": \"run\", ...}, which holds "
             "the run's settings): restore it, or move it away and add --new-log 1 to start a new metrics.jsonl from the checkpoint "
             "(give the run's flags again)", a.resume_dir.c_str(), path.c_str());
}

static void check_outputs(const Args& a) {
    if (!a.resume_dir.empty()) {  // at once, before any set-up
        struct stat st;
        if (stat(a.resume_dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) fail("--resume: '%s' is not a directory", a.resume_dir.c_str());
        if (matching_files(a.resume_dir + "/ckpt_*.safetensors").empty())
            fail("--resume: no checkpoint ckpt_*.safetensors in '%s' (start a run with -o, and --save-every for checkpoints before the end)",
                 a.resume_dir.c_str());
        if (a.overwrite) fail("--overwrite 1 goes with -o DIR (a new run); --resume continues the run in '%s'", a.resume_dir.c_str());
        check_resume_log(a);
    } else if (a.new_log) {
        fail("--new-log 1 goes with --resume DIR (a run whose metrics.jsonl is lost)");
    }
    if (!a.output_dir.empty() && !a.overwrite) {
        const std::vector<std::string> old = run_files(a.output_dir);
        if (!old.empty())
            fail("'%s' holds another run's files (%s%s%s): continue it with --resume %s, or start over with --overwrite 1 (deletes them), "
                 "or choose another -o", a.output_dir.c_str(), old[0].c_str(), old.size() > 1 ? ", " : "",
                 old.size() > 1 ? (old.size() == 2 ? old[1] : old[1] + " and " + std::to_string(old.size() - 2) + " more").c_str() : "",
                 a.output_dir.c_str());
    }
    const std::string& out = !a.output_dir.empty() ? a.output_dir : a.resume_dir;
    if (!out.empty() && mkdir(out.c_str(), 0755) != 0 && errno != EEXIST) fail("cannot create '%s': %s", out.c_str(), strerror(errno));
    if (a.export_path.empty()) return;
    check_export_path(a);
    struct stat st;
    if (stat(a.export_path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) fail("--export-safetensors '%s' is a directory", a.export_path.c_str());
    const size_t slash = a.export_path.rfind('/');
    const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : a.export_path.substr(0, slash);
    if (stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
        fail("--export-safetensors '%s': the directory '%s' does not exist", a.export_path.c_str(), dir.c_str());
    if (access(dir.c_str(), W_OK) != 0) fail("--export-safetensors '%s': cannot write into '%s': %s", a.export_path.c_str(), dir.c_str(), strerror(errno));
}
