/* dpfy's fused ghost norm of a Linear layer on sequences.
 *
 * For example i with input rows a_t (T, d_a) and output-gradient rows g_t (T, d_g):
 *   weight: ‖Σ_t g_t a_tᵀ‖_F² = Σ_{t,t'} (a_t·a_t')(g_t·g_t') = ⟨A Aᵀ, G Gᵀ⟩
 *   bias:   ‖Σ_t g_t‖²        = Σ_{t,t'} g_t·g_t'               = 1ᵀ (G Gᵀ) 1
 *
 * Why a kernel: torch forms A Aᵀ and G Gᵀ with a batched matmul of small (T×d)·(d×T) products,
 * which on one CPU core runs at about half the rate of a large matmul, writes two (B, T, T)
 * tensors and reads them back for the product. Here each example's two Gram matrices are built
 * tile by tile in registers and multiplied into the sum right away, and only tiles on or above
 * the diagonal are computed (both Grams are symmetric: a tile above counts twice, the diagonal
 * tiles once, entries below the diagonal inside a diagonal tile get weight 0).
 *
 * Layout: each example's rows are copied once into a column-major scratch (d, Tp), Tp = T rounded
 * up to the vector width and zero-padded, so a Gram tile is R rank-1 updates per k of one vector
 * of 16 columns by R broadcast row values; the padding contributes exact zeros.
 *
 * Accuracy: Gram entries accumulate in float32, as torch's matmul does; the weighted products
 * accumulate in 16 float32 lanes, which are added in double at the end.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef float v16 __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));

#ifndef __AVX512F__
#error "ghost_norm.c is written for AVX-512 (dpfy/native/ghost_norm.py builds it only there)"
#endif
#define W 16 /* columns per tile: one 512-bit vector */
#define R 8  /* rows per tile: the 2 R accumulators fit the 32 vector registers */

static inline v16 load16(const float *p) {
    v16 v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* Swap bit m (S = 2^m) of the row index with bit m of the column index in the row pair (x, y)
 * of a 16x16 block: one of the four stages of an in-register transpose. */
#define SWAP(x, y, LO, HI)                                                                        \
    do {                                                                                          \
        const v16 x0 = (x), x1 = (y);                                                             \
        (x) = __builtin_shuffle(x0, x1, LO);                                                      \
        (y) = __builtin_shuffle(x0, x1, HI);                                                      \
    } while (0)

/* dst[j * ld + i] = src[i * ts + j] for a full 16x16 block, in registers; the same block
 * ``ahead`` floats further on (the next example's) is prefetched into L2. */
static inline void transpose16(const float *src, int64_t ts, float *dst, int64_t ld,
                               int64_t ahead) {
    for (int i = 0; i < W; i++) __builtin_prefetch(src + ahead + i * ts, 0, 2);
    const v16i l1 = {0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30};
    const v16i h1 = {1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31};
    const v16i l2 = {0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29};
    const v16i h2 = {2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31};
    const v16i l4 = {0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27};
    const v16i h4 = {4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31};
    const v16i l8 = {0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23};
    const v16i h8 = {8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31};
    v16 r0 = load16(src), r1 = load16(src + ts), r2 = load16(src + 2 * ts),
        r3 = load16(src + 3 * ts), r4 = load16(src + 4 * ts), r5 = load16(src + 5 * ts),
        r6 = load16(src + 6 * ts), r7 = load16(src + 7 * ts), r8 = load16(src + 8 * ts),
        r9 = load16(src + 9 * ts), r10 = load16(src + 10 * ts), r11 = load16(src + 11 * ts),
        r12 = load16(src + 12 * ts), r13 = load16(src + 13 * ts), r14 = load16(src + 14 * ts),
        r15 = load16(src + 15 * ts);
    SWAP(r0, r1, l1, h1); SWAP(r2, r3, l1, h1); SWAP(r4, r5, l1, h1); SWAP(r6, r7, l1, h1);
    SWAP(r8, r9, l1, h1); SWAP(r10, r11, l1, h1); SWAP(r12, r13, l1, h1); SWAP(r14, r15, l1, h1);
    SWAP(r0, r2, l2, h2); SWAP(r1, r3, l2, h2); SWAP(r4, r6, l2, h2); SWAP(r5, r7, l2, h2);
    SWAP(r8, r10, l2, h2); SWAP(r9, r11, l2, h2); SWAP(r12, r14, l2, h2); SWAP(r13, r15, l2, h2);
    SWAP(r0, r4, l4, h4); SWAP(r1, r5, l4, h4); SWAP(r2, r6, l4, h4); SWAP(r3, r7, l4, h4);
    SWAP(r8, r12, l4, h4); SWAP(r9, r13, l4, h4); SWAP(r10, r14, l4, h4); SWAP(r11, r15, l4, h4);
    SWAP(r0, r8, l8, h8); SWAP(r1, r9, l8, h8); SWAP(r2, r10, l8, h8); SWAP(r3, r11, l8, h8);
    SWAP(r4, r12, l8, h8); SWAP(r5, r13, l8, h8); SWAP(r6, r14, l8, h8); SWAP(r7, r15, l8, h8);
    const v16 out[W] = {r0, r1, r2, r3, r4, r5, r6, r7, r8, r9, r10, r11, r12, r13, r14, r15};
    for (int j = 0; j < W; j++) memcpy(dst + j * ld, &out[j], sizeof(v16));
}

/* xt[k * tp + t] = x[t * ts + k] for t < T, 0 for T <= t < tp (k < d): full 16x16 blocks are
 * transposed in registers, the ragged edges one value at a time. While an example is copied the
 * next one (``ahead`` floats on, 0 for none) is prefetched, so that its load from memory
 * overlaps this example's Gram tiles instead of stalling the next copy. */
static void to_columns(const float *x, int64_t t, int64_t d, int64_t ts, float *xt, int64_t tp,
                       int64_t ahead) {
    const int64_t tf = t / W * W, df = d / W * W; /* extent of the full blocks */
    for (int64_t t0 = 0; t0 < tf; t0 += W) {
        for (int64_t k0 = 0; k0 < df; k0 += W) {
            transpose16(x + t0 * ts + k0, ts, xt + k0 * tp + t0, tp, ahead);
        }
    }
    for (int64_t i = 0; i < t; i++) {
        const int64_t k_from = i < tf ? df : 0;
        for (int64_t k = k_from; k < d; k++) xt[k * tp + i] = x[i * ts + k];
    }
    for (int64_t k = 0; k < d; k++) {
        for (int64_t i = t; i < tp; i++) xt[k * tp + i] = 0.0f;
    }
}

/* Gram tile rows t0..t0+R-1, columns c0..c0+W-1 of X Xᵀ, X given column-major as xt (d, tp). */
static inline void gram_tile(const float *xt, int64_t d, int64_t tp, int64_t t0, int64_t c0,
                             v16 acc[R]) {
    for (int r = 0; r < R; r++) acc[r] = (v16){0};
    for (int64_t k = 0; k < d; k++) {
        const float *col = xt + k * tp;
        const v16 v = load16(col + c0);
        for (int r = 0; r < R; r++) acc[r] += col[t0 + r] * v;
    }
}

/* Examples 0 <= i < b. a: element (i, t, k) at a[i * as_b + t * as_t + k]; same for g.
 * out_w[i] = ⟨A_i A_iᵀ, G_i G_iᵀ⟩, out_b[i] = 1ᵀ G_i G_iᵀ 1. Returns 0, or -1 if out of memory. */
int dpfy_ghost_norm_linear(const float *a, const float *g, int64_t b, int64_t t, int64_t da,
                           int64_t dg, int64_t as_b, int64_t as_t, int64_t gs_b, int64_t gs_t,
                           float *out_w, float *out_b) {
    const int64_t tp = (t + W - 1) / W * W;
    float *scratch = malloc((size_t)((da + dg) * tp) * sizeof(float));
    if (scratch == NULL) return -1;
    float *at = scratch, *gt = scratch + da * tp;
    v16 iota;
    for (int j = 0; j < W; j++) iota[j] = (float)j;
    for (int64_t i = 0; i < b; i++) {
        const int last = i + 1 == b;
        to_columns(a + i * as_b, t, da, as_t, at, tp, last ? 0 : as_b);
        to_columns(g + i * gs_b, t, dg, gs_t, gt, tp, last ? 0 : gs_b);
        v16 sw = (v16){0}, sb = (v16){0};
        for (int64_t t0 = 0; t0 < t; t0 += R) {
            for (int64_t c0 = t0 / W * W; c0 < tp; c0 += W) { /* tiles reaching the diagonal */
                v16 ta[R], tg[R];
                gram_tile(at, da, tp, t0, c0, ta);
                gram_tile(gt, dg, tp, t0, c0, tg);
                for (int r = 0; r < R; r++) {
                    /* weight of entry (t0 + r, c0 + j): 2 above the diagonal, 1 on it, 0 below */
                    const v16 off = iota + (float)(c0 - t0 - r);
                    const v16i above = off > 0.0f, on = off == 0.0f;
                    const v16 wgt = -2.0f * __builtin_convertvector(above, v16)
                                    - __builtin_convertvector(on, v16);
                    sw += wgt * ta[r] * tg[r];
                    sb += wgt * tg[r];
                }
            }
        }
        double w = 0.0, bsum = 0.0;
        for (int j = 0; j < W; j++) {
            w += sw[j];
            bsum += sb[j];
        }
        out_w[i] = (float)w;
        out_b[i] = (float)bsum;
    }
    free(scratch);
    return 0;
}
