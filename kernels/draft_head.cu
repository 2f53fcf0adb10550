// draft_head.cu: the two stages a trained draft head (minitorch/models/draft_head.py) adds to a one-layer
// decoder step on the GPU (minitorch/cuda/head.py, HeadDecoder). Launch layouts below, one per kernel.
//
// head_input_bf16: grid (T), block (256). Row r of the head's input: x[r] = [feat[r] ; embed[tok[r]]] (T, 2H)
//   bf16 for the fc product, and resid[r] = bias (fp32; the fc product is added to it). feat: T rows of H
//   bf16 values (row stride H: the target's final normed hidden states, or the head's own last feature);
//   tok: T int64 ids. An id outside [0, V) writes NaN into the embedding half. When tpos is not null,
//   *pos = *tpos - T (block 0): the head's cache rolls back to just before the T positions it feeds now
//   (the target's position after the acceptance kernel, less the verified positions).
// head_feature_bf16: grid (T), block (256). resid[r] += delta[r] (bf16; null: the residual stream is
//   complete), x[r] = bf16(resid[r]) (what the LM head reads: the head's output g has no final norm), and
//   feat = x[T-1] (the feature the head's next one-row step feeds back).
#include "common.cuh"

extern "C" {
__global__ void head_input_bf16(const bf16_t* feat, const i64* tok, const bf16_t* embed, const float* bias,
                                bf16_t* x, float* resid, int* pos, const int* tpos, int T, int H, int V) {
  pdl_wait();
  int r = blockIdx.x;
  if (r == 0 && threadIdx.x == 0 && tpos) *pos = *tpos - T;
  i64 id = tok[r];
  const bf16_t* f = feat + (i64)r * H;
  bf16_t* xr = x + (i64)r * 2 * H;
  float* rr = resid + (i64)r * H;
  bool ok = id >= 0 && id < V;
  const bf16_t* e = embed + (ok ? id : 0) * (i64)H;
  for (int d = threadIdx.x; d < H; d += blockDim.x) {
    xr[d] = f[d];
    xr[H + d] = ok ? e[d] : (bf16_t)0x7fc0;
    rr[d] = bias ? bias[d] : 0.f;
  }
}

__global__ void head_feature_bf16(float* resid, const bf16_t* delta, bf16_t* x, bf16_t* feat, int T, int H) {
  pdl_wait();
  int r = blockIdx.x;
  float* rr = resid + (i64)r * H;
  bf16_t* xr = x + (i64)r * H;
  for (int d = threadIdx.x; d < H; d += blockDim.x) {
    float v = rr[d];
    if (delta) {
      v += to_f(delta[(i64)r * H + d]);
      rr[d] = v;
    }
    bf16_t b = from_f<bf16_t>(v);
    xr[d] = b;
    if (r == T - 1) feat[d] = b;
  }
}
}
