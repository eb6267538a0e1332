// core_evaluate.h: CORE of a model (dev/docs/evaluation.md#core): the batched forwards whose per-position
// losses and greedy predictions core.h scores, split over the ranks. Part of train_gpt.cu (its --core-every)
// and eval_core.cpp, included after the model's forward.
#pragma once

// Several ranks score disjoint items of a task; this gives every rank all the verdicts and option losses
// (an item's entries are non-zero on the one rank that scored it, so the sums are exact; NaN + 0 keeps a NaN
// option loss).
static void core_share_results(const CoreTask& task, CoreTaskResult* r) {
    auto options = [&](size_t i) { return task.type == CORE_LANGUAGE_MODELING ? (size_t)0 : task.items[i].prompts.size(); };
    std::vector<double> flat;  // per item: the verdict, then the option losses
    for (size_t i = 0; i < r->correct.size(); i++) {
        const bool scored = (int)i % g_ranks.world == g_ranks.rank;
        flat.push_back(scored ? r->correct[i] : 0);
        for (size_t o = 0; o < options(i); o++) flat.push_back(scored ? r->option_loss[i][o] : 0.0);
    }
    ranks_sum_doubles(flat.data(), flat.size());
    for (size_t i = 0, k = 0; i < r->correct.size(); i++) {
        r->correct[i] = (int)flat[k++];
        r->option_loss[i].assign(flat.begin() + k, flat.begin() + k + options(i));
        k += options(i);
    }
}

// CORE (dev/docs/evaluation.md#core): each prompt of an item is a row, right-padded with BOS (rows are independent under
// causal attention, so the padding changes nothing before it); consecutive items share one forward, up to
// CORE_BATCH_ROWS rows, so that a GPU is not left waiting on one small batch after another. The per-position
// losses and greedy predictions are scored by core.h. max_per_task > 0 evaluates the first items of each task.
// With several ranks, rank r scores the items r, r + ranks, ... and core_share_results gathers the verdicts.
static const int CORE_BATCH_ROWS = 32;

static CoreResult core_evaluate(GPT* model, const std::vector<CoreTask>& tasks, int max_per_task) {
    CoreResult result;
    long all_items = 0, items_done = 0;
    for (const CoreTask& task : tasks) all_items += max_per_task > 0 ? std::min<long>(max_per_task, (long)task.items.size()) : (long)task.items.size();
    Progress progress = progress_start("CORE", "items", all_items);
    for (const CoreTask& task : tasks) {
        CoreTaskResult r;
        r.label = task.label;
        r.type = task.type;
        r.random_baseline = task.random_baseline;
        const int n_items = max_per_task > 0 ? std::min<int>(max_per_task, (int)task.items.size()) : (int)task.items.size();
        std::vector<int> mine;  // the items this rank scores: every world-th
        for (int i = g_ranks.rank; i < n_items; i += g_ranks.world) mine.push_back(i);
        r.correct.assign(n_items, 0);
        r.option_loss.assign(n_items, {});
        for (int first = 0, end = 0; first < (int)mine.size(); first = end) {
            // the items mine[first, end) of this forward: at least one, then as many as fit in the rows
            int rows = 0, T = 0;
            for (end = first; end < (int)mine.size() && (end == first || rows + (int)task.items[mine[end]].prompts.size() <= CORE_BATCH_ROWS); end++) {
                rows += (int)task.items[mine[end]].prompts.size();
                for (const CorePrompt& p : task.items[mine[end]].prompts) T = std::max(T, (int)p.tokens.size());
            }
            std::vector<int> idx((size_t)rows * T, task.bos_id), targets((size_t)rows * T, task.bos_id);
            int row = 0;
            for (int k = first; k < end; k++)
                for (const CorePrompt& p : task.items[mine[k]].prompts) {
                    std::copy(p.tokens.begin(), p.tokens.end(), idx.begin() + (size_t)row * T);
                    std::copy(p.tokens.begin() + 1, p.tokens.end(), targets.begin() + (size_t)row * T);
                    row++;
                }
            gpt_forward(model, idx.data(), targets.data(), rows, T);
            row = 0;
            for (int k = first; k < end; k++) {
                const int i = mine[k];
                const CoreItem& item = task.items[i];
                const int B = (int)item.prompts.size();
                std::vector<std::vector<float>> losses(B, std::vector<float>(T));
                std::vector<std::vector<int>> argmax(B, std::vector<int>(T, -1));  // only the answer positions are needed
                for (int b = 0; b < B; b++, row++) {
                    for (int t = 0; t < T; t++) losses[b][t] = model->losses_host[(size_t)row * T + t];
                    if (task.type == CORE_LANGUAGE_MODELING)
                        for (int t = item.prompts[b].span_start - 1; t < item.prompts[b].span_end - 1; t++)
                            argmax[b][t] = gpt_argmax(model, (size_t)row * T + t);
                }
                r.correct[i] = core_score_item(task, item, losses, argmax, &r.option_loss[i]) ? 1 : 0;
            }
            progress_update(&progress, items_done + (long)mine[end - 1] + 1);
        }
        items_done += n_items;
        if (g_ranks.world > 1) core_share_results(task, &r);
        result.tasks.push_back(r);
    }
    core_finish(&result);
    return result;
}
