// qkv_rope.cuh: the fused QKV step's per-pair work, shared by kv_cache.cu (qkv_rope_append_*) and the
// QKV GEMV's rope epilogue (gemv.cu), so both compute the same rotation and write the same places.
//
// Heads of a QKV row: Hq query heads, then Hkv key heads, then Hkv value heads, D each. One rotate_half
// pair is element i and element i + D/2 of head h, for token t at cache position pos: q and k heads are
// rotated, v heads copied; q goes to q_out (T, Hq, D), k / v into the caches (Hkv, max_len, D) at row pos.
// Needs common.cuh (included by every kernels/*.cu before this file).
#pragma once

// Rotary embedding of one rotate_half pair (x1 = element i, x2 = element i + D/2) at position pos:
// inv_freq = theta^(-2i/D), angle = pos * inv_freq in fp32 (as transformers computes its tables).
// Every operation is written out (no FMA contraction), so each kernel that uses it (the QKV GEMV's
// rope epilogue, qkv_rope_append_il_*) gives the same bits for the same inputs.
__device__ __forceinline__ void rope_pair(float x1, float x2, int pos, int i, int D, float theta, float& o1,
                                          float& o2) {
  const float inv_freq = __fdiv_rn(1.f, powf(theta, __fdiv_rn((float)(2 * i), (float)D)));
  const float ang = __fmul_rn((float)pos, inv_freq);
  const float c = cosf(ang), s = sinf(ang);
  o1 = __fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, s));
  o2 = __fadd_rn(__fmul_rn(x2, c), __fmul_rn(x1, s));
}

// The rotation as a functor: RopeExact = rope_pair (the decode path); RopePlain = the same formula as
// plain fp32 expressions (the compiler may contract them), kept bit for bit for qkv_rope_append_{f32,bf16}.
struct RopeExact {
  __device__ __forceinline__ void operator()(float& x1, float& x2, int pos, int i, int D, float theta) const {
    rope_pair(x1, x2, pos, i, D, theta, x1, x2);
  }
};
struct RopePlain {
  __device__ __forceinline__ void operator()(float& x1, float& x2, int pos, int i, int D, float theta) const {
    float inv_freq = 1.f / powf(theta, (float)(2 * i) / (float)D);
    float ang = (float)pos * inv_freq;
    float c = cosf(ang), s = sinf(ang);
    float o1 = x1 * c - x2 * s, o2 = x2 * c + x1 * s;
    x1 = o1;
    x2 = o2;
  }
};

// Where a QKV step writes.
template <typename T>
struct QkvOut {
  T* q_out;  // (T, Hq, D)
  T* kc;     // (Hkv, max_len, D)
  T* vc;     // (Hkv, max_len, D)
  int Hq, Hkv, D, max_len;
};

// Rotate (q / k heads) at position pos and store one pair (x1, x2 = elements i, i + D/2 of head h, bias already
// added), the key and value at cache row `row`: pos itself, or (a draft tree's row: qkv_store_pair_at) the row the
// step gives it, while pos is its depth in the tree past the cache.
template <typename T, typename Rope>
__device__ __forceinline__ void qkv_store_pair_at(const QkvOut<T>& o, int h, int t, int pos, int row, int i, float x1,
                                                  float x2, float theta, Rope rope) {
  T* dst;
  if (h < o.Hq + o.Hkv) {
    rope(x1, x2, pos, i, o.D, theta);
    dst = h < o.Hq ? o.q_out + ((i64)t * o.Hq + h) * o.D : o.kc + ((i64)(h - o.Hq) * o.max_len + row) * o.D;
  } else {
    dst = o.vc + ((i64)(h - o.Hq - o.Hkv) * o.max_len + row) * o.D;
  }
  dst[i] = from_f<T>(x1);
  dst[i + (o.D >> 1)] = from_f<T>(x2);
}
template <typename T, typename Rope>
__device__ __forceinline__ void qkv_store_pair(const QkvOut<T>& o, int h, int t, int pos, int i, float x1, float x2,
                                               float theta, Rope rope) {
  qkv_store_pair_at<T, Rope>(o, h, t, pos, pos, i, x1, x2, theta, rope);
}
