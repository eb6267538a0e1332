// rotary.cuh: rotary position embedding as nanochat applies it: base 1e5, half-split ("rotate half")
// pairs (x[j], x[j + D/2]), rotation by -theta, positions counted from the start of each row.
#pragma once

#include "common.h"

static const float ROTARY_BASE = 100000.0f;

// cos, sin (T, D/2): angle[t][j] = t * base^(-2j/D), all in fp32 as nanochat computes them.
static inline void rotary_tables(float* cos_table, float* sin_table, int T, int D) {
    int half = D / 2;
    for (int j = 0; j < half; j++) {
        float inv_freq = 1.0f / powf(ROTARY_BASE, (float)(2 * j) / (float)D);
        for (int t = 0; t < T; t++) {
            float angle = (float)t * inv_freq;
            cos_table[t * half + j] = cosf(angle);
            sin_table[t * half + j] = sinf(angle);
        }
    }
}

// ----------------------------------------------------------------------------------------------------
// CPU backend

// x (B, T, heads, D) rotated in place: out1 = x1*cos + x2*sin, out2 = -x1*sin + x2*cos.
static inline void rotary_forward_cpu(float* x, const float* cos_table, const float* sin_table, int B, int T, int heads, int D) {
    int half = D / 2;
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            const float* c = cos_table + t * half;
            const float* s = sin_table + t * half;
            for (int h = 0; h < heads; h++) {
                float* v = x + (((size_t)b * T + t) * heads + h) * D;
                for (int j = 0; j < half; j++) {
                    float x1 = v[j], x2 = v[j + half];
                    v[j] = x1 * c[j] + x2 * s[j];
                    v[j + half] = -x1 * s[j] + x2 * c[j];
                }
            }
        }
}

// dx (B, T, heads, D) in place: the rotation is orthogonal, so the backward rotates by +theta (transpose).
static inline void rotary_backward_cpu(float* dx, const float* cos_table, const float* sin_table, int B, int T, int heads, int D) {
    int half = D / 2;
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            const float* c = cos_table + t * half;
            const float* s = sin_table + t * half;
            for (int h = 0; h < heads; h++) {
                float* g = dx + (((size_t)b * T + t) * heads + h) * D;
                for (int j = 0; j < half; j++) {
                    float g1 = g[j], g2 = g[j + half];
                    g[j] = g1 * c[j] - g2 * s[j];
                    g[j + half] = g1 * s[j] + g2 * c[j];
                }
            }
        }
}

// CUDA backend: the twins of these functions come with issue #6.
