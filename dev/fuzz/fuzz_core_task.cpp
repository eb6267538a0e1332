// fuzz_core_task: a CORE task file (llmc/core.h: core_task_load). The input is the whole file, loaded
// as train_gpt does (vocabulary 4096, BOS 4087: the embedded corpus's tokenizer) and as eval_core does
// (BOS taken from the file). An accepted task is scored with made-up model outputs, which reads every
// answer span: the spans must lie inside their prompts, and an option's loss is NaN exactly where its span is
// empty (core_span_empty, scored as nanochat scores it).
#include "dev/fuzz/fuzz_util.h"
#include "llmc/core.h"

static const int VOCAB = 4096, BOS = 4087;

static void score(const CoreTask& task) {
    CoreResult result;
    CoreTaskResult r;
    r.label = task.label;
    r.type = task.type;
    r.random_baseline = task.random_baseline;
    for (const CoreItem& item : task.items) {
        // losses[p][t] and argmax[p][t] for t < ntokens - 1, as core_evaluate fills them
        std::vector<std::vector<float>> losses;
        std::vector<std::vector<int>> argmax;
        for (const CorePrompt& p : item.prompts) {
            std::vector<float> l(p.tokens.size() - 1);
            std::vector<int> a(p.tokens.size() - 1);
            for (size_t t = 0; t + 1 < p.tokens.size(); t++) {
                l[t] = (float)((p.tokens[t + 1] * 7 + t) % 13);
                a[t] = p.tokens[t + 1] ^ (int)(t & 1);
            }
            losses.push_back(l);
            argmax.push_back(a);
        }
        std::vector<double> option_loss;
        r.correct.push_back(core_score_item(task, item, losses, argmax, &option_loss) ? 1 : 0);
        for (size_t o = 0; o < option_loss.size(); o++)
            if (std::isfinite(option_loss[o]) == core_span_empty(item.prompts[o])) abort();
    }
    result.tasks.push_back(r);
    core_finish(&result);
    if (!std::isfinite(result.core)) abort();
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static FuzzFile file = fuzz_file("core_task");
    const std::string& path = fuzz_write(file, data, size);
    CoreTask task;
    if (fuzz_parse(path, [&] { task = core_task_load(path, VOCAB, BOS); })) score(task);
    if (fuzz_parse(path, [&] { task = core_task_load(path, VOCAB, -1); })) score(task);
    return 0;
}
