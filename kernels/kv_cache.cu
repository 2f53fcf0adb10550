// kv_cache.cu: KV-cache writes for the decode / verify steps.
//
// kv_append_*: k, v contiguous (B, Hkv, T, D) -> caches (B, Hkv, max_len, D) at positions
//   start .. start+T-1, start = (*pos_ptr if pos_ptr else pos). Grid-stride, 256 threads.
// qkv_rope_append_*: the decode path's fused step after the QKV projection. qkv is (T, H3*D)
//   token-major with H3 = Hq + 2*Hkv heads (q heads, then k, then v), bias (H3*D) or null.
//   Adds the bias, rotates q and k heads at position pos0 + t (pos0 = *pos_ptr, a device int32,
//   so a captured CUDA graph replays at the current position), writes q to q_out (T, Hq, D) and
//   k, v into the caches (Hkv, max_len, D). inv_freq[i] = theta^(-2i/D) and the angles are
//   computed in fp32 as transformers computes its cos/sin tables.
//   Launch: grid (T, H3), block D/2 threads (one per rotation pair). Limits: D even, D <= 2048,
//   pos0 + T <= max_len (the host checks).
// qkv_rope_append_il_*: the same for the decoder's permuted QKV rows: within each head the rows are
//   ordered (0, D/2, 1, D/2 + 1, ...), so a rotation pair is adjacent (qkv and bias alike); rotation
//   and stores by qkv_store_pair (includes/qkv_rope.cuh), shared with the QKV GEMV's rope epilogue
//   (gemv.cu), so the two write the same bits.
#include "common.cuh"
#include "qkv_rope.cuh"

template <typename T>
__device__ void kv_append_body(const T* k, const T* v, T* kc, T* vc, const int* pos_ptr, int pos,
                               int BH, int Tn, int D, int max_len) {
  int start = pos_ptr ? *pos_ptr : pos;
  i64 n = (i64)BH * Tn * D;
  for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {
    int d = (int)(i % D);
    i64 r = i / D;
    int t = (int)(r % Tn);
    i64 bh = r / Tn;
    i64 o = (bh * max_len + start + t) * D + d;
    kc[o] = k[i];
    vc[o] = v[i];
  }
}

// One block per (token, head); each thread rotates / copies pairs i and writes them (qkv_store_pair).
template <typename T, bool IL, typename Rope>
__device__ void qkv_rope_append_body(const T* qkv, const T* bias, T* q_out, T* kc, T* vc, const int* pos_ptr,
                                     int Hq, int Hkv, int D, int max_len, float theta, Rope rope) {
  int t = blockIdx.x, h = blockIdx.y, H3 = Hq + 2 * Hkv, half = D >> 1;
  int pos = *pos_ptr + t;
  const T* src = qkv + ((i64)t * H3 + h) * D;
  const T* b = bias ? bias + (i64)h * D : (const T*)0;
  const QkvOut<T> out{q_out, kc, vc, Hq, Hkv, D, max_len};
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    // the pair's two elements: i and i + D/2 (original rows), or 2i and 2i + 1 (interleaved rows)
    const int e1 = IL ? 2 * i : i, e2 = IL ? 2 * i + 1 : i + half;
    float x1 = to_f(src[e1]), x2 = to_f(src[e2]);
    if (b) {
      if (IL) { x1 = __fadd_rn(x1, to_f(b[e1])); x2 = __fadd_rn(x2, to_f(b[e2])); }
      else { x1 += to_f(b[e1]); x2 += to_f(b[e2]); }
    }
    qkv_store_pair<T>(out, h, t, pos, i, x1, x2, theta, rope);
  }
}

extern "C" {
#define KV_INST(sfx, T)                                                                               \
  __global__ void kv_append_##sfx(const T* k, const T* v, T* kc, T* vc, const int* pos_ptr, int pos,    \
                                  int BH, int Tn, int D, int max_len) {                                \
    kv_append_body<T>(k, v, kc, vc, pos_ptr, pos, BH, Tn, D, max_len);                                 \
  }                                                                                                   \
  __global__ void qkv_rope_append_##sfx(const T* qkv, const T* bias, T* q_out, T* kc, T* vc,           \
                                        const int* pos_ptr, int Hq, int Hkv, int D, int max_len, float theta) { \
    pdl_wait();                                                                                       \
    qkv_rope_append_body<T, false>(qkv, bias, q_out, kc, vc, pos_ptr, Hq, Hkv, D, max_len, theta, RopePlain()); \
  }
__global__ void qkv_rope_append_il_bf16(const bf16_t* qkv, const bf16_t* bias, bf16_t* q_out, bf16_t* kc, bf16_t* vc,
                                        const int* pos_ptr, int Hq, int Hkv, int D, int max_len, float theta) {
  pdl_wait();
  qkv_rope_append_body<bf16_t, true>(qkv, bias, q_out, kc, vc, pos_ptr, Hq, Hkv, D, max_len, theta, RopeExact());
}
KV_INST(f32, float)
KV_INST(bf16, bf16_t)
}
