// core.h: CORE (nanochat's 22-task in-context metric, dev/docs/evaluation.md#core) over the pre-tokenized
// task files that dev/data/core.py writes. Python renders the prompts and computes the answer spans (few-shot sampling
// and tokenisation must match nanochat exactly); this side only reads, scores and aggregates. The model
// forward that produces the logits is in llmc/core_evaluate.h (core_evaluate).
//
// Task file (little-endian):
//   int32 header[256]: [0] = 20241202 (magic), [1] = 1 (version), [2] = type (0 multiple_choice,
//     1 schema, 2 language_modeling), [3] = items N, [4] = few-shot examples, [5] = tokenizer vocab size,
//     [6] = BOS id, [7] = core.py's --max-per-task (-1 = all), [8] = random baseline in percent (float32
//     bits), [9..40] = the task label, UTF-8, NUL-padded; the rest 0
//   N items: uint32 prompts P, uint32 gold; P prompts: uint32 ntokens, uint32 span_start, uint32 span_end,
//     ntokens x uint32 ids (BOS first). The span [start, end) is the answer; a language-modeling item has
//     one prompt and gold 0. A multiple-choice or schema option may have no answer token to score (see
//     core_span_empty); nanochat scores it as NaN, and so does core_score_item.
#pragma once

#include <dirent.h>
#include <algorithm>
#include <string>
#include <vector>
#include "common.h"

static const int CORE_MAGIC = 20241202;
static const int CORE_VERSION = 1;
enum CoreTaskType { CORE_MULTIPLE_CHOICE = 0, CORE_SCHEMA = 1, CORE_LANGUAGE_MODELING = 2 };
static const char* const CORE_TYPE_NAMES[3] = {"multiple_choice", "schema", "language_modeling"};

struct CorePrompt {
    std::vector<int> tokens;
    int span_start, span_end;  // the answer tokens [start, end); scored at positions start-1 .. end-2
};

// An option nanochat's slice losses[start-1 : end-1] leaves empty (mean NaN), as core.py writes it: start == end
// (a choice that is a token prefix of every other choice; choices all identical; a schema item without a
// common suffix), or start == 0 (a schema item whose prompts are all identical: the whole prompt is the
// common suffix, and Python reads start-1 = -1 as the last column, past end-1).
static inline bool core_span_empty(const CorePrompt& p) { return p.span_start == 0 || p.span_start == p.span_end; }

struct CoreItem {
    int gold;
    std::vector<CorePrompt> prompts;
};

struct CoreTask {
    std::string path, label;
    int type = 0, shots = 0, max_per_task = -1;
    int bos_id = 0;                // the BOS every prompt starts with (and right-padding uses)
    float random_baseline = 0.0f;  // percent
    std::vector<CoreItem> items;
};

// Well-formed UTF-8 (no overlong forms, surrogates or code points past U+10FFFF).
static inline bool valid_utf8(const std::string& s) {
    for (size_t i = 0; i < s.size();) {
        const unsigned char c = (unsigned char)s[i];
        const int n = c < 0x80 ? 0 : (c >> 5) == 6 ? 1 : (c >> 4) == 14 ? 2 : (c >> 3) == 30 ? 3 : -1;
        if (n < 0 || i + n >= s.size()) return false;
        uint32_t cp = n == 0 ? c : c & (0x3F >> n);
        for (int k = 1; k <= n; k++) {
            const unsigned char d = (unsigned char)s[i + k];
            if ((d >> 6) != 2) return false;
            cp = (cp << 6) | (d & 0x3F);
        }
        static const uint32_t min_cp[4] = {0, 0x80, 0x800, 0x10000};
        if (cp < min_cp[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
        i += n + 1;
    }
    return true;
}

// Reads one task file; every field is checked against the tokenizer and against itself. bos_id < 0
// takes the file's (for a model whose tokenizer file is not at hand: the vocab size is still checked).
static inline CoreTask core_task_load(const std::string& path, int vocab_size, int bos_id) {
    CoreTask task;
    task.path = path;
    InputFile f(path);
    int32_t header[256];
    f.read(header, sizeof(int32_t), 256);
    if (header[0] != CORE_MAGIC) fail("'%s' is not a CORE task file (magic %d, expected %d); make it with dev/data/core.py", path.c_str(), header[0], CORE_MAGIC);
    if (header[1] != CORE_VERSION) fail("'%s' has CORE task version %d, this build reads version %d", path.c_str(), header[1], CORE_VERSION);
    task.type = header[2];
    if (task.type < 0 || task.type > 2) fail("'%s': unknown task type %d", path.c_str(), task.type);
    const int n_items = header[3];
    // an item takes at least 28 bytes (2 prompt header words, one prompt of >= 2 tokens)
    if (n_items < 1 || (uint64_t)n_items * 28 > f.left())
        fail("'%s' has %d items, which its %llu bytes cannot hold; the file is truncated or corrupt", path.c_str(), n_items, (unsigned long long)f.size);
    task.shots = header[4];
    if (task.shots < 0) fail("'%s': %d few-shot examples", path.c_str(), task.shots);
    if (bos_id < 0) bos_id = header[6];
    if (header[5] != vocab_size || header[6] != bos_id || bos_id < 0 || bos_id >= vocab_size)
        fail("'%s' was tokenized for vocab %d / BOS %d, but the model's tokenizer has vocab %d / BOS %d; rerun dev/data/core.py with this tokenizer",
             path.c_str(), header[5], header[6], vocab_size, bos_id);
    task.bos_id = bos_id;
    task.max_per_task = header[7];
    memcpy(&task.random_baseline, &header[8], sizeof(float));
    if (!(task.random_baseline >= 0.0f && task.random_baseline < 100.0f))
        fail("'%s': random baseline %g%% is outside [0, 100)", path.c_str(), task.random_baseline);
    char label[129] = {0};
    memcpy(label, &header[9], 128);
    task.label = label;
    if (task.label.empty() || task.label.size() > 127) fail("'%s' has no task label (1 to 127 bytes, NUL-padded)", path.c_str());
    for (unsigned char c : task.label)  // the label becomes a CSV field and a JSON key
        if (c < 0x20 || c == 0x7F || c == ',' || c == '"' || c == '\\') fail("'%s': the task label has a control character, comma, quote or backslash", path.c_str());
    if (!valid_utf8(task.label)) fail("'%s': the task label is not valid UTF-8", path.c_str());
    for (int i = 0; i < n_items; i++) {
        uint32_t n_prompts, gold;
        f.read(&n_prompts, 4, 1);
        f.read(&gold, 4, 1);
        if (n_prompts < 1 || n_prompts > 64) fail("'%s': item %d has %u prompts", path.c_str(), i, n_prompts);
        if (task.type == CORE_LANGUAGE_MODELING && n_prompts != 1) fail("'%s': language-modeling item %d has %u prompts, expected 1", path.c_str(), i, n_prompts);
        if (gold >= n_prompts) fail("'%s': item %d has gold index %u, but only %u options", path.c_str(), i, gold, n_prompts);
        CoreItem item;
        item.gold = (int)gold;
        for (uint32_t p = 0; p < n_prompts; p++) {
            uint32_t header3[3];
            f.read(header3, 4, 3);
            const uint32_t n = header3[0], start = header3[1], end = header3[2];
            if (n < 2 || n > (1u << 20)) fail("'%s': item %d prompt %u has %u tokens", path.c_str(), i, p, n);
            if ((uint64_t)n * 4 > f.left())
                fail("'%s' is truncated: item %d prompt %u has %u tokens, past the end of the file", path.c_str(), i, p, n);
            // the first answer token is predicted from the position before it, so start >= 1. The empty spans
            // core.py writes (core_span_empty) end at the prompt's end: [n, n) in a multiple-choice or schema
            // item, [0, n) in a schema item only (a multiple-choice prompt's BOS is always common, so start >= 1).
            // A language-modeling span is never empty: nanochat asserts that, and core.py refuses such an item.
            const bool scored = start >= 1 && start < end && end <= n;
            const bool empty = task.type != CORE_LANGUAGE_MODELING && end == n && (start == n || (start == 0 && task.type == CORE_SCHEMA));
            if (!scored && !empty)
                fail("'%s': item %d prompt %u has answer span [%u, %u), not a valid span of its %u tokens", path.c_str(), i, p, start, end, n);
            std::vector<uint32_t> ids(n);
            f.read(ids.data(), 4, n);
            CorePrompt prompt;
            prompt.span_start = (int)start;
            prompt.span_end = (int)end;
            prompt.tokens.resize(n);
            for (uint32_t t = 0; t < n; t++) {
                if (ids[t] >= (uint32_t)vocab_size) fail("'%s': item %d prompt %u has token id %u >= vocab %d", path.c_str(), i, p, ids[t], vocab_size);
                prompt.tokens[t] = (int)ids[t];
            }
            if (prompt.tokens[0] != bos_id) fail("'%s': item %d prompt %u does not start with BOS", path.c_str(), i, p);
            item.prompts.push_back(prompt);
        }
        task.items.push_back(item);
    }
    if (!f.at_end()) fail("'%s' has bytes after its %d items; the file is corrupt", path.c_str(), n_items);
    return task;
}

// Every *.bin task file of a directory, in name order (core.py numbers them in core.yaml's order).
static inline std::vector<CoreTask> core_tasks_load(const std::string& dir, int vocab_size, int bos_id) {
    std::vector<std::string> names;
    DIR* d = opendir(dir.c_str());
    if (!d) fail("cannot open the CORE task directory '%s': %s", dir.c_str(), strerror(errno));
    while (dirent* e = readdir(d)) {
        std::string name = e->d_name;
        if (name.size() > 4 && name.substr(name.size() - 4) == ".bin") names.push_back(name);
    }
    closedir(d);
    if (names.empty()) fail("'%s' holds no CORE task files (*.bin); make them with dev/data/core.py", dir.c_str());
    std::sort(names.begin(), names.end());
    std::vector<CoreTask> tasks;
    for (const std::string& name : names) {
        tasks.push_back(core_task_load(dir + "/" + name, vocab_size, bos_id));
        for (size_t k = 0; k + 1 < tasks.size(); k++)  // labels key the results (CSV rows, metrics.jsonl)
            if (tasks[k].label == tasks.back().label)
                fail("'%s' has the task label '%s', as '%s' does; every task needs its own", tasks.back().path.c_str(), tasks.back().label.c_str(),
                     tasks[k].path.c_str());
    }
    return tasks;
}

// Centered accuracy: 0 at the random baseline (percent), 1 at perfect.
static inline double core_centered(double accuracy, double random_baseline_percent) {
    const double rb = 0.01 * random_baseline_percent;
    return (accuracy - rb) / (1.0 - rb);
}

struct CoreTaskResult {
    std::string label;
    int type, items;
    double accuracy, centered, random_baseline;
    std::vector<int> correct;                      // per item, 0/1
    std::vector<std::vector<double>> option_loss;  // per item and option: mean loss over the answer span (MC/schema), NaN if empty
};

struct CoreResult {
    std::vector<CoreTaskResult> tasks;
    double core = 0.0;  // unweighted mean of the centered accuracies
};

// Scores one item from its prompts' per-position losses and greedy predictions:
// losses[p][t] = CE of prompt p's token t+1 at position t; argmax[p][t] = the model's top token there.
// MC / schema: the option with the lowest mean loss over its answer span (first on ties) must be gold. An
// empty span's mean is NaN (core_span_empty), and the pick is nanochat's mean_losses.index(min(mean_losses)):
// Python's min keeps its first element and replaces it only by a smaller one, and every comparison with a NaN
// is false. So a NaN first option is the prediction, later NaN options are passed over, and the item counts.
// LM: the greedy predictions over the span must equal the answer tokens exactly.
static inline bool core_score_item(const CoreTask& task, const CoreItem& item, const std::vector<std::vector<float>>& losses,
                                   const std::vector<std::vector<int>>& argmax, std::vector<double>* option_loss) {
    option_loss->clear();
    if (task.type == CORE_LANGUAGE_MODELING) {
        const CorePrompt& p = item.prompts[0];
        for (int t = p.span_start; t < p.span_end; t++)
            if (argmax[0][t - 1] != p.tokens[t]) return false;
        return true;
    }
    int best = 0;
    for (size_t o = 0; o < item.prompts.size(); o++) {
        const CorePrompt& p = item.prompts[o];
        double loss = NAN;
        if (!core_span_empty(p)) {
            double sum = 0.0;
            for (int t = p.span_start; t < p.span_end; t++) sum += losses[o][t - 1];
            loss = sum / (p.span_end - p.span_start);
        }
        option_loss->push_back(loss);
        if (loss < (*option_loss)[best]) best = (int)o;  // false whenever either is NaN: Python's min
    }
    return best == item.gold;
}

static inline void core_finish(CoreResult* r) {
    double sum = 0.0;
    for (CoreTaskResult& t : r->tasks) {
        int correct = 0;
        for (int c : t.correct) correct += c;
        t.items = (int)t.correct.size();
        t.accuracy = (double)correct / t.items;
        t.centered = core_centered(t.accuracy, t.random_baseline);
        sum += t.centered;
    }
    r->core = sum / r->tasks.size();
}

static inline void core_print(const CoreResult& r) {
    printf("%-36s %-18s %6s %9s %9s %9s\n", "task", "type", "items", "accuracy", "baseline", "centered");
    for (const CoreTaskResult& t : r.tasks)
        printf("%-36s %-18s %6d %9.4f %8.1f%% %9.4f\n", t.label.c_str(), CORE_TYPE_NAMES[t.type], t.items, t.accuracy, t.random_baseline, t.centered);
    printf("CORE %.6f (mean centered accuracy over %zu tasks)\n", r.core, r.tasks.size());
}

// label,type,items,accuracy,random_baseline,centered per task, then a CORE row
static inline void core_write_csv(const CoreResult& r, const std::string& path) {
    std::string csv = "label,type,items,accuracy,random_baseline,centered\n";
    char row[512];
    for (const CoreTaskResult& t : r.tasks) {
        snprintf(row, sizeof row, ",%s,%d,%.6f,%.2f,%.6f\n", CORE_TYPE_NAMES[t.type], t.items, t.accuracy, t.random_baseline, t.centered);
        csv += t.label + row;
    }
    snprintf(row, sizeof row, "CORE,,,,,%.6f\n", r.core);
    csv += row;
    AtomicFile f = atomic_open(path);
    atomic_write(&f, csv.data(), csv.size());
    atomic_commit(&f);
}
