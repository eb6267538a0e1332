/*
eval_core.cpp: CORE (nanochat's in-context metric, dev/docs/evaluation.md#core) of a trained model, standalone.
    make eval_core && ./eval_core -e CHECKPOINT -c TASKDIR [-m MAX_PER_TASK] [-o results.csv]
CHECKPOINT is a checkpoint (DIR/ckpt_STEP.safetensors) or weights exported with --export-safetensors:
any safetensors file with our configuration metadata. TASKDIR holds the task files dev/data/core.py
wrote with the model's tokenizer. The scoring itself is core_evaluate (llmc/core_evaluate.h) and core.h, the
same code train_gpt runs with --core-every.
*/
#define TRAIN_GPT_NO_MAIN  // use train_gpt.cu as a library: everything but main()
#include "train_gpt.cu"

static void usage() {
    printf("usage: eval_core -e CHECKPOINT -c TASKDIR [-m MAX_PER_TASK] [-o results.csv]\n"
           "  -e FILE   checkpoint or exported weights (safetensors with xsa-train configuration metadata)\n"
           "  -c DIR    CORE task files from dev/data/core.py, tokenized with the model's tokenizer\n"
           "  -m N      evaluate the first N items of each task (default: all)\n"
           "  -o FILE   write a per-task CSV\n");
}

int main(int argc, char** argv) {
    openmp_short_spin(argv);  // first: it may start the program again (common.h says why)
    std::string weights, task_dir, csv;
    int max_per_task = -1;
    parse_options(argc, argv, usage, [&](const std::string& flag, const char* value) {
        if (flag == "-e") weights = value;
        else if (flag == "-c") task_dir = value;
        else if (flag == "-o") csv = value;
        else if (flag == "-m") max_per_task = parse_int32(flag.c_str(), value);
        else return false;
        return true;
    });
    if (weights.empty() || task_dir.empty()) fail("eval_core needs -e CHECKPOINT and -c TASKDIR (see --help)");
    if (max_per_task < 1 && max_per_task != -1) fail("-m must be >= 1, got %d", max_per_task);
    backend_init();
    SafetensorsFile file = safetensors_read(weights);
    GPTConfig config = config_from_metadata(file);
    GPT model;
    gpt_build(&model, config);
    gpt_load_weights(&model, file);
    std::vector<CoreTask> tasks = core_tasks_load(task_dir, config.vocab_size, -1);  // BOS as the task files say
    double t0 = wall_ms();
    CoreResult result = core_evaluate(&model, tasks, max_per_task);
    core_print(result);
    size_t items = 0;
    for (const CoreTaskResult& t : result.tasks) items += t.items;
    printf("%zu items in %.1f s\n", items, (wall_ms() - t0) / 1000.0);
    if (!csv.empty()) {
        core_write_csv(result, csv);
        printf("wrote %s\n", csv.c_str());
    }
    gpt_free(&model);
    return 0;
}
