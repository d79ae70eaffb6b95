/* dpfy's seeded Gaussian sampler: 16 xoshiro256++ streams side by side + Box–Muller.
 *
 * Why: torch's CPU normal_ spends most of its time in one serial Mersenne Twister; on a small
 * model the noise of a DP-SGD step was ~20 % of the step. Here the 16 streams are advanced in
 * lock step (one SIMD-friendly loop) and Box–Muller runs through glibc's vector logf/sinf/cosf
 * (libmvec), so a block of 512 normals costs a few vector instructions per value.
 *
 * State: 4 x 16 uint64 words, word-major (s[w * LANES + lane]). Lane 0 is seeded by splitmix64
 * from the 64-bit seed; lane k is lane k-1 advanced by the xoshiro256 jump (2^128 steps), so the
 * lanes are non-overlapping pieces of one period-(2^256 - 1) sequence.
 *
 * Draws: each 64-bit output gives one pair (u1, u2): u1 = (top 31 bits + 1/2) / 2^31 in (0, 1),
 * so the radius sqrt(-2 ln u1) reaches sqrt(64 ln 2) = 6.66 (torch's float32 normal_ stops at
 * 5.77); u2 = low 24 bits / 2^24 is the angle's fraction of a turn. A block of BLOCK pairs yields
 * r*cos for its first BLOCK outputs and r*sin for the next BLOCK. A call for n values consumes
 * ceil(n / (2 BLOCK)) whole blocks, so the stream position depends only on the sizes asked for.
 *
 * Built by dpfy/native/build.py: compiled with -ffast-math only so that <math.h> declares the
 * libmvec vector variants, and linked WITHOUT -ffast-math, so that gcc's crtfastmath.o (which
 * would switch the whole process to flush-denormals-to-zero) is not linked in.
 */
#include <math.h>
#include <stdint.h>

#define LANES 16
#define BLOCK 256 /* pairs per block: 2 * BLOCK outputs */

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static void step_one(uint64_t w[4]) {
    const uint64_t t = w[1] << 17;
    w[2] ^= w[0];
    w[3] ^= w[1];
    w[1] ^= w[2];
    w[0] ^= w[3];
    w[2] ^= t;
    w[3] = rotl(w[3], 45);
}

/* Advance one stream by 2^128 steps (the published xoshiro256 jump polynomial). */
static void jump(uint64_t w[4]) {
    static const uint64_t poly[4] = {0x180ec6d33cfd0abaULL, 0xd5a61266f0c9392cULL,
                                     0xa9582618e03fc9aaULL, 0x39abdc4529b1661cULL};
    uint64_t acc[4] = {0, 0, 0, 0};
    for (int i = 0; i < 4; i++) {
        for (int b = 0; b < 64; b++) {
            if (poly[i] & (1ULL << b)) {
                for (int k = 0; k < 4; k++) acc[k] ^= w[k];
            }
            step_one(w);
        }
    }
    for (int k = 0; k < 4; k++) w[k] = acc[k];
}

void dpfy_gaussian_seed(uint64_t *state, uint64_t seed) {
    uint64_t w[4], x = seed;
    for (int k = 0; k < 4; k++) w[k] = splitmix64(&x); /* never all zero: splitmix64 is a bijection of distinct inputs */
    for (int lane = 0; lane < LANES; lane++) {
        for (int k = 0; k < 4; k++) state[k * LANES + lane] = w[k];
        jump(w);
    }
}

/* x[i] <- a * x[i] + s * z_i for i < n, z_i i.i.d. N(0, 1); with a == 0, x is only written. */
void dpfy_gaussian_axpy(float *x, int64_t n, float a, float s, uint64_t *state) {
    uint64_t s0[LANES], s1[LANES], s2[LANES], s3[LANES];
    for (int l = 0; l < LANES; l++) {
        s0[l] = state[l];
        s1[l] = state[LANES + l];
        s2[l] = state[2 * LANES + l];
        s3[l] = state[3 * LANES + l];
    }
    float u1[BLOCK], u2[BLOCK], radius[BLOCK], zc[BLOCK], zs[BLOCK];
    for (int64_t start = 0; start < n; start += 2 * BLOCK) {
        for (int b = 0; b < BLOCK; b += LANES) {
#pragma omp simd
            for (int l = 0; l < LANES; l++) {
                const uint64_t r = rotl(s0[l] + s3[l], 23) + s0[l];
                const uint64_t t = s1[l] << 17;
                s2[l] ^= s0[l];
                s3[l] ^= s1[l];
                s1[l] ^= s2[l];
                s0[l] ^= s3[l];
                s2[l] ^= t;
                s3[l] = rotl(s3[l], 45);
                u1[b + l] = ((float)(int32_t)(r >> 33) + 0.5f) * 4.656612873077392578125e-10f; /* 2^-31 */
                u2[b + l] = (float)(int32_t)(r & 0xFFFFFFu) * 5.9604644775390625e-08f;         /* 2^-24 */
            }
        }
#pragma omp simd
        for (int i = 0; i < BLOCK; i++) radius[i] = s * sqrtf(-2.0f * logf(u1[i]));
#pragma omp simd
        for (int i = 0; i < BLOCK; i++) zc[i] = cosf(6.28318530717958647692f * u2[i]);
#pragma omp simd
        for (int i = 0; i < BLOCK; i++) zs[i] = sinf(6.28318530717958647692f * u2[i]);
        const int64_t left = n - start;
        const int m = left < 2 * BLOCK ? (int)left : 2 * BLOCK;
        float *out = x + start;
        if (a == 0.0f) {
#pragma omp simd
            for (int i = 0; i < (m < BLOCK ? m : BLOCK); i++) out[i] = radius[i] * zc[i];
#pragma omp simd
            for (int i = BLOCK; i < m; i++) out[i] = radius[i - BLOCK] * zs[i - BLOCK];
        } else {
#pragma omp simd
            for (int i = 0; i < (m < BLOCK ? m : BLOCK); i++) out[i] = a * out[i] + radius[i] * zc[i];
#pragma omp simd
            for (int i = BLOCK; i < m; i++) out[i] = a * out[i] + radius[i - BLOCK] * zs[i - BLOCK];
        }
    }
    for (int l = 0; l < LANES; l++) {
        state[l] = s0[l];
        state[LANES + l] = s1[l];
        state[2 * LANES + l] = s2[l];
        state[3 * LANES + l] = s3[l];
    }
}
