/*
chat_eval.cpp: ChatCORE (nanochat's chat metric, dev/docs/evaluation.md#chatcore) of a model that went through SFT.
    make chat_eval && ./chat_eval -e CHECKPOINT -c TASKDIR [--max-cat N] [--max-sample N] [-o results.csv] [--ranks N]
CHECKPOINT is a checkpoint (DIR/ckpt_STEP.safetensors) or weights exported with --export-safetensors.
TASKDIR holds the task files dev/data/chat_eval.py wrote with the model's tokenizer. The scoring is
chatcore_evaluate (chatcore_evaluate.h) and chatcore.h, the same code chat_sft runs with --chatcore-every.
HumanEval runs the model's code with python3 in separate processes (5 s and 256 MB each).
*/
#define TRAIN_GPT_NO_MAIN  // use train_gpt.cu as a library: everything but main()
#include "../train_gpt.cu"
#include "generation_args.h"
#include "chatcore_evaluate.h"

static void usage() {
    printf("usage: chat_eval -e CHECKPOINT -c TASKDIR [--max-cat N] [--max-sample N] [--max-new N] [-o results.csv] [--ranks N]\n"
           "  -e FILE          checkpoint or exported weights of a chat (SFT) model\n"
           "  -c DIR           ChatCORE task files from dev/data/chat_eval.py, tokenized with the model's tokenizer\n"
           "  --tokenizer FILE the model's tokenizer, if not where its file says\n"
           "  --max-cat N      the first N items of each categorical task (ARC, MMLU; default: all)\n"
           "  --max-sample N   the first N items of each generative task (GSM8K, HumanEval; default: all)\n"
           "  --max-new N      tokens per answer, at most (default 512, nanochat's)\n"
           "  -o FILE          write a per-task CSV\n"
           "  --answers FILE   write every item's verdict as a JSON line: task, item, correct, and the chosen letter's\n"
           "                   index (categorical) or the answer's text (generative); needs --ranks 1\n"
           "  --ranks N        split the items over N ranks (GPUs, or CPU processes)\n"
           "  --rendezvous FILE  ranks started by a launcher without MPI meet in FILE (see train_gpt --help)\n");
}

// An output file (-o, --answers) must be writable before the evaluation, not found unwritable after it: not a
// directory, in a directory that exists and can be written into.
static void check_output_file(const char* flag, const std::string& path) {
    struct stat st;
    if (stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) fail("%s '%s' is a directory; give a file name", flag, path.c_str());
    const size_t slash = path.rfind('/');
    const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
    if (stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) fail("%s '%s': the directory '%s' does not exist", flag, path.c_str(), dir.c_str());
    if (access(dir.c_str(), W_OK) != 0) fail("%s '%s': cannot write into '%s': %s", flag, path.c_str(), dir.c_str(), strerror(errno));
}

int main(int argc, char** argv) {
    openmp_short_spin(argv);  // first: it may start the program again (common.h says why)
    std::string weights, task_dir, csv, tokenizer, answers, rendezvous;
    int max_cat = -1, max_sample = -1, max_new = 512, ranks = 1;
    parse_options(argc, argv, usage, [&](const std::string& flag, const char* value) {
        if (flag == "-e") weights = value;
        else if (flag == "-c") task_dir = value;
        else if (flag == "-o") csv = value;
        else if (flag == "--answers") answers = value;
        else if (flag == "--tokenizer") tokenizer = value;
        else if (flag == "--max-cat") max_cat = parse_int32(flag.c_str(), value);
        else if (flag == "--max-sample") max_sample = parse_int32(flag.c_str(), value);
        else if (flag == "--max-new") max_new = parse_int32(flag.c_str(), value);
        else if (flag == "--ranks") ranks = parse_int32(flag.c_str(), value);
        else if (flag == "--rendezvous") rendezvous = value;
        else return false;
        return true;
    });
    if (weights.empty() || task_dir.empty()) fail("chat_eval needs -e CHECKPOINT and -c TASKDIR (see --help)");
    if ((max_cat < 1 && max_cat != -1) || (max_sample < 1 && max_sample != -1)) fail("--max-cat and --max-sample must be >= 1 (or -1: all)");
    if (max_new < 1) fail("--max-new must be >= 1, got %d", max_new);
    if (ranks < 1 || ranks > MAX_RANKS) fail("--ranks must be in [1, %d], got %d", MAX_RANKS, ranks);
    if (!answers.empty() && ranks > 1) fail("--answers needs --ranks 1 (each rank keeps its own answers)");
    if (!csv.empty()) check_output_file("-o", csv);
    if (!answers.empty()) check_output_file("--answers", answers);
    if (!csv.empty() && !answers.empty() && (csv == answers || same_file(csv, answers)))
        fail("-o and --answers name the same file '%s'; give each its own", csv.c_str());
    ranks_launch(ranks, rendezvous);
    if (!answers.empty() && g_ranks.world > 1) fail("--answers needs one rank (each rank keeps its own answers)");
    backend_init();
    GPT model;
    Tokenizer tok;
    load_model_and_tokenizer(&model, &tok, weights, tokenizer);
    const std::vector<ChatTask> tasks = chat_tasks_load(task_dir, tok.vocab_size, tok.bos_id);
    ranks_setup_done();
    const double t0 = wall_ms();
    const ChatResult result = chatcore_evaluate(&model, &tok, tasks, max_cat, max_sample, max_new);
    if (g_ranks.rank == 0) {
        chat_print(result);
        size_t items = 0;
        for (const ChatTaskResult& t : result.tasks) items += t.correct.size();
        printf("%zu items in %.1f s\n", items, (wall_ms() - t0) / 1000.0);
        if (!csv.empty()) {
            chat_write_csv(result, csv);
            printf("wrote %s\n", csv.c_str());
        }
        if (!answers.empty()) {
            std::string text;
            for (const ChatTaskResult& t : result.tasks)
                for (size_t i = 0; i < t.correct.size(); i++) {
                    JsonLine line;
                    line.str("task", t.label).num("item", (long long)i).num("correct", (long long)t.correct[i]);
                    if (t.kind == CHAT_CATEGORICAL) line.num("pred", (long long)t.pred[i]);
                    else line.str("answer", t.answers[i]);
                    text += line.text() + "\n";
                }
            AtomicFile out = atomic_open(answers);
            atomic_write(&out, text.data(), text.size());
            atomic_commit(&out);
            printf("wrote %s\n", answers.c_str());
        }
    }
    gpt_free(&model);
    return 0;
}
