// zero.cuh: the sharded optimizer's bookkeeping (llm.c's name; nanochat's distributed MuonAdamW, ZeRO-2
// style): which rank updates which parameters, where this rank's optimizer state lives, the gradient
// buckets the overlapped reduction sums as the backward finishes them, and the whole state gathered for a
// checkpoint (replicated layout) and dealt out again on resume. The sums themselves are llmc/ranks.cuh's;
// the update is train_gpt.cu's optimizer. Part of train_gpt.cu, included after the parameter table (it
// lays out ParamTensor lists) and the model's gradient buckets.
#pragma once

// Who updates what (dev/docs/optim.md#the-sharded-optimizer). nanochat's distributed MuonAdamW splits the
// optimizer's work and state over the ranks, ZeRO-2 style: a Muon group's K matrices (every block matrix of
// one shape) go to the ranks in blocks of chunk = ceil(K / shards), rank r updating matrices r·chunk ..
// (r+1)·chunk - 1 (so the last ranks may get none); an AdamW tensor of >= 1024 elements whose rows divide by
// the shards is split by rows (rank r: rows r·rows/shards ..); a smaller one every rank updates whole. A
// rank reduces only the gradients it needs, keeps optimizer state only for what it updates, and takes the
// rest of the updated parameters from their ranks. With shards = 1, rank 0 updates everything: the
// replicated optimizer, whose state layout is the checkpoints'.
struct OptimizerLayout {
    std::vector<bool> muon;                   // per tensor: updated by Muon
    std::vector<std::vector<size_t>> groups;  // the Muon groups (tensor indices, table order)
    std::vector<int> owner;                   // per tensor: the rank that updates it, -1: split by rows, or every rank (AdamW)
    std::vector<RankRange> owners;            // the parameters (offsets into the flat buffers) by the rank that updates them
    std::vector<size_t> first_owner;          // per tensor (and one past the last): tensor i's ranges are owners[first_owner[i] ..]
    std::vector<size_t> own_begin, own_end;   // per tensor: the elements this rank updates
    std::vector<size_t> state_m, state_v;     // per tensor: where its state is in this rank's (AdamW m and v; Muon momentum and NorMuon state)
    std::vector<size_t> full_m, full_v;       // the same in the checkpoint's layout: the whole state, as with shards = 1
    size_t state_floats = 0, full_state_floats = 0;
};

static OptimizerLayout optimizer_layout(const std::vector<ParamTensor>& table, bool adamw_only, int shards, int rank) {
    OptimizerLayout L;
    const size_t n = table.size();
    L.muon.resize(n);
    L.owner.assign(n, -1);
    L.own_begin.assign(n, 0);
    L.own_end.assign(n, 0);
    for (size_t i = 0; i < n; i++) {
        L.muon[i] = param_group(table[i].name) == GROUP_MATRIX && !adamw_only;
        if (!L.muon[i]) continue;
        if (table[i].shape.size() != 2) fail("internal: block parameter %s is not a matrix", table[i].name.c_str());
        size_t g = 0;
        while (g < L.groups.size() && table[L.groups[g][0]].shape != table[i].shape) g++;
        if (g == L.groups.size()) L.groups.emplace_back();
        L.groups[g].push_back(i);
    }
    for (const std::vector<size_t>& group : L.groups) {
        const size_t chunk = (group.size() + shards - 1) / shards;
        for (size_t k = 0; k < group.size(); k++) L.owner[group[k]] = (int)(k / chunk);
    }
    for (size_t i = 0; i < n; i++) {
        const ParamTensor& t = table[i];
        L.first_owner.push_back(L.owners.size());
        if (L.muon[i]) {
            L.owners.push_back({t.offset, t.offset + t.numel, L.owner[i]});
            L.own_end[i] = L.owner[i] == rank ? t.numel : 0;
        } else if (shards > 1 && t.numel >= 1024 && t.shape[0] % shards == 0) {
            const size_t slice = t.numel / shards;
            for (int r = 0; r < shards; r++) L.owners.push_back({t.offset + r * slice, t.offset + (r + 1) * slice, r});
            L.own_begin[i] = rank * slice;
            L.own_end[i] = (rank + 1) * slice;
        } else {
            L.owners.push_back({t.offset, t.offset + t.numel, -1});
            L.own_end[i] = t.numel;
        }
    }
    L.first_owner.push_back(L.owners.size());
    // the state: the AdamW tensors' (m, v) in table order, then each Muon group's momentum (K, rows, cols) and
    // NorMuon state (K, rows or cols); a rank's holds only its part, the checkpoint's all of it
    auto lay_out = [&](bool full, std::vector<size_t>* m, std::vector<size_t>* v) {
        m->assign(n, 0);
        v->assign(n, 0);
        size_t offset = 0;
        for (size_t i = 0; i < n; i++) {
            if (L.muon[i]) continue;
            const size_t len = full ? table[i].numel : L.own_end[i] - L.own_begin[i];
            (*m)[i] = offset;
            (*v)[i] = offset + len;
            offset += 2 * len;
        }
        for (const std::vector<size_t>& group : L.groups) {
            std::vector<size_t> kept;
            for (size_t i : group)
                if (full || L.owner[i] == rank) kept.push_back(i);
            const size_t matrix = table[group[0]].numel, ns = normuon_state_size((int)table[group[0]].shape[0], (int)table[group[0]].shape[1]);
            for (size_t k = 0; k < kept.size(); k++) {
                (*m)[kept[k]] = offset + k * matrix;
                (*v)[kept[k]] = offset + kept.size() * matrix + k * ns;
            }
            offset += kept.size() * (matrix + ns);
        }
        return offset;
    };
    L.state_floats = lay_out(false, &L.state_m, &L.state_v);
    L.full_state_floats = lay_out(true, &L.full_m, &L.full_v);
    return L;
}

// The whole optimizer state in the checkpoints' layout (full_m/full_v), on rank 0 (the others get nothing);
// every rank calls it. m, v: per tensor, this rank's moments (AdamW) or its slices of a Muon stack. Sharded,
// each part comes from the rank that holds it, through `scratch` (the gradient buffer: free between steps).
static std::vector<float> zero_gather_state(const OptimizerLayout& L, const std::vector<ParamTensor>& table, const std::vector<float*>& m,
                                            const std::vector<float*>& v, float* scratch, int shards) {
    std::vector<float> full(g_ranks.rank == 0 ? L.full_state_floats : 0);
    for (size_t i = 0; i < table.size(); i++) {
        const ParamTensor& t = table[i];
        const size_t own = L.own_end[i] - L.own_begin[i];
        const size_t second = L.muon[i] ? normuon_state_size((int)t.shape[0], (int)t.shape[1]) : t.numel;
        const struct { float* mine; size_t len, full_at; } parts[2] = {{m[i], t.numel, L.full_m[i]}, {v[i], second, L.full_v[i]}};
        for (const auto& part : parts) {
            if (own > 0) backend_copy(scratch + L.own_begin[i], part.mine, (L.muon[i] ? part.len : own) * sizeof(float));
            std::vector<RankRange> from;  // the part's elements by the rank that holds them (-1: every rank)
            for (size_t k = L.first_owner[i]; k < L.first_owner[i + 1]; k++) {
                const RankRange& r = L.owners[k];
                from.push_back({r.begin - t.offset, L.muon[i] ? part.len : r.end - t.offset, r.owner});
            }
            if (shards > 1) ranks_exchange_floats(scratch, from, RANKS_BROADCAST);
            if (g_ranks.rank == 0) backend_download(full.data() + part.full_at, scratch, part.len * sizeof(float));
        }
    }
    return full;
}

// This rank's part of a whole state in the checkpoints' layout (L.full_state_floats values on the host),
// into its m and v.
static void zero_scatter_state(const OptimizerLayout& L, const std::vector<ParamTensor>& table, const std::vector<float*>& m,
                               const std::vector<float*>& v, const float* full) {
    for (size_t i = 0; i < table.size(); i++) {
        const ParamTensor& t = table[i];
        const size_t own = L.own_end[i] - L.own_begin[i];
        if (own == 0) continue;
        const size_t second = L.muon[i] ? normuon_state_size((int)t.shape[0], (int)t.shape[1]) : own;
        backend_upload(m[i], full + L.full_m[i] + L.own_begin[i], own * sizeof(float));
        backend_upload(v[i], full + L.full_v[i] + L.own_begin[i], second * sizeof(float));
    }
}

// The overlapped reduction's buckets (gradient_bucket: lm_head first, then each layer from the last, then
// the rest): what each sums, and for which rank (sharded: each part to its rank; replicated: every part to
// every rank).
static inline std::vector<std::vector<RankRange>> zero_gradient_buckets(const OptimizerLayout& L, const std::vector<ParamTensor>& table, int n_layer,
                                                                        int shards) {
    std::vector<std::vector<RankRange>> buckets(n_layer + 2);
    for (size_t i = 0; i < table.size(); i++)
        for (size_t k = L.first_owner[i]; k < L.first_owner[i + 1]; k++) {
            const RankRange& r = L.owners[k];
            buckets[gradient_bucket(table[i].name, n_layer)].push_back({r.begin, r.end, shards > 1 ? r.owner : -1});
        }
    return buckets;
}
