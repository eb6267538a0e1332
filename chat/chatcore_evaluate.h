// chatcore_evaluate.h: ChatCORE of a chat model: the forwards and generations that chatcore.h's tasks and
// checkers score (with chat/tool.h's calculator). Included after train_gpt.cu (as a library); chat_eval and
// chat_sft run it.
#pragma once

#include "chatcore.h"
#include "tool.h"

// ChatCORE (dev/docs/evaluation.md#chatcore) of a chat model on `tasks`, as nanochat's chat_eval scores it.
// Categorical tasks: CORE_BATCH_ROWS prompts per forward, right-padded with BOS; the prediction is the choice
// whose letter has the largest logit at the prompt's last position (the first on ties). Generative tasks:
// a greedy answer (at most max_new tokens, nanochat's 512, and the model's context; CHAT_GENERATE_ROWS
// prompts decoded together, which changes nothing: rows are independent), ending at <|assistant_end|> or
// BOS, with the calculator tool; then the task's checker (chatcore.h) on its text. max_cat / max_sample: the
// first N items of categorical / generative tasks (-1: all). With several ranks, rank r takes the batches
// (categorical) or items (generative) r, r + ranks, ..; the verdicts are summed.
static const int CHAT_GENERATE_ROWS = 8;

static ChatResult chatcore_evaluate(GPT* model, const Tokenizer* tok, const std::vector<ChatTask>& tasks, int max_cat, int max_sample,
                                    int max_new = 512) {
    const int assistant_end = tokenizer_special_id(tok, "<|assistant_end|>");
    if (assistant_end < 0) fail("the tokenizer '%s' has no <|assistant_end|>: ChatCORE needs nanochat's chat tokens", tok->path.c_str());
    const CalculatorTool tool = calculator_tool(tok);
    const int context = model->config.seq_len, V = model->config.vocab_size;
    ChatResult result;
    long all_items = 0, items_done = 0;
    auto items_of = [&](const ChatTask& t) {
        const int cap = t.kind == CHAT_CATEGORICAL ? max_cat : max_sample;
        return cap > 0 ? std::min<int>(cap, (int)t.items.size()) : (int)t.items.size();
    };
    for (const ChatTask& t : tasks) all_items += items_of(t);
    Progress progress = progress_start("ChatCORE", "items", all_items);
    std::vector<float> logits(V);
    for (const ChatTask& task : tasks) {
        if (task.checker == CHECK_HUMANEVAL && python_path().empty())
            fail("%s runs the model's code with python3, which is not on PATH here", task.label.c_str());
        ChatTaskResult r;
        r.label = task.label;
        r.kind = task.kind;
        r.baseline = task.baseline;
        const int n = items_of(task);
        std::vector<double> correct(n, 0.0), pred(n, 0.0);
        r.answers.assign(n, "");
        const int group = task.kind == CHAT_CATEGORICAL ? CORE_BATCH_ROWS : CHAT_GENERATE_ROWS;
        const int rank_step = task.kind == CHAT_CATEGORICAL ? group * g_ranks.world : g_ranks.world;
        for (int first = task.kind == CHAT_CATEGORICAL ? g_ranks.rank * group : g_ranks.rank; first < n;) {
            std::vector<int> items;  // this round's: a batch (categorical) or up to `group` of this rank's items
            if (task.kind == CHAT_CATEGORICAL) {
                for (int i = first; i < std::min(n, first + group); i++) items.push_back(i);
                first += rank_step;
            } else {
                for (; first < n && (int)items.size() < group; first += rank_step) items.push_back(first);
            }
            if (task.kind == CHAT_CATEGORICAL) {
                int T = 0;
                for (int i : items) T = std::max(T, (int)task.items[i].prompt.size());
                std::vector<int> idx(items.size() * (size_t)T, task.bos_id);
                for (size_t k = 0; k < items.size(); k++) std::copy(task.items[items[k]].prompt.begin(), task.items[items[k]].prompt.end(), idx.begin() + k * T);
                gpt_forward(model, idx.data(), nullptr, (int)items.size(), T);
                for (size_t k = 0; k < items.size(); k++) {
                    const ChatItem& item = task.items[items[k]];
                    gpt_logits_row(model, k * T + item.prompt.size() - 1, logits.data());
                    int choice = 0;
                    for (int c = 1; c < (int)item.choices.size(); c++)
                        if (logits[item.choices[c]] > logits[item.choices[choice]]) choice = c;
                    correct[items[k]] = choice == item.gold;
                    pred[items[k]] = choice;
                }
            } else {
                std::vector<std::vector<int>> prompts;
                std::vector<int> fits;
                for (int i : items)
                    if ((int)task.items[i].prompt.size() < context) fits.push_back(i), prompts.push_back(task.items[i].prompt);
                const std::vector<std::vector<int>> answers =
                    generate(model, prompts, max_new, SamplingOptions(), 0, {assistant_end, tok->bos_id}, [](int, int) {}, nullptr, &tool);
                for (size_t k = 0; k < fits.size(); k++) {
                    r.answers[fits[k]] = tokenizer_decode(tok, answers[k].data(), answers[k].size());
                    correct[fits[k]] = chat_check(task, task.items[fits[k]], r.answers[fits[k]]);
                }
                // a prompt that fills the context leaves no room to answer: wrong (never at nanochat's T = 2048)
            }
            progress_update(&progress, items_done + items.back() + 1);
        }
        ranks_sum_doubles(correct.data(), correct.size());
        ranks_sum_doubles(pred.data(), pred.size());
        for (int i = 0; i < n; i++) {
            r.correct.push_back(correct[i] > 0.5);
            r.pred.push_back(task.kind == CHAT_CATEGORICAL ? (int)pred[i] : -1);
        }
        items_done += n;
        result.tasks.push_back(r);
    }
    chat_finish(&result);
    return result;
}
