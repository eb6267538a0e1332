// loss.cuh: logit softcap and cross-entropy, fused: the forward leaves the softcapped logits in place,
// and the backward turns them into their gradients in place, so probabilities are never stored.
#pragma once

#include "common.h"

// ----------------------------------------------------------------------------------------------------
// CPU backend

// logits (N, V) in place: raw -> cap * tanh(raw / cap); losses (N) = -log softmax(capped)[target].
static inline void softcap_crossentropy_forward_cpu(float* losses, float* logits, const int* targets, size_t N, int V, float cap) {
#pragma omp parallel for schedule(static)
    for (long n = 0; n < (long)N; n++) {
        float* row = logits + (size_t)n * V;
        float row_max = -INFINITY;
        for (int i = 0; i < V; i++) {
            row[i] = cap * tanhf(row[i] / cap);
            row_max = row[i] > row_max ? row[i] : row_max;
        }
        double sum = 0.0;
        for (int i = 0; i < V; i++) sum += exp((double)(row[i] - row_max));
        losses[n] = (float)(log(sum) + row_max - row[targets[n]]);
    }
}

// logits (N, V) in place: capped logits -> dL/d(raw logits) for L = grad_scale * sum_n losses[n]
// (grad_scale = 1 / (B*T) for the mean loss): (softmax - onehot) * grad_scale * (1 - (capped / cap)^2).
static inline void softcap_crossentropy_backward_cpu(float* logits, const int* targets, size_t N, int V, float cap, float grad_scale) {
#pragma omp parallel for schedule(static)
    for (long n = 0; n < (long)N; n++) {
        float* row = logits + (size_t)n * V;
        float row_max = -INFINITY;
        for (int i = 0; i < V; i++) row_max = row[i] > row_max ? row[i] : row_max;
        double sum = 0.0;
        for (int i = 0; i < V; i++) sum += exp((double)(row[i] - row_max));
        float inv_sum = (float)(1.0 / sum);
        for (int i = 0; i < V; i++) {
            float t = row[i] / cap;
            float p = expf(row[i] - row_max) * inv_sum;
            float indicator = (i == targets[n]) ? 1.0f : 0.0f;
            row[i] = (p - indicator) * grad_scale * (1.0f - t * t);
        }
    }
}

// CUDA backend: the fused classifier kernel comes with issue #6.
