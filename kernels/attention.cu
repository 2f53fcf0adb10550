// attention.cu: causal grouped-query attention over a KV cache, split over the key axis
// (flash-decoding), for one query (decode) or several causal queries (verify / prefill).
//
// Launch layout. attn_partial_*: grid (nsplit, B*Hkv, ceil(G*T / 8)), 128 threads, ~42 KB static shared.
//   A block takes one KV head, the key range [split*KB, (split+1)*KB) and up to 8 query rows of
//   that head's group (row r -> query head kvh*G + r/T, query t = r%T, G = Hq/Hkv), so K and V are
//   read once for all grouped heads. Keys and values are staged 32 at a time in shared memory (all
//   16-byte loads of a chunk issued together when rows are 16-byte aligned); each row keeps
//   an online softmax (running max m, sum l) and an unnormalised fp32 accumulator, written to the
//   workspace (ws_m, ws_l: rows x nsplit; ws_acc: rows x nsplit x D; rows = B*Hq*T).
// attn_combine_*: grid (B*Hq*T), blockDim >= D (multiple of 32): merges the splits and writes out
//   (each thread one d; 16 splits per round trip to memory, no barriers).
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
#define ATT_CG 16  // splits the combine kernel loads at once

// Dot product of a fp32 query row (shared) with a key row of the shared tile; 16-byte reads when
// the row size allows (tile rows are 16-byte aligned), scalar otherwise.
__device__ __forceinline__ float tile_dot(const float* q, const float* k, int D) {
  float s = 0.f;
  if ((D & 3) == 0) {
    for (int d = 0; d < D; d += 4) {
      float4 kv = *reinterpret_cast<const float4*>(k + d);
      float4 qv = *reinterpret_cast<const float4*>(q + d);
      s = fmaf(qv.x, kv.x, fmaf(qv.y, kv.y, fmaf(qv.z, kv.z, fmaf(qv.w, kv.w, s))));
    }
  } else {
    for (int d = 0; d < D; ++d) s = fmaf(q[d], k[d], s);
  }
  return s;
}
__device__ __forceinline__ float tile_dot(const float* q, const bf16_t* k, int D) {
  float s = 0.f;
  if ((D & 7) == 0) {
    for (int d = 0; d < D; d += 8) {
      uint4 kv = *reinterpret_cast<const uint4*>(k + d);
      const unsigned int w[4] = {kv.x, kv.y, kv.z, kv.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        s = fmaf(q[d + 2 * i], __uint_as_float(w[i] << 16), s);
        s = fmaf(q[d + 2 * i + 1], __uint_as_float(w[i] & 0xffff0000u), s);
      }
    }
  } else {
    for (int d = 0; d < D; ++d) s = fmaf(q[d], to_f(k[d]), s);
  }
  return s;
}

#define ATT_VMAX 8  // 16-byte chunks per thread per tile held in registers (vector path)

template <typename T>
__device__ void attn_partial_body(const T* q, const T* kc, const T* vc, float* ws_m, float* ws_l, float* ws_acc,
                                  const int* pos_ptr, int q_off, i64 qsb, i64 qsh, i64 qst, i64 ksb, i64 ksh,
                                  i64 ksl, i64 vsb, i64 vsh, i64 vsl, int Hq, int Hkv, int Tq, int D, int L,
                                  int KB, float scale) {
  __shared__ __align__(16) float qs[ATT_RMAX * ATT_DMAX];
  __shared__ __align__(16) unsigned char tile_raw[ATT_CH * (ATT_DMAX * 4 + 16)];
  __shared__ float sc[ATT_RMAX * ATT_CH];
  __shared__ float s_alpha[ATT_RMAX], s_m[ATT_RMAX], s_l[ATT_RMAX];
  const int tid = threadIdx.x, lane = tid & 31, wid = tid >> 5;
  const int split = blockIdx.x, nsplit = gridDim.x;
  const int b = blockIdx.y / Hkv, kvh = blockIdx.y % Hkv;
  const int G = Hq / Hkv, R = G * Tq;
  const int r0 = blockIdx.z * ATT_RMAX;
  const int nrows = min(ATT_RMAX, R - r0);
  // query rows -> registers first (fp32, pre-scaled): these loads do not depend on the cache position,
  // so they are in flight together with the position's load below
  float qv[ATT_RMAX * ATT_DMAX / ATT_THREADS];
#pragma unroll
  for (int u = 0; u < ATT_RMAX * ATT_DMAX / ATT_THREADS; ++u) {
    int i = tid + u * ATT_THREADS, r = i / D, d = i - r * D;
    qv[u] = 0.f;
    if (r < nrows) {
      int rr = r0 + r, h = kvh * G + rr / Tq, t = rr % Tq;
      qv[u] = to_f(q[b * qsb + h * qsh + t * qst + d]) * scale;
    }
  }
  const int q_start = (pos_ptr ? *pos_ptr : 0) + q_off;
  const int rowb = D * (int)sizeof(T) + 16;  // tile row stride in bytes: 16-byte aligned, bank-skewed
  int kmax = 0;  // one past the last key any row of this block sees
  for (int r = 0; r < nrows; ++r) kmax = max(kmax, min(q_start + ((r0 + r) % Tq), L - 1) + 1);
  const int kstart = split * KB;
  const int kend = min(kstart + KB, kmax);
  const T* kbase = kc + b * ksb + kvh * ksh;
  const T* vbase = vc + b * vsb + kvh * vsh;
  // vector path: 16-byte rows in global memory and few enough chunks to hold a tile in registers
  const int cpr = (D * (int)sizeof(T)) >> 4;  // 16-byte chunks per row
  const int per = (ATT_CH * cpr + ATT_THREADS - 1) / ATT_THREADS;
  const bool vec = ((D * (int)sizeof(T)) & 15) == 0 && ((ksl * (i64)sizeof(T)) & 15) == 0 &&
                   ((vsl * (i64)sizeof(T)) & 15) == 0 && (((size_t)kbase) & 15) == 0 &&
                   (((size_t)vbase) & 15) == 0 && per <= ATT_VMAX;

#pragma unroll
  for (int u = 0; u < ATT_RMAX * ATT_DMAX / ATT_THREADS; ++u) {  // query rows -> shared
    int i = tid + u * ATT_THREADS, r = i / D, d = i - r * D;
    if (r < ATT_RMAX) qs[r * ATT_DMAX + d] = qv[u];
  }
  if (tid < ATT_RMAX) { s_m[tid] = -MT_INF; s_l[tid] = 0.f; }
  float acc[ATT_RMAX][2];
#pragma unroll
  for (int r = 0; r < ATT_RMAX; ++r) { acc[r][0] = 0.f; acc[r][1] = 0.f; }
  __syncthreads();

  for (int c0 = kstart; c0 < kend; c0 += ATT_CH) {
    const int nk = min(ATT_CH, kend - c0);
    uint4 kreg[ATT_VMAX], vreg[ATT_VMAX];
    if (vec) {  // issue every K and V load of the chunk before using any
#pragma unroll
      for (int u = 0; u < ATT_VMAX; ++u) {
        int e = tid + u * ATT_THREADS, j = e / cpr, c = e - j * cpr;
        bool ok = u < per && j < nk;
        kreg[u] = ok ? __ldg(reinterpret_cast<const uint4*>(kbase + (i64)(c0 + j) * ksl) + c) : make_uint4(0, 0, 0, 0);
        vreg[u] = ok ? __ldg(reinterpret_cast<const uint4*>(vbase + (i64)(c0 + j) * vsl) + c) : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int u = 0; u < ATT_VMAX; ++u) {
        int e = tid + u * ATT_THREADS, j = e / cpr, c = e - j * cpr;
        if (u < per && j < ATT_CH) *reinterpret_cast<uint4*>(tile_raw + j * rowb + c * 16) = kreg[u];
      }
    } else {
      for (int i = tid; i < ATT_CH * D; i += ATT_THREADS) {
        int j = i / D, d = i - j * D;
        reinterpret_cast<T*>(tile_raw + j * rowb)[d] = j < nk ? kbase[(i64)(c0 + j) * ksl + d] : from_f<T>(0.f);
      }
    }
    __syncthreads();
    for (int p = tid; p < ATT_RMAX * ATT_CH; p += ATT_THREADS) {
      int r = p / ATT_CH, j = p - r * ATT_CH;
      float s = -MT_INF;
      if (r < nrows && j < nk && c0 + j <= q_start + ((r0 + r) % Tq))
        s = tile_dot(qs + r * ATT_DMAX, reinterpret_cast<const T*>(tile_raw + j * rowb), D);
      sc[p] = s;
    }
    __syncthreads();
    // V into the tile (K no longer needed) while the warps update the softmax state
    if (vec) {
#pragma unroll
      for (int u = 0; u < ATT_VMAX; ++u) {
        int e = tid + u * ATT_THREADS, j = e / cpr, c = e - j * cpr;
        if (u < per && j < ATT_CH) *reinterpret_cast<uint4*>(tile_raw + j * rowb + c * 16) = vreg[u];
      }
    } else {
      for (int i = tid; i < ATT_CH * D; i += ATT_THREADS) {
        int j = i / D, d = i - j * D;
        reinterpret_cast<T*>(tile_raw + j * rowb)[d] = j < nk ? vbase[(i64)(c0 + j) * vsl + d] : from_f<T>(0.f);
      }
    }
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
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      int d = tid + k * ATT_THREADS;
      if (d < D) {
        float vcol[ATT_CH];
#pragma unroll
        for (int j = 0; j < ATT_CH; ++j) vcol[j] = to_f(reinterpret_cast<const T*>(tile_raw + j * rowb)[d]);
#pragma unroll
        for (int r = 0; r < ATT_RMAX; ++r) {
          float a = acc[r][k] * s_alpha[r];
          const float* pr = sc + r * ATT_CH;
#pragma unroll
          for (int j = 0; j < ATT_CH; ++j) a = fmaf(pr[j], vcol[j], a);  // p = 0 past nk
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
  // every thread merges the splits itself, ATT_CG at a time: all loads of a group (m and l are
  // broadcast reads, acc coalesced over d) are issued before any is used, so up to ATT_CG splits cost
  // one round trip to memory and no block barrier; an online rescale carries the running max across
  // groups. Fixed order per row: the result does not depend on Tq.
  const i64 row = blockIdx.x;
  const int t = (int)(row % Tq);
  const i64 bh = row / Tq;
  const int h = (int)(bh % Hq), b = (int)(bh / Hq);
  const float* m = ws_m + row * nsplit;
  const float* l = ws_l + row * nsplit;
  const int d = threadIdx.x;
  float M = -MT_INF, den = 0.f, num = 0.f;
  for (int s0 = 0; s0 < nsplit; s0 += ATT_CG) {
    float mv[ATT_CG], lv[ATT_CG], av[ATT_CG];
#pragma unroll
    for (int u = 0; u < ATT_CG; ++u) {
      const int s = s0 + u;
      const bool ok = s < nsplit;
      mv[u] = ok ? m[s] : -MT_INF;
      lv[u] = ok ? l[s] : 0.f;
      av[u] = ok && d < D ? ws_acc[(row * nsplit + s) * D + d] : 0.f;
    }
    float gm = M;
#pragma unroll
    for (int u = 0; u < ATT_CG; ++u) gm = fmaxf(gm, mv[u]);
    if (gm == -MT_INF) continue;  // nothing visible yet
    const float sc = (M == -MT_INF) ? 0.f : __expf(M - gm);
    den *= sc;
    num *= sc;
#pragma unroll
    for (int u = 0; u < ATT_CG; ++u) {
      const float w = (mv[u] == -MT_INF) ? 0.f : __expf(mv[u] - gm);
      den = fmaf(w, lv[u], den);
      num = fmaf(w, av[u], num);
    }
    M = gm;
  }
  if (d < D) out[b * osb + h * osh + t * ost + d] = from_f<T>(den > 0.f ? num / den : 0.f);
}

extern "C" {
#define ATT_INST(sfx, T)                                                                                  \
  __global__ void __launch_bounds__(ATT_THREADS) attn_partial_##sfx(                                      \
      const T* q, const T* kc, const T* vc, float* ws_m, float* ws_l, float* ws_acc, const int* pos_ptr,   \
      int q_off, i64 qsb, i64 qsh, i64 qst, i64 ksb, i64 ksh, i64 ksl, i64 vsb, i64 vsh, i64 vsl, int Hq,  \
      int Hkv, int Tq, int D, int L, int KB, float scale) {                                                \
    pdl_wait();                                                                                           \
    attn_partial_body<T>(q, kc, vc, ws_m, ws_l, ws_acc, pos_ptr, q_off, qsb, qsh, qst, ksb, ksh, ksl, vsb,  \
                         vsh, vsl, Hq, Hkv, Tq, D, L, KB, scale);                                          \
  }                                                                                                       \
  __global__ void attn_combine_##sfx(const float* ws_m, const float* ws_l, const float* ws_acc, T* out,    \
                                     i64 osb, i64 osh, i64 ost, int Hq, int Tq, int D, int nsplit) {       \
    pdl_trigger(); /* the O projection may start streaming its weights */                                 \
    pdl_wait();                                                                                           \
    attn_combine_body<T>(ws_m, ws_l, ws_acc, out, osb, osh, ost, Hq, Tq, D, nsplit);                        \
  }
ATT_INST(f32, float)
ATT_INST(bf16, bf16_t)
}
