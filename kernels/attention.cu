// attention.cu: causal grouped-query attention over a KV cache, split over the key axis
// (flash-decoding), for one query (decode) or several causal queries (verify / prefill).
//
// Launch layout. attn_partial_*: grid (nsplit, B*Hkv, ceil(G*T / 8)), 128 threads, ~42 KB static shared memory.
//   A block takes one KV head, the key range [split*KB, (split+1)*KB) and up to 8 query rows of
//   that head's group (row r -> query head kvh*G + r/T, query t = r%T, G = Hq/Hkv), so K and V are
//   read once for all grouped heads. Keys are staged 32 at a time in shared memory; each row keeps
//   an online softmax (running max m, sum l) and an unnormalised fp32 accumulator, written to the
//   workspace (ws_m, ws_l: rows x nsplit; ws_acc: rows x nsplit x D; rows = B*Hq*T).
// attn_combine_*: grid (B*Hq*T), blockDim >= D (multiple of 32): merges the splits and writes out.
// Positions: query t sits at q_start + t, q_start = (*pos_ptr if pos_ptr else 0) + q_off, and sees
//   keys 0 .. min(q_start + t, L - 1). With pos_ptr (a device int32) a captured CUDA graph replays
//   at the current cache length; blocks past the last visible key write an empty split.
// Layouts: q element (b, h, t, d) at b*qsb + h*qsh + t*qst + d; K/V (b, hkv, l, d) at
//   b*ksb + hkv*ksh + l*ksl + d; out (b, h, t, d) at b*osb + h*osh + t*ost + d (d contiguous).
// Limits: D <= 256, KB a multiple of 32, contexts up to 2^31 keys (tested to 32k+).
#include "common.cuh"

#define ATT_RMAX 8
#define ATT_CH 32
#define ATT_DMAX 256
#define ATT_THREADS 128

template <typename T>
__device__ void attn_partial_body(const T* q, const T* kc, const T* vc, float* ws_m, float* ws_l, float* ws_acc,
                                  const int* pos_ptr, int q_off, i64 qsb, i64 qsh, i64 qst, i64 ksb, i64 ksh,
                                  i64 ksl, i64 vsb, i64 vsh, i64 vsl, int Hq, int Hkv, int Tq, int D, int L,
                                  int KB, float scale) {
  __shared__ float qs[ATT_RMAX * ATT_DMAX];
  __shared__ T tile[ATT_CH * (ATT_DMAX + 2)];
  __shared__ float sc[ATT_RMAX * ATT_CH];
  __shared__ float s_alpha[ATT_RMAX], s_m[ATT_RMAX], s_l[ATT_RMAX];
  const int tid = threadIdx.x, lane = tid & 31, wid = tid >> 5;
  const int split = blockIdx.x, nsplit = gridDim.x;
  const int b = blockIdx.y / Hkv, kvh = blockIdx.y % Hkv;
  const int G = Hq / Hkv, R = G * Tq;
  const int r0 = blockIdx.z * ATT_RMAX;
  const int q_start = (pos_ptr ? *pos_ptr : 0) + q_off;
  const int DP = D + 2;

  // rows of this block: global row id and its last visible key
  int nrows = min(ATT_RMAX, R - r0);
  int kmax = 0;                             // one past the last key any row of the block sees
  for (int r = 0; r < nrows; ++r) kmax = max(kmax, min(q_start + ((r0 + r) % Tq), L - 1) + 1);
  const int kstart = split * KB;
  const int kend = min(kstart + KB, kmax);

  for (int i = tid; i < ATT_RMAX * D; i += ATT_THREADS) {
    int r = i / D, d = i - r * D;
    float v = 0.f;
    if (r < nrows) {
      int rr = r0 + r, h = kvh * G + rr / Tq, t = rr % Tq;
      v = to_f(q[b * qsb + h * qsh + t * qst + d]) * scale;
    }
    qs[r * ATT_DMAX + d] = v;
  }
  if (tid < ATT_RMAX) { s_m[tid] = -MT_INF; s_l[tid] = 0.f; }
  float acc[ATT_RMAX][2];
#pragma unroll
  for (int r = 0; r < ATT_RMAX; ++r) { acc[r][0] = 0.f; acc[r][1] = 0.f; }
  const T* kbase = kc + b * ksb + kvh * ksh;
  const T* vbase = vc + b * vsb + kvh * vsh;
  __syncthreads();

  for (int c0 = kstart; c0 < kend; c0 += ATT_CH) {
    int nk = min(ATT_CH, kend - c0);
    for (int i = tid; i < ATT_CH * D; i += ATT_THREADS) {
      int j = i / D, d = i - j * D;
      tile[j * DP + d] = j < nk ? kbase[(i64)(c0 + j) * ksl + d] : from_f<T>(0.f);
    }
    __syncthreads();
    for (int p = tid; p < ATT_RMAX * ATT_CH; p += ATT_THREADS) {
      int r = p / ATT_CH, j = p - r * ATT_CH;
      float s = -MT_INF;
      if (r < nrows && j < nk && c0 + j <= q_start + ((r0 + r) % Tq)) {
        const float* qr = qs + r * ATT_DMAX;
        const T* kr = tile + j * DP;
        float dot = 0.f;
        for (int d = 0; d < D; ++d) dot += qr[d] * to_f(kr[d]);
        s = dot;
      }
      sc[p] = s;
    }
    __syncthreads();
    for (int r = wid; r < ATT_RMAX; r += ATT_THREADS / 32) {
      float v = sc[r * ATT_CH + lane];
      float mx = warp_max(v);
      float m_old = s_m[r];
      float m_new = fmaxf(m_old, mx);
      float p = (m_new == -MT_INF) ? 0.f : __expf(v - m_new);
      float sum = warp_sum(p);
      sc[r * ATT_CH + lane] = p;
      __syncwarp();
      if (lane == 0) {
        float alpha = (m_old == -MT_INF) ? 0.f : __expf(m_old - m_new);
        s_alpha[r] = alpha;
        s_l[r] = s_l[r] * alpha + sum;
        s_m[r] = m_new;
      }
    }
    __syncthreads();
    for (int i = tid; i < ATT_CH * D; i += ATT_THREADS) {
      int j = i / D, d = i - j * D;
      tile[j * DP + d] = j < nk ? vbase[(i64)(c0 + j) * vsl + d] : from_f<T>(0.f);
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      int d = tid + k * ATT_THREADS;
      if (d < D) {
#pragma unroll
        for (int r = 0; r < ATT_RMAX; ++r) {
          float a = acc[r][k] * s_alpha[r];
          const float* pr = sc + r * ATT_CH;
          for (int j = 0; j < nk; ++j) a += pr[j] * to_f(tile[j * DP + d]);
          acc[r][k] = a;
        }
      }
    }
    __syncthreads();
  }

  for (int r = 0; r < nrows; ++r) {
    int rr = r0 + r, h = kvh * G + rr / Tq, t = rr % Tq;
    i64 row = ((i64)b * Hq + h) * Tq + t;
    if (tid == 0) { ws_m[row * nsplit + split] = s_m[r]; ws_l[row * nsplit + split] = s_l[r]; }
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      int d = tid + k * ATT_THREADS;
      if (d < D) {
        float a = 0.f;
#pragma unroll
        for (int rq = 0; rq < ATT_RMAX; ++rq) if (rq == r) a = acc[rq][k];
        ws_acc[(row * nsplit + split) * D + d] = a;
      }
    }
  }
}

template <typename T>
__device__ void attn_combine_body(const float* ws_m, const float* ws_l, const float* ws_acc, T* out, i64 osb,
                                  i64 osh, i64 ost, int Hq, int Tq, int D, int nsplit) {
  i64 row = blockIdx.x;
  int t = (int)(row % Tq);
  i64 bh = row / Tq;
  int h = (int)(bh % Hq), b = (int)(bh / Hq);
  const float* m = ws_m + row * nsplit;
  const float* l = ws_l + row * nsplit;
  float M = -MT_INF;
  for (int s = 0; s < nsplit; ++s) M = fmaxf(M, m[s]);
  int d = threadIdx.x;
  float num = 0.f, den = 0.f;
  if (M != -MT_INF) {
    for (int s = 0; s < nsplit; ++s) {
      if (m[s] == -MT_INF) continue;
      float w = __expf(m[s] - M);
      den += w * l[s];
      if (d < D) num += w * ws_acc[(row * nsplit + s) * D + d];
    }
  }
  if (d < D) out[b * osb + h * osh + t * ost + d] = from_f<T>(den > 0.f ? num / den : 0.f);
}

extern "C" {
#define ATT_INST(sfx, T)                                                                                  \
  __global__ void __launch_bounds__(ATT_THREADS) attn_partial_##sfx(                                      \
      const T* q, const T* kc, const T* vc, float* ws_m, float* ws_l, float* ws_acc, const int* pos_ptr,   \
      int q_off, i64 qsb, i64 qsh, i64 qst, i64 ksb, i64 ksh, i64 ksl, i64 vsb, i64 vsh, i64 vsl, int Hq,  \
      int Hkv, int Tq, int D, int L, int KB, float scale) {                                                \
    attn_partial_body<T>(q, kc, vc, ws_m, ws_l, ws_acc, pos_ptr, q_off, qsb, qsh, qst, ksb, ksh, ksl, vsb,  \
                         vsh, vsl, Hq, Hkv, Tq, D, L, KB, scale);                                          \
  }                                                                                                       \
  __global__ void attn_combine_##sfx(const float* ws_m, const float* ws_l, const float* ws_acc, T* out,    \
                                     i64 osb, i64 osh, i64 ost, int Hq, int Tq, int D, int nsplit) {       \
    attn_combine_body<T>(ws_m, ws_l, ws_acc, out, osb, osh, ost, Hq, Tq, D, nsplit);                        \
  }
ATT_INST(f32, float)
ATT_INST(bf16, bf16_t)
}
