/* dpfy's compiled Gaussian sampler: random bits from ChaCha20 (secure) or xoshiro256++
 * (reproducible), turned into N(0, 1) by Box–Muller with a 64-bit u1.
 *
 * Why: torch's CPU normal_ spends most of its time in one serial Mersenne Twister, is not a
 * cryptographic generator, and its float32 transform cuts the tails at 5.77 sigma. Here 16
 * generator lanes advance in lock step (one SIMD-friendly loop) and Box–Muller runs through
 * glibc's vector logf/sinf/cosf (libmvec).
 *
 * Generators (each fills one block of WORDS32 32-bit words at a time):
 * - ChaCha20 (RFC 8439 section 2.3 block function, 20 rounds), 16 consecutive blocks per call,
 *   one block per SIMD lane; a call's 16 rows of 16 lanes are stored as they come. Key: 256 bits
 *   the caller draws from the OS (os.urandom). Words 12 and 13 of the input hold a 64-bit block
 *   counter, words 14 and 15 a 64-bit nonce (the original ChaCha layout; with counter =
 *   c | n0 << 32 and nonce = n1 | n2 << 32 it is RFC 8439's 32-bit counter c and 96-bit nonce,
 *   which is how the RFC test vector is checked). State: CHACHA_WORDS uint64 = key (4 words,
 *   little-endian), counter, nonce.
 * - xoshiro256++: state 4 x 16 uint64, word-major (s[w * LANES + lane]). Lane 0 is seeded by
 *   splitmix64 from the 64-bit seed; lane k is lane k-1 advanced by the xoshiro256 jump
 *   (2^128 steps), so the lanes are non-overlapping pieces of one period-(2^256 - 1) sequence.
 *   Each u1 is one whole 64-bit output (see xoshiro_words).
 *
 * Transform: a block gives BLOCK pairs. Pair i reads r = words[i] 2^32 + words[BLOCK + i] (64
 * bits) and the angle's 24 top bits from words[2 BLOCK + i]: u1 = (r + 1/2) 2^-64 in (0, 1],
 * u2 = bits / 2^24 of a turn, z = sqrt(-2 ln u1) (cos, sin)(2 pi u2). The radius reaches
 * sqrt(130 ln 2) = 9.4926 at the smallest u1 = 2^-65 (r = 0): the tail mass P(|z| > t) is the
 * Gaussian's up to 2^-64 and float rounding for every t up to 9.49 sigma (P(|z| > 9) = 2.3e-19).
 * The block yields r*cos for its first BLOCK outputs and r*sin for the next BLOCK; outputs are
 * float32. A call for n values consumes ceil(n / (2 BLOCK)) whole blocks, so the stream
 * position depends only on the sizes asked for.
 *
 * Built by dpfy/native/build.py: compiled with -ffast-math only so that <math.h> declares the
 * libmvec vector variants, and linked WITHOUT -ffast-math, so that gcc's crtfastmath.o (which
 * would switch the whole process to flush-denormals-to-zero) is not linked in.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#define LANES 16
#define BLOCK 256       /* Box–Muller pairs per block: 2 * BLOCK outputs */
#define WORDS32 (3 * BLOCK) /* random 32-bit words per block: u1's high and low halves, angle */
#define CHACHA_WORDS 6  /* ChaCha state: key (4 x 64 bits), block counter, nonce */

enum { KIND_XOSHIRO = 0, KIND_CHACHA = 1 };

/* ---------------------------------------------------------------- ChaCha20 (RFC 8439) */

static inline uint32_t rotl32(uint32_t x, int k) { return (x << k) | (x >> (32 - k)); }

#define QR(a, b, c, d)                                                                          \
    a += b; d ^= a; d = rotl32(d, 16);                                                          \
    c += d; b ^= c; b = rotl32(b, 12);                                                          \
    a += b; d ^= a; d = rotl32(d, 8);                                                           \
    c += d; b ^= c; b = rotl32(b, 7);

/* out[w][l] = word w of the ChaCha20 block with counter + l, for l < LANES (input + 20 rounds). */
static void chacha20_blocks(const uint64_t st[CHACHA_WORDS], uint32_t out[16][LANES]) {
    uint32_t k[8];
    memcpy(k, st, sizeof k); /* little-endian words of the 256-bit key */
    const uint32_t c_lo = (uint32_t)st[4], c_hi = (uint32_t)(st[4] >> 32);
    const uint32_t i14 = (uint32_t)st[5], i15 = (uint32_t)(st[5] >> 32);
#pragma omp simd
    for (int l = 0; l < LANES; l++) { /* 32-bit arithmetic only, so that the loop vectorizes */
        const uint32_t i12 = c_lo + (uint32_t)l, i13 = c_hi + (i12 < c_lo); /* counter + l */
        uint32_t x0 = 0x61707865u, x1 = 0x3320646eu, x2 = 0x79622d32u, x3 = 0x6b206574u;
        uint32_t x4 = k[0], x5 = k[1], x6 = k[2], x7 = k[3];
        uint32_t x8 = k[4], x9 = k[5], x10 = k[6], x11 = k[7];
        uint32_t x12 = i12, x13 = i13, x14 = i14, x15 = i15;
#pragma GCC unroll 10
        for (int round = 0; round < 10; round++) { /* 10 double rounds = 20 rounds */
            QR(x0, x4, x8, x12) QR(x1, x5, x9, x13) QR(x2, x6, x10, x14) QR(x3, x7, x11, x15)
            QR(x0, x5, x10, x15) QR(x1, x6, x11, x12) QR(x2, x7, x8, x13) QR(x3, x4, x9, x14)
        }
        out[0][l] = x0 + 0x61707865u;  out[1][l] = x1 + 0x3320646eu;
        out[2][l] = x2 + 0x79622d32u;  out[3][l] = x3 + 0x6b206574u;
        out[4][l] = x4 + k[0];   out[5][l] = x5 + k[1];   out[6][l] = x6 + k[2];
        out[7][l] = x7 + k[3];   out[8][l] = x8 + k[4];   out[9][l] = x9 + k[5];
        out[10][l] = x10 + k[6]; out[11][l] = x11 + k[7];
        out[12][l] = x12 + i12;  out[13][l] = x13 + i13;
        out[14][l] = x14 + i14;  out[15][l] = x15 + i15;
    }
}

/* One block of WORDS32 words: 3 BLOCK / 256 calls of 16 ChaCha20 blocks, each call's 16 rows
 * of 16 lanes stored as they come; the counter moves on by 16 per call. */
static void chacha_words(uint64_t *st, uint32_t *words) {
    for (int base = 0; base < WORDS32; base += 16 * LANES) {
        chacha20_blocks(st, (uint32_t(*)[LANES])(words + base));
        st[4] += LANES;
    }
}

/* Test hook: nblocks ChaCha20 blocks serialized as in RFC 8439 (little-endian words), from the
 * block counter in state[4] on; state is not modified. */
void dpfy_chacha20_keystream(uint8_t *out, int64_t nblocks, const uint64_t *state) {
    uint64_t st[CHACHA_WORDS];
    uint32_t ks[16][LANES];
    memcpy(st, state, sizeof st);
    for (int64_t b = 0; b < nblocks; b += LANES, st[4] += LANES) {
        chacha20_blocks(st, ks);
        for (int l = 0; l < LANES && b + l < nblocks; l++)
            for (int w = 0; w < 16; w++) memcpy(out + 64 * (b + l) + 4 * w, &ks[w][l], 4);
    }
}

/* ---------------------------------------------------------------- xoshiro256++ */

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

/* One block of WORDS32 words from 3 BLOCK / 2 outputs (output b + l is lane l's next output,
 * b = 0, LANES, ...). Output i < BLOCK is pair i's u1 whole: its high half goes to words[i], its
 * low half to words[BLOCK + i]. Output BLOCK + j gives two angles: words[2 BLOCK + j] (low
 * half) and words[5 BLOCK / 2 + j] (high half). */
static void xoshiro_words(uint64_t *state, uint32_t *words) {
    uint64_t s0[LANES], s1[LANES], s2[LANES], s3[LANES];
    for (int l = 0; l < LANES; l++) {
        s0[l] = state[l];
        s1[l] = state[LANES + l];
        s2[l] = state[2 * LANES + l];
        s3[l] = state[3 * LANES + l];
    }
    for (int b = 0; b < 3 * BLOCK / 2; b += LANES) {
        const int hi_at = b < BLOCK ? b : 5 * BLOCK / 2 + (b - BLOCK);
        const int lo_at = b < BLOCK ? BLOCK + b : 2 * BLOCK + (b - BLOCK);
#pragma omp simd
        for (int l = 0; l < LANES; l++) {
            const uint64_t r = rotl(s0[l] + s3[l], 23) + s0[l];
            words[hi_at + l] = (uint32_t)(r >> 32);
            words[lo_at + l] = (uint32_t)r;
            const uint64_t t = s1[l] << 17;
            s2[l] ^= s0[l];
            s3[l] ^= s1[l];
            s1[l] ^= s2[l];
            s0[l] ^= s3[l];
            s2[l] ^= t;
            s3[l] = rotl(s3[l], 45);
        }
    }
    for (int l = 0; l < LANES; l++) {
        state[l] = s0[l];
        state[LANES + l] = s1[l];
        state[2 * LANES + l] = s2[l];
        state[3 * LANES + l] = s3[l];
    }
}

/* ---------------------------------------------------------------- Box–Muller */

static void next_words(int kind, uint64_t *state, uint32_t *words) {
    if (kind == KIND_CHACHA)
        chacha_words(state, words);
    else
        xoshiro_words(state, words);
}

/* out[i] <- a * out[i] + s * z_i for i < m <= 2 BLOCK, z from one block of words (see top). */
static void box_muller(const uint32_t *words, float *out, int m, float a, float s) {
    const uint32_t *hi = words, *lo = words + BLOCK, *angle = words + 2 * BLOCK;
    float radius[BLOCK], turn[BLOCK], zc[BLOCK], zs[BLOCK];
#pragma omp simd
    for (int i = 0; i < BLOCK; i++) {
        /* u1 = (hi 2^32 + lo + 1/2) 2^-64 in float: each term is rounded to 24 bits, so u1 keeps
         * 2^-23 relative precision at every scale down to its smallest value 2^-65 (exact);
         * logf of it moves the radius by < 1e-6 relative. u1 <= 1, and the max() keeps
         * -2 ln u1 >= 0 at u1 = 1. */
        const float u1 = (float)hi[i] * 0x1p-32f + ((float)lo[i] + 0.5f) * 0x1p-64f;
        radius[i] = s * sqrtf(fmaxf(-2.0f * logf(u1), 0.0f));
    }
#pragma omp simd
    for (int i = 0; i < BLOCK; i++) turn[i] = (float)(int32_t)(angle[i] >> 8) * 0x1p-24f;
#pragma omp simd
    for (int i = 0; i < BLOCK; i++) zc[i] = cosf(6.28318530717958647692f * turn[i]);
#pragma omp simd
    for (int i = 0; i < BLOCK; i++) zs[i] = sinf(6.28318530717958647692f * turn[i]);
    const int mc = m < BLOCK ? m : BLOCK;
    if (a == 0.0f) {
#pragma omp simd
        for (int i = 0; i < mc; i++) out[i] = radius[i] * zc[i];
#pragma omp simd
        for (int i = BLOCK; i < m; i++) out[i] = radius[i - BLOCK] * zs[i - BLOCK];
    } else {
#pragma omp simd
        for (int i = 0; i < mc; i++) out[i] = a * out[i] + radius[i] * zc[i];
#pragma omp simd
        for (int i = BLOCK; i < m; i++) out[i] = a * out[i] + radius[i - BLOCK] * zs[i - BLOCK];
    }
}

/* x[i] <- a * x[i] + s * z_i for i < n, z_i i.i.d. N(0, 1); with a == 0, x is only written. */
void dpfy_gaussian_axpy(float *x, int64_t n, float a, float s, uint64_t *state, int kind) {
    uint32_t words[WORDS32];
    for (int64_t start = 0; start < n; start += 2 * BLOCK) {
        next_words(kind, state, words);
        const int64_t left = n - start;
        box_muller(words, x + start, left < 2 * BLOCK ? (int)left : 2 * BLOCK, a, s);
    }
}

/* Test hook: the 2 BLOCK outputs (s = 1) of one block of WORDS32 given words. */
void dpfy_gaussian_from_words(const uint32_t *words, float *out) {
    box_muller(words, out, 2 * BLOCK, 0.0f, 1.0f);
}

/* out[j] <- the next n raw 64-bit words of the stream: word j of a block is its 32-bit words
 * 2j (low half) and 2j + 1 (high half); whole blocks are consumed. */
void dpfy_random_words(uint64_t *out, int64_t n, uint64_t *state, int kind) {
    uint32_t words[WORDS32];
    for (int64_t start = 0; start < n; start += WORDS32 / 2) {
        next_words(kind, state, words);
        const int64_t left = n - start;
        const int m = left < WORDS32 / 2 ? (int)left : WORDS32 / 2;
        for (int j = 0; j < m; j++)
            out[start + j] = (uint64_t)words[2 * j] | (uint64_t)words[2 * j + 1] << 32;
    }
}
