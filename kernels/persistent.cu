// persistent.cu: the layers of a whole Qwen2 decode step (1 or 2 tokens) in ONE kernel launch.
//
// Why: a small model's step is latency-bound, not bandwidth-bound. The 0.5B draft's step ran 6 kernels
//   a layer (144 a step) at 27% of the H200's bandwidth bound: each kernel pays its launch, its ramp-up
//   and a few dependent memory round trips before its weight stream flows. Here one block per
//   multiprocessor stays resident for the whole step; the phases of a layer are separated by a grid-wide
//   barrier. Measured on the H200 (docs/GPU_RESULTS.md, round 7): NOT yet faster than the many-kernel
//   step (0.5B: 0.959 vs 0.854 ms); a barrier costs ~1.0 us, a layer 36 us, of which attention 10 and
//   gate/up 9. Kept as an option (CudaDecoder(persistent=True), --gpu-draft-step persistent) with the
//   phase timer (-DPT_TIMING=1, tools/pt_phases.py) for the next round.
//
// Phases of a layer (each block takes a contiguous range of output units, so its slice of every weight
//   matrix is one contiguous byte range; asking the L2 for the next phase's range ahead made the step
//   slower on the H200, round 7):
//   qkv:     xn = RMSNorm(resid) * ln1 (every block computes it into shared memory; layer 0 reads the
//            embedding rows), the QKV product in row pairs (the decoder's rope layout: rows 2i, 2i+1 =
//            elements i, i + D/2 of a head), + bias, rope at pos + t, q -> qbuf (fp32), k / v -> the bf16
//            caches at pos + t
//   attn:    items (kv head, key split); a split's keys are scored for the kv head's T * Hq/Hkv query
//            rows, softmaxed locally; (m, l, acc) partials -> ws
//   merge:   a warp per (token, head) merges the splits -> abuf (fp32); with <= PT_FOLD_S splits every
//            block merges them itself at the start of the o phase instead (no barrier, one round trip)
//   o:       resid += abuf @ Wo^T
//   gate/up: xn = RMSNorm(resid) * ln2; interleaved rows (gate j, up j) -> act = silu(gate) * up (fp32)
//   down:    resid += act @ Wdown^T
//   after the last layer block 0 writes xn_out = bf16(RMSNorm(resid) * final_norm) for the LM head.
// A product unit (R = 1 or 2 rows) is done by one warp over the whole row, or, when a block has fewer
//   units than warps, by several warps over K slices summed in a fixed order: the same units, warps and
//   order on every launch of a grid size, so a step is deterministic (a seed reproduces a sampled run).
// Precision: bf16 weights and caches, fp32 everything else (a little more precise than the
//   many-kernel path; the draft's numbers only decide which tokens are proposed, the target's verify
//   decides the output).
// Coherence: blocks exchange activations through global memory between barriers, so every mutable
//   buffer is read with ld.global.cg (L2, never a stale L1 line); weights through the read-only path.
// The grid barrier: a monotonic arrival counter bar[0] that every block polls until all blocks of this
//   barrier have arrived; the last block to leave the kernel resets it (bar[3] counts leavers). 1.0 us a
//   barrier on the H200, against 1.85 us for a counter + generation word reset by the last arriver
//   (round 7, call 3). The grid
//   must be co-resident (launched as a cooperative kernel, one block per multiprocessor). A block that
//   spins too long sets bar[2] and stops waiting (a broken launch then finishes with wrong numbers instead
//   of hanging; the host checks bar[2]).
// Limits (the host checks): H, Hq * D, I multiples of 8, D a multiple of 8 and <= 128,
//   T * Hq / Hkv <= PT_ROWS_MAX.
#include "common.cuh"
#include "qkv_rope.cuh"

#define PT_THREADS 512
#define PT_WARPS (PT_THREADS / 32)
#ifndef PT_FOLD_S
#define PT_FOLD_S 8  // at most this many attention splits: every block merges them itself (no combine phase)
#endif
#ifndef PT_ONLY_BARRIERS
#define PT_ONLY_BARRIERS 0  // diagnostics only: skip every phase's work, keep the barriers (wrong numbers)
#endif
#ifndef PT_TIMING
#define PT_TIMING 0  // 1: block 0 writes %globaltimer after every barrier into bar[8 + slot] (tools/pt_phases.py)
#endif
#ifndef PT_KS_MIN
#define PT_KS_MIN 64  // keys per attention split at least (the host sizes ws for splits of >= 32 keys)
#endif
#define PT_KS_MAX 128  // keys per attention split at most (shared memory: V tile and scores)
#define PT_ROWS_MAX 16  // query rows of one attention item (T * Hq / Hkv)
#ifndef PT_UNROLL
#define PT_UNROLL 4  // 16-byte weight chunks a lane has in flight per row
#endif
#ifndef PT_SPIN_LIMIT
#define PT_SPIN_LIMIT (1u << 24)
#endif
#ifndef PT_BROKEN
#define PT_BROKEN 0  // tests only: a token does not attend to its own position
#endif

enum { LP_QKV, LP_BIAS, LP_O, LP_GU, LP_DOWN, LP_LN1, LP_LN2, LP_K, LP_V, LP_N };

__device__ __forceinline__ unsigned ld_acquire_u32(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
// Grid-wide barrier (module comment). Every thread of every block calls it; `target` is the block's count of
// arrivals to wait for (a monotonic counter: one atomic and one poll on the critical path).
__device__ __forceinline__ void grid_sync(unsigned* bar, unsigned& target) {
  __syncthreads();
  if (threadIdx.x == 0) {
    target += gridDim.x;
    __threadfence();
    atomicAdd(bar, 1u);
    if (ld_acquire_u32(bar + 2) == 0u) {
      unsigned spins = 0;
      while (ld_acquire_u32(bar) < target) {
        if (++spins > PT_SPIN_LIMIT) {
          atomicExch(bar + 2, 1u);
          break;
        }
      }
    }
    __threadfence();
  }
  __syncthreads();
}

// End of a launch: the last block to leave resets the counter for the next launch (every block has left its
// last barrier by then).
__device__ __forceinline__ void grid_exit(unsigned* bar) {
  __syncthreads();
  if (threadIdx.x == 0 && atomicAdd(bar + 3, 1u) == gridDim.x - 1) {
    atomicExch(bar, 0u);
    atomicExch(bar + 3, 0u);
  }
}

// The block's share of U units: [u0, u0 + nu).
__device__ __forceinline__ void unit_range(int U, int& u0, int& nu) {
  u0 = (int)((i64)blockIdx.x * U / gridDim.x);
  nu = (int)((i64)(blockIdx.x + 1) * U / gridDim.x) - u0;
}

// acc[r][t] += sum over 16-byte chunks c0 + lane, c0 + lane + 32, ... < c1 of W row r . xs row t.
template <int R, int T>
__device__ __forceinline__ void warp_dot(const bf16_t* __restrict__ w, int K, const float* xs, int c0, int c1,
                                         int lane, float (&acc)[R][T]) {
  for (int c = c0 + lane; c < c1; c += 32 * PT_UNROLL) {
    uint4 wv[PT_UNROLL][R];
#pragma unroll
    for (int u = 0; u < PT_UNROLL; ++u) {
      const int cc = c + 32 * u;
#pragma unroll
      for (int r = 0; r < R; ++r)
        wv[u][r] = cc < c1 ? __ldg(reinterpret_cast<const uint4*>(w + (i64)r * K) + cc) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < PT_UNROLL; ++u) {
      const int cc = c + 32 * u;
      if (cc < c1) {
        float xv[T][8];
#pragma unroll
        for (int t = 0; t < T; ++t) {
          const float4* xp = reinterpret_cast<const float4*>(xs + (i64)t * K + cc * 8);
          const float4 a = xp[0], b = xp[1];
          xv[t][0] = a.x; xv[t][1] = a.y; xv[t][2] = a.z; xv[t][3] = a.w;
          xv[t][4] = b.x; xv[t][5] = b.y; xv[t][6] = b.z; xv[t][7] = b.w;
        }
#pragma unroll
        for (int r = 0; r < R; ++r) {
          float f[8];
          bf16x8_to_f32(wv[u][r], f);
#pragma unroll
          for (int t = 0; t < T; ++t)
#pragma unroll
            for (int e = 0; e < 8; ++e) acc[r][t] = fmaf(f[e], xv[t][e], acc[r][t]);
        }
      }
    }
  }
}

// How block_units splits the block's nu units over its warps: kw warps a unit, slots units a round, per
// chunks a warp.
__device__ __forceinline__ void unit_split(int nu, int nch, int& kw, int& slots, int& per) {
  kw = nu >= PT_WARPS ? 1 : PT_WARPS / max(nu, 1);
  slots = PT_WARPS / kw;
  per = (nch + kw - 1) / kw;
}

// block_units' split-K reduction: a warp's sums of its part of a unit into red, and the kw parts of unit
// slot `us` summed back in part order.
template <int R, int T>
__device__ __forceinline__ void put_partial(float* red, int warp, const float (&acc)[R][T]) {
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int t = 0; t < T; ++t) red[(warp * R + r) * T + t] = acc[r][t];
}
template <int R, int T>
__device__ __forceinline__ void sum_partials(const float* red, int us, int kw, float (&v)[R][T]) {
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int t = 0; t < T; ++t) {
      float s = 0.f;
      for (int p = 0; p < kw; ++p) s += red[((us * kw + p) * R + r) * T + t];
      v[r][t] = s;
    }
}

// The block's units of a product: unit u = rows u*R .. u*R + R - 1 of W (K columns) against the T rows of
// xs (shared memory); epi(u, v[R][T]) gets each unit's sums (called by one thread a unit).
template <int R, int T, typename Epi>
__device__ __forceinline__ void block_units(const bf16_t* __restrict__ W, int K, int u0, int nu, const float* xs,
                                            float* red, Epi epi) {
  if (nu <= 0) return;  // block-uniform
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nch = K >> 3;
  int kw, slots, per;  // warps a unit, units a round, chunks a warp
  unit_split(nu, nch, kw, slots, per);
  for (int base = 0; base < nu; base += slots) {
    const int slot = warp / kw, part = warp - slot * kw, ul = base + slot;
    float acc[R][T];
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int t = 0; t < T; ++t) acc[r][t] = 0.f;
    const bool active = slot < slots && ul < nu;
    if (active) {
      const int c0 = part * per, c1 = min(nch, c0 + per);
      warp_dot<R, T>(W + (i64)(u0 + ul) * R * K, K, xs, c0, c1, lane, acc);
#pragma unroll
      for (int r = 0; r < R; ++r)
#pragma unroll
        for (int t = 0; t < T; ++t) acc[r][t] = warp_sum(acc[r][t]);
    }
    if (kw == 1) {
      if (active && lane == 0) epi(u0 + ul, acc);
    } else {
      if (active && lane == 0) put_partial<R, T>(red, warp, acc);
      __syncthreads();
      const int us = threadIdx.x;
      if (us < slots && base + us < nu) {
        float v[R][T];
        sum_partials<R, T>(red, us, kw, v);
        epi(u0 + base + us, v);
      }
      __syncthreads();
    }
  }
}

// xs[t][i] = x[t][i] * rsqrt(mean(x[t]^2) + eps) * nw[i] for the T rows of the residual stream
// (fp32, or the embedding rows of `ids` when emb is given); block 0 also writes those embedding rows
// into resid. Ends with __syncthreads.
template <int T>
__device__ __forceinline__ void load_normed(const float* resid, const bf16_t* __restrict__ emb, const i64* ids,
                                            float* resid_out, const bf16_t* __restrict__ nw, int H, float eps,
                                            float* xs, float* bsum) {
  float ss[T];
#pragma unroll
  for (int t = 0; t < T; ++t) {
    ss[t] = 0.f;
    for (int i = threadIdx.x; i < H; i += blockDim.x) {
      float x;
      if (emb != nullptr) {
        x = to_f(emb[ids[t] * H + i]);
        if (blockIdx.x == 0) resid_out[(i64)t * H + i] = x;
      } else {
        x = __ldcg(resid + (i64)t * H + i);
      }
      xs[(i64)t * H + i] = x;
      ss[t] = fmaf(x, x, ss[t]);
    }
  }
#pragma unroll
  for (int t = 0; t < T; ++t) {
    const float inv = rsqrtf(block_sum(ss[t], bsum) / (float)H + eps);
    for (int i = threadIdx.x; i < H; i += blockDim.x) xs[(i64)t * H + i] *= inv * to_f(nw[i]);
  }
  __syncthreads();
}

// xs = n floats of global memory (n % 4 == 0), through L2. Ends with __syncthreads.
__device__ __forceinline__ void load_rows(const float* src, int n, float* xs) {
  for (int i = threadIdx.x; i < (n >> 2); i += blockDim.x)
    reinterpret_cast<float4*>(xs)[i] = __ldcg(reinterpret_cast<const float4*>(src) + i);
  __syncthreads();
}

// Attention item (kv head g, split s): keys j0 .. j0 + nk - 1 for the T * G query rows of kv head g.
template <int T>
__device__ __forceinline__ void attn_item(int g, int s, int ks, int pos, int n_ctx, const float* qbuf,
                                          const bf16_t* kc, const bf16_t* vc, float* ws_m, float* ws_l,
                                          float* ws_acc, int Hq, int Hkv, int D, int max_len, int smax, float* sm) {
  const int G = Hq / Hkv, NR = T * G;
  const int j0 = s * ks, nk = min(ks, n_ctx - j0);
  float* qs = sm;  // NR x D
  float* sc = qs + NR * D;  // NR x PT_KS_MAX
  bf16_t* vs = reinterpret_cast<bf16_t*>(sc + NR * PT_KS_MAX);  // nk x D
  const bf16_t* kbase = kc + ((i64)g * max_len + j0) * D;
  const bf16_t* vbase = vc + ((i64)g * max_len + j0) * D;
  const float scale = rsqrtf((float)D);
  const int jj = threadIdx.x;  // a thread a key (nk <= PT_KS_MAX <= PT_THREADS)
  const uint4* kp = reinterpret_cast<const uint4*>(kbase + (i64)jj * D);
  uint4 kv[8];  // the key row's first 64 dims, in flight with the V tile and the q rows
#pragma unroll
  for (int c = 0; c < 8; ++c)
    if (jj < nk && c < D / 8) kv[c] = __ldcg(kp + c);
  for (int i = threadIdx.x; i < nk * D / 8; i += blockDim.x)
    reinterpret_cast<uint4*>(vs)[i] = __ldcg(reinterpret_cast<const uint4*>(vbase) + i);
  for (int i = threadIdx.x; i < NR * D; i += blockDim.x) {
    const int r = i / D, d = i - r * D, t = r / G, h = g * G + (r - t * G);
    qs[i] = __ldcg(qbuf + ((i64)t * Hq + h) * D + d) * scale;
  }
  __syncthreads();
  if (jj < nk) {
    float acc[PT_ROWS_MAX];
#pragma unroll
    for (int r = 0; r < PT_ROWS_MAX; ++r) acc[r] = 0.f;
    for (int c0 = 0; c0 < D / 8; c0 += 8) {  // 8 chunks (64 dims) of the key row at a time
      if (c0 > 0) {
#pragma unroll
        for (int c = 0; c < 8; ++c)
          if (c0 + c < D / 8) kv[c] = __ldcg(kp + c0 + c);
      }
#pragma unroll
      for (int c = 0; c < 8; ++c) {
        if (c0 + c < D / 8) {
          float f[8];
          bf16x8_to_f32(kv[c], f);
          const float* qc = qs + (c0 + c) * 8;
#pragma unroll
          for (int r = 0; r < PT_ROWS_MAX; ++r)
            if (r < NR)
#pragma unroll
              for (int e = 0; e < 8; ++e) acc[r] = fmaf(qc[r * D + e], f[e], acc[r]);
        }
      }
    }
    const int j = j0 + jj;
#pragma unroll
    for (int r = 0; r < PT_ROWS_MAX; ++r)
      if (r < NR) {
        const int t = r / G;
        const bool vis = PT_BROKEN ? j < pos + t : j <= pos + t;
        sc[r * PT_KS_MAX + jj] = vis ? acc[r] : -MT_INF;
      }
  }
  __syncthreads();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int r = warp; r < NR; r += PT_WARPS) {
    float m = -MT_INF;
    for (int jj = lane; jj < nk; jj += 32) m = fmaxf(m, sc[r * PT_KS_MAX + jj]);
    m = warp_max(m);
    float l = 0.f;
    for (int jj = lane; jj < nk; jj += 32) {
      const float p = m == -MT_INF ? 0.f : __expf(sc[r * PT_KS_MAX + jj] - m);
      sc[r * PT_KS_MAX + jj] = p;
      l += p;
    }
    l = warp_sum(l);
    if (lane == 0) {
      const int t = r / G, h = g * G + (r - t * G);
      const i64 wi = ((i64)t * Hq + h) * smax + s;
      ws_m[wi] = m;
      ws_l[wi] = l;
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < NR * D; i += blockDim.x) {
    const int r = i / D, d = i - r * D, t = r / G, h = g * G + (r - t * G);
    const float* p = sc + r * PT_KS_MAX;
    float a = 0.f;
    for (int jj = 0; jj < nk; ++jj) a = fmaf(p[jj], to_f(vs[jj * D + d]), a);
    ws_acc[(((i64)t * Hq + h) * smax + s) * D + d] = a;
  }
  __syncthreads();  // shared memory is reused by the block's next item
}

// Merge the S attention splits of query row `row` (= t * Hq + h): out[0..D) = sum_s e^(m_s - M) acc_s / L.
__device__ __forceinline__ void merge_splits(const float* ws_m, const float* ws_l, const float* ws_acc, int row, int S,
                                             int smax, int D, int lane, float* out) {
  const i64 base = (i64)row * smax;
  float M = -MT_INF;
  for (int s = lane; s < S; s += 32) M = fmaxf(M, __ldcg(ws_m + base + s));
  M = warp_max(M);
  float Lsum = 0.f;
  for (int s = lane; s < S; s += 32) Lsum += __expf(__ldcg(ws_m + base + s) - M) * __ldcg(ws_l + base + s);
  Lsum = warp_sum(Lsum);
  float o[4] = {0.f, 0.f, 0.f, 0.f};
  for (int s0 = 0; s0 < S; s0 += 32) {
    const float e = s0 + lane < S ? __expf(__ldcg(ws_m + base + s0 + lane) - M) : 0.f;
    const int ns = min(32, S - s0);
    for (int q = 0; q < ns; ++q) {
      const float eq = __shfl_sync(0xffffffffu, e, q);
      const float* ap = ws_acc + (base + s0 + q) * D;
#pragma unroll
      for (int k = 0; k < 4; ++k)
        if (lane + 32 * k < D) o[k] = fmaf(eq, __ldcg(ap + lane + 32 * k), o[k]);
    }
  }
  const float invl = 1.f / Lsum;
#pragma unroll
  for (int k = 0; k < 4; ++k)
    if (lane + 32 * k < D) out[lane + 32 * k] = o[k] * invl;
}

// The same for S <= PT_FOLD_S splits with every load issued at once (one memory round trip).
__device__ __forceinline__ void merge_few(const float* ws_m, const float* ws_l, const float* ws_acc, int row, int S,
                                          int smax, int D, int lane, float* out) {
  const i64 base = (i64)row * smax;
  const float m = lane < S ? __ldcg(ws_m + base + lane) : -MT_INF;
  const float l = lane < S ? __ldcg(ws_l + base + lane) : 0.f;
  float a[PT_FOLD_S][4];
#pragma unroll
  for (int s = 0; s < PT_FOLD_S; ++s)
#pragma unroll
    for (int k = 0; k < 4; ++k) a[s][k] = s < S && lane + 32 * k < D ? __ldcg(ws_acc + (base + s) * D + lane + 32 * k) : 0.f;
  const float M = warp_max(m);
  const float e = lane < S ? __expf(m - M) : 0.f;
  const float invl = 1.f / warp_sum(e * l);
  float o[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
  for (int s = 0; s < PT_FOLD_S; ++s) {
    const float es = __shfl_sync(0xffffffffu, e, s);
#pragma unroll
    for (int k = 0; k < 4; ++k) o[k] = fmaf(es, a[s][k], o[k]);
  }
#pragma unroll
  for (int k = 0; k < 4; ++k)
    if (lane + 32 * k < D) out[lane + 32 * k] = o[k] * invl;
}

#if PT_TIMING
#define PT_MARK(slot)                                                          \
  if (blockIdx.x == 0 && threadIdx.x == 0) {                                   \
    unsigned long long tm_;                                                    \
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(tm_));                    \
    bar[8 + (slot)] = (unsigned)tm_;                                           \
  }
#else
#define PT_MARK(slot)
#endif

template <int T>
__device__ void persist_body(const unsigned long long* __restrict__ lp, const bf16_t* __restrict__ embed,
                             const i64* __restrict__ tokens, const bf16_t* __restrict__ final_norm,
                             const int* __restrict__ pos_p, float* resid, bf16_t* xn_out, float* qbuf, float* ws_m,
                             float* ws_l, float* ws_acc, float* abuf, float* act, unsigned* bar, int L, int H, int Hq,
                             int Hkv, int D, int I, int max_len, int smax, float eps, float theta) {
  extern __shared__ float4 pt_smem4[];
  float* sm = reinterpret_cast<float*>(pt_smem4);
  __shared__ float red[PT_WARPS * 2 * 2];
  __shared__ float bsum[32];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int pos = *pos_p, n_ctx = pos + T, half = D >> 1, HD = Hq * D;
  const int Uqkv = (Hq + 2 * Hkv) * half;
  int q0, nq, o0, no, g0, ng, d0, nd;
  unit_range(Uqkv, q0, nq);
  unit_range(H, o0, no);
  unit_range(I, g0, ng);
  unit_range(H, d0, nd);
  // attention splits: about one item a block, PT_KS_MIN..PT_KS_MAX keys each
  const int per_head = max(1, (int)gridDim.x / Hkv);
  int ks = ((n_ctx + per_head - 1) / per_head + 31) / 32 * 32;
  ks = max(PT_KS_MIN, min(PT_KS_MAX, ks));
  const int S = (n_ctx + ks - 1) / ks;
  i64 ids[T];
#pragma unroll
  for (int t = 0; t < T; ++t) ids[t] = tokens[t];
  auto add_resid = [&](int n, float (&v)[1][T]) {  // the o and down epilogues: resid[t][n] += v
#pragma unroll
    for (int t = 0; t < T; ++t) {
      float* r = resid + (i64)t * H + n;
      __stcg(r, __ldcg(r) + v[0][t]);
    }
  };
  unsigned bar_target = 0;  // arrivals the next barrier waits for
  PT_MARK(0);
  for (int l = 0; l < L; ++l) {
    const unsigned long long* P = lp + (i64)l * LP_N;
    const bf16_t* Wqkv = reinterpret_cast<const bf16_t*>(P[LP_QKV]);
    const bf16_t* bias = reinterpret_cast<const bf16_t*>(P[LP_BIAS]);
    const bf16_t* Wo = reinterpret_cast<const bf16_t*>(P[LP_O]);
    const bf16_t* Wgu = reinterpret_cast<const bf16_t*>(P[LP_GU]);
    const bf16_t* Wd = reinterpret_cast<const bf16_t*>(P[LP_DOWN]);
    bf16_t* kc = reinterpret_cast<bf16_t*>(P[LP_K]);
    bf16_t* vc = reinterpret_cast<bf16_t*>(P[LP_V]);
    // ---- qkv + rope + cache append
    if (!PT_ONLY_BARRIERS)
      load_normed<T>(resid, l == 0 ? embed : nullptr, ids, resid, reinterpret_cast<const bf16_t*>(P[LP_LN1]), H,
                     eps, sm, bsum);
    block_units<2, T>(Wqkv, H, q0, PT_ONLY_BARRIERS ? 0 : nq, sm, red, [&](int p, float (&v)[2][T]) {
      const int h = p / half, i = p - h * half;
      const float b0 = bias != nullptr ? to_f(bias[2 * p]) : 0.f, b1 = bias != nullptr ? to_f(bias[2 * p + 1]) : 0.f;
#pragma unroll
      for (int t = 0; t < T; ++t) {
        float x1 = v[0][t] + b0, x2 = v[1][t] + b1;
        const int ps = pos + t;
        if (h < Hq) {
          rope_pair(x1, x2, ps, i, D, theta, x1, x2);
          float* dst = qbuf + ((i64)t * Hq + h) * D;
          dst[i] = x1;
          dst[i + half] = x2;
        } else {
          bf16_t* dst;
          if (h < Hq + Hkv) {
            rope_pair(x1, x2, ps, i, D, theta, x1, x2);
            dst = kc + ((i64)(h - Hq) * max_len + ps) * D;
          } else {
            dst = vc + ((i64)(h - Hq - Hkv) * max_len + ps) * D;
          }
          dst[i] = from_f<bf16_t>(x1);
          dst[i + half] = from_f<bf16_t>(x2);
        }
      }
    });
    grid_sync(bar, bar_target);
    PT_MARK(1 + 6 * l);
    // ---- attention partials
    for (int it = PT_ONLY_BARRIERS ? Hkv * S : blockIdx.x; it < Hkv * S; it += gridDim.x)
      attn_item<T>(it / S, it - (it / S) * S, ks, pos, n_ctx, qbuf, kc, vc, ws_m, ws_l, ws_acc, Hq, Hkv, D, max_len,
                   smax, sm);
    grid_sync(bar, bar_target);
    PT_MARK(2 + 6 * l);
    const bool fold = S <= PT_FOLD_S;  // the same for every block
    if (!fold) {  // ---- merge the splits: a warp per (token, head) over the grid
      for (int row = PT_ONLY_BARRIERS ? T * Hq : blockIdx.x * PT_WARPS + warp; row < T * Hq; row += gridDim.x * PT_WARPS)
        merge_splits(ws_m, ws_l, ws_acc, row, S, smax, D, lane, abuf + (i64)row * D);
      grid_sync(bar, bar_target);
    }
    PT_MARK(3 + 6 * l);
    // ---- o projection into the residual stream (few splits: each block merges them into shared memory)
    if (fold) {
      for (int row = PT_ONLY_BARRIERS ? T * Hq : warp; row < T * Hq; row += PT_WARPS)
        merge_few(ws_m, ws_l, ws_acc, row, S, smax, D, lane, sm + (i64)row * D);
      __syncthreads();
    } else if (!PT_ONLY_BARRIERS) {
      load_rows(abuf, T * HD, sm);
    }
    block_units<1, T>(Wo, HD, o0, PT_ONLY_BARRIERS ? 0 : no, sm, red, add_resid);
    grid_sync(bar, bar_target);
    PT_MARK(4 + 6 * l);
    // ---- gate/up + SwiGLU
    if (!PT_ONLY_BARRIERS)
      load_normed<T>(resid, nullptr, ids, resid, reinterpret_cast<const bf16_t*>(P[LP_LN2]), H, eps, sm, bsum);
    block_units<2, T>(Wgu, H, g0, PT_ONLY_BARRIERS ? 0 : ng, sm, red, [&](int j, float (&v)[2][T]) {
#pragma unroll
      for (int t = 0; t < T; ++t) {
        const float gt = v[0][t];
        __stcg(act + (i64)t * I + j, gt / (1.f + __expf(-gt)) * v[1][t]);
      }
    });
    grid_sync(bar, bar_target);
    PT_MARK(5 + 6 * l);
    // ---- down projection into the residual stream
    if (!PT_ONLY_BARRIERS) load_rows(act, T * I, sm);
    block_units<1, T>(Wd, I, d0, PT_ONLY_BARRIERS ? 0 : nd, sm, red, add_resid);
    grid_sync(bar, bar_target);
    PT_MARK(6 + 6 * l);
  }
  if (blockIdx.x == 0) {
    load_normed<T>(resid, nullptr, ids, resid, final_norm, H, eps, sm, bsum);
    for (int i = threadIdx.x; i < T * H; i += blockDim.x) xn_out[i] = from_f<bf16_t>(sm[i]);
  }
  grid_exit(bar);
}

#define PT_KERNEL(T)                                                                                               \
  extern "C" __global__ void __launch_bounds__(PT_THREADS, 1) persist##T##_bf16(                                   \
      const unsigned long long* __restrict__ lp, const bf16_t* __restrict__ embed, const i64* __restrict__ tokens, \
      const bf16_t* __restrict__ final_norm, const int* __restrict__ pos_p, float* resid, bf16_t* xn_out,          \
      float* qbuf, float* ws_m, float* ws_l, float* ws_acc, float* abuf, float* act, unsigned* bar, int L, int H,  \
      int Hq, int Hkv, int D, int I, int max_len, int smax, float eps, float theta) {                              \
    persist_body<T>(lp, embed, tokens, final_norm, pos_p, resid, xn_out, qbuf, ws_m, ws_l, ws_acc, abuf, act, bar, \
                    L, H, Hq, Hkv, D, I, max_len, smax, eps, theta);                                               \
  }
PT_KERNEL(1)
PT_KERNEL(2)
