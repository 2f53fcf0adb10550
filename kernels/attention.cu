// attention.cu: causal grouped-query attention over a KV cache, split over the key axis
// (flash-decoding), for one query (decode) or several causal queries (verify / prefill).
//
// Launch layout. attn_partial_*: grid (slots, B*Hkv, ceil(G*T / 8)), slots <= nsplit (the last argument),
//   128 threads, ~42 KB static shared. A block takes splits blockIdx.x, blockIdx.x + slots, ... in turn
//   and stops at the first that holds no key its rows see (writing nothing for it): a cache sized for
//   32k positions costs a short context what its visible splits cost.
//   A block takes one KV head, the key range [split*KB, (split+1)*KB) and up to 8 query rows of
//   that head's group (row r -> query head kvh*G + r/T, query t = r%T, G = Hq/Hkv), so K and V are
//   read once for all grouped heads. Keys and values are staged 32 at a time in shared memory (all
//   16-byte loads of a chunk issued together when rows are 16-byte aligned); each row keeps
//   an online softmax (running max m, sum l) and an unnormalised fp32 accumulator, written to the
//   workspace (ws_m, ws_l: rows x nsplit; ws_acc: rows x nsplit x D; rows = B*Hq*T).
// attn_partial_bf16_d64 / _d128: attn_partial_bf16 for the decoder's head sizes and 16-byte aligned K/V
//   rows, same launch, same bits (attn_partial_fast). A decode step runs attention once a layer on a cold
//   instruction cache: the generic kernel's 75 KB of unrolled code (now 52 KB) cost ~7 us a launch more on
//   its first key chunk than on later ones. The compact kernel (25-30 KB) also loads the keys cached by earlier
//   steps and the position before pdl_wait, q with the first chunk, and each next chunk during the current
//   one. H200, coder pair shapes, 256 cached keys (tools/attn_probe.py, docs/GPU_RESULTS.md round 8), one
//   call: 0.5B step 0.702 ms against 0.810 with the generic kernel, 1.5B (tensor-core GEMV) 1.492 against
//   1.608; the original generic kernel gave 0.850 / 1.654 (an earlier call).
// attn_combine_*: grid (B*Hq*T), blockDim >= D (multiple of 32): merges the splits that hold a key the row
//   sees (from the position: pos_ptr, q_off, L, KB as attn_partial's) and writes out (each thread one d;
//   16 splits per round trip to memory, no barriers). Empty splits change no bit of the merge, so the
//   result equals merging all nsplit of them.
// Positions: query t sits at q_start + t, q_start = (*pos_ptr if pos_ptr else 0) + q_off, and sees
//   keys 0 .. min(q_start + t, L - 1). With pos_ptr (a device int32) a captured CUDA graph replays
//   at the current cache length; blocks past the last visible key write an empty split.
// Layouts: q element (b, h, t, d) at b*qsb + h*qsh + t*qst + d; K/V (b, hkv, l, d) at
//   b*ksb + hkv*ksh + l*ksl + d; out (b, h, t, d) at b*osb + h*osh + t*ost + d (d contiguous).
// Limits: D <= 256, KB a multiple of 32, contexts up to 2^31 keys (tested to 32k+).
#include "common.cuh"

#define ATT_RMAX 8
#define ATT_CH 32
#define ATT_DMAX 256  // largest head dim: minitorch/cuda/launch.py's ATT_DMAX checks it (keep the two equal)
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

// Two query rows against one bf16 key row: each sum is tile_dot's, operation for operation (same bits).
__device__ __forceinline__ void tile_dot2(const float* qa, const float* qb, const bf16_t* k, int D, float& sa,
                                          float& sb) {
  sa = 0.f;
  sb = 0.f;
#pragma unroll 2
  for (int d = 0; d < D; d += 8) {
    uint4 kv = *reinterpret_cast<const uint4*>(k + d);
    const unsigned int w[4] = {kv.x, kv.y, kv.z, kv.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float lo = __uint_as_float(w[i] << 16), hi = __uint_as_float(w[i] & 0xffff0000u);
      sa = fmaf(qa[d + 2 * i], lo, sa);
      sb = fmaf(qb[d + 2 * i], lo, sb);
      sa = fmaf(qa[d + 2 * i + 1], hi, sa);
      sb = fmaf(qb[d + 2 * i + 1], hi, sb);
    }
  }
}

#define ATT_VMAX 8  // 16-byte chunks per thread per tile held in registers (vector path: ATT_DMAX bf16 rows)

// Code size matters here: a step runs each attention kernel once a layer on cold instruction caches, and
// the first version (75 KB of unrolled code, an integer division in every unrolled element) cost ~7 us a
// launch more on its first key chunk than on the next (H200, round 8: tools/attn_probe.py). So the hot
// loops below step their indices instead of dividing, and only what must live in registers is unrolled.

// (row, column) of element tid + u * ATT_THREADS of a rows x W array, stepped from u to u + 1 without a
// division (W > 0; one division when constructed).
struct RowCol {
  int r, c, rs, cs;
  __device__ __forceinline__ explicit RowCol(int W)
      : r((int)threadIdx.x / W), c((int)threadIdx.x % W), rs(ATT_THREADS / W), cs(ATT_THREADS % W) {}
  __device__ __forceinline__ void next(int W) {
    r += rs;
    c += cs;
    if (c >= W) { c -= W; ++r; }
  }
};

// Vector path: the 16-byte chunks of keys c0 .. c0 + nk - 1 that this thread loads (chunk e = tid +
// u * ATT_THREADS -> key j = e / cpr, piece c = e % cpr), all issued before any is used; zeros past nk.
__device__ __forceinline__ void load_kv_chunk(uint4 (&kreg)[ATT_VMAX], uint4 (&vreg)[ATT_VMAX], const void* kbase,
                                              const void* vbase, i64 kslb, i64 vslb, int c0, int nk, int cpr,
                                              int per) {
  RowCol e(cpr);
#pragma unroll
  for (int u = 0; u < ATT_VMAX; ++u, e.next(cpr)) {
    bool ok = u < per && e.r < nk;
    kreg[u] = ok ? __ldg(reinterpret_cast<const uint4*>(static_cast<const unsigned char*>(kbase) + (c0 + e.r) * kslb) + e.c)
                 : make_uint4(0, 0, 0, 0);
    vreg[u] = ok ? __ldg(reinterpret_cast<const uint4*>(static_cast<const unsigned char*>(vbase) + (c0 + e.r) * vslb) + e.c)
                 : make_uint4(0, 0, 0, 0);
  }
}

// One chunk of ATT_CH key (or value) rows into the shared tile (row stride rowb bytes): from the
// registers of load_kv_chunk (vector path) or straight from memory (scalar path, zeros past nk).
template <typename T>
__device__ __forceinline__ void fill_tile(unsigned char* tile, int rowb, bool vec, const uint4 (&reg)[ATT_VMAX],
                                          int per, int cpr, const T* base, i64 sl, int c0, int nk, int D) {
  const int tid = threadIdx.x;
  if (vec) {
    RowCol e(cpr);
#pragma unroll
    for (int u = 0; u < ATT_VMAX; ++u, e.next(cpr))
      if (u < per && e.r < ATT_CH) *reinterpret_cast<uint4*>(tile + e.r * rowb + e.c * 16) = reg[u];
  } else {
    for (int i = tid; i < ATT_CH * D; i += ATT_THREADS) {
      int j = i / D, d = i - j * D;
      reinterpret_cast<T*>(tile + j * rowb)[d] = j < nk ? base[(i64)(c0 + j) * sl + d] : from_f<T>(0.f);
    }
  }
}

// Merge up to ATT_CG splits (each: running max m, sum l, unnormalised accumulator a of one output
// element) into the running (M, den, num), in split order; an online rescale carries the running max
// across calls. attn_combine merges with this.
__device__ __forceinline__ void merge_splits(const float (&mv)[ATT_CG], const float (&lv)[ATT_CG],
                                             const float (&av)[ATT_CG], float& M, float& den, float& num) {
  float gm = M;
#pragma unroll
  for (int u = 0; u < ATT_CG; ++u) gm = fmaxf(gm, mv[u]);
  if (gm == -MT_INF) return;  // nothing visible yet
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

// One output element from all nsplit splits, merged ATT_CG at a time in split order:
// load(s, m, l, a) reads split s (only for s < nsplit; it returns a = 0 for a lane past D). All loads of
// a group are issued before any is used (attn_combine's loader reads global memory).
template <class Load>
__device__ __forceinline__ float merge_all_splits(Load load, int nsplit) {
  float M = -MT_INF, den = 0.f, num = 0.f;
  for (int s0 = 0; s0 < nsplit; s0 += ATT_CG) {
    float mv[ATT_CG], lv[ATT_CG], av[ATT_CG];
#pragma unroll
    for (int u = 0; u < ATT_CG; ++u) {
      mv[u] = -MT_INF;
      lv[u] = av[u] = 0.f;
      if (s0 + u < nsplit) load(s0 + u, mv[u], lv[u], av[u]);
    }
    merge_splits(mv, lv, av, M, den, num);
  }
  return den > 0.f ? num / den : 0.f;
}


// The online softmax update after one chunk of ATT_CH scores (sc, rows x ATT_CH): a warp a row, each
// row's running max s_m and sum s_l rescaled, sc turned into the chunk's weights, s_alpha = the factor the
// row's accumulator is rescaled by. Both attn_partial bodies call it, so they agree bit for bit.
__device__ __forceinline__ void chunk_softmax(float* sc, float* s_m, float* s_l, float* s_alpha, int wid, int lane) {
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
}

// One split (keys [split*KB, (split+1)*KB)) of one block's head group and rows. Returns false, having
// written nothing, when the split lies past every key the block's rows see (attn_combine
// reads only the splits a row sees, so such splits need no workspace entry; later splits are empty too).
template <typename T>
__device__ bool attn_partial_body(const T* q, const T* kc, const T* vc, float* ws_m, float* ws_l, float* ws_acc,
                                  const int* pos_ptr, int q_off, i64 qsb, i64 qsh, i64 qst, i64 ksb, i64 ksh,
                                  i64 ksl, i64 vsb, i64 vsh, i64 vsl, int Hq, int Hkv, int Tq, int D, int L,
                                  int KB, float scale, T* out, i64 osb, i64 osh, i64 ost, int split, int nsplit) {
  __shared__ __align__(16) float qs[ATT_RMAX * ATT_DMAX];
  __shared__ __align__(16) unsigned char tile_raw[ATT_CH * (ATT_DMAX * 4 + 16)];
  __shared__ float sc[ATT_RMAX * ATT_CH];
  __shared__ float s_alpha[ATT_RMAX], s_m[ATT_RMAX], s_l[ATT_RMAX];
  const int tid = threadIdx.x, lane = tid & 31, wid = tid >> 5;
  const int b = blockIdx.y / Hkv, kvh = blockIdx.y % Hkv;
  const int G = Hq / Hkv, R = G * Tq;
  const int r0 = blockIdx.z * ATT_RMAX;
  const int nrows = min(ATT_RMAX, R - r0);
  // query rows -> registers first (fp32, pre-scaled): these loads do not depend on the cache position,
  // so they are in flight together with the position's load below (row offsets from a table: no division
  // in the unrolled loop)
  __shared__ i64 s_qoff[ATT_RMAX];
  if (tid < nrows) {
    const int rr = r0 + tid;
    s_qoff[tid] = b * qsb + (kvh * G + rr / Tq) * qsh + (rr % Tq) * qst;
  }
  __syncthreads();
  float qv[ATT_RMAX * ATT_DMAX / ATT_THREADS];
  {
    RowCol e(D);
#pragma unroll
    for (int u = 0; u < ATT_RMAX * ATT_DMAX / ATT_THREADS; ++u, e.next(D))
      qv[u] = e.r < nrows ? to_f(q[s_qoff[e.r] + e.c]) * scale : 0.f;
  }
  const int rowb = D * (int)sizeof(T) + 16;  // tile row stride in bytes: 16-byte aligned, bank-skewed
  const int kstart = split * KB;
  const T* kbase = kc + b * ksb + kvh * ksh;
  const T* vbase = vc + b * vsb + kvh * vsh;
  // vector path: 16-byte rows in global memory and few enough chunks to hold a tile in registers
  const int cpr = (D * (int)sizeof(T)) >> 4;  // 16-byte chunks per row
  const int per = (ATT_CH * cpr + ATT_THREADS - 1) / ATT_THREADS;
  const bool vec = ((D * (int)sizeof(T)) & 15) == 0 && ((ksl * (i64)sizeof(T)) & 15) == 0 &&
                   ((vsl * (i64)sizeof(T)) & 15) == 0 && (((size_t)kbase) & 15) == 0 &&
                   (((size_t)vbase) & 15) == 0 && per <= ATT_VMAX;
  const i64 kslb = ksl * (i64)sizeof(T), vslb = vsl * (i64)sizeof(T);
  uint4 kreg[ATT_VMAX], vreg[ATT_VMAX];
  const int q_start = (pos_ptr ? *pos_ptr : 0) + q_off;
  int kmax = 0;  // one past the last key any row of this block sees
  for (int r = 0; r < nrows; ++r) kmax = max(kmax, min(q_start + ((r0 + r) % Tq), L - 1) + 1);
  const int kend = min(kstart + KB, kmax);
  if (kstart >= kmax) return false;  // uniform over the block: before any barrier

  {
    RowCol e(D);
#pragma unroll
    for (int u = 0; u < ATT_RMAX * ATT_DMAX / ATT_THREADS; ++u, e.next(D))  // query rows -> shared
      if (e.r < ATT_RMAX) qs[e.r * ATT_DMAX + e.c] = qv[u];
  }
  if (tid < ATT_RMAX) { s_m[tid] = -MT_INF; s_l[tid] = 0.f; }
  float acc[ATT_RMAX][2];
#pragma unroll
  for (int r = 0; r < ATT_RMAX; ++r) { acc[r][0] = 0.f; acc[r][1] = 0.f; }
  __syncthreads();

  for (int c0 = kstart; c0 < kend; c0 += ATT_CH) {
    const int nk = min(ATT_CH, kend - c0);
    if (vec) load_kv_chunk(kreg, vreg, kbase, vbase, kslb, vslb, c0, nk, cpr, per);
    fill_tile<T>(tile_raw, rowb, vec, kreg, per, cpr, kbase, ksl, c0, nk, D);
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
    fill_tile<T>(tile_raw, rowb, vec, vreg, per, cpr, vbase, vsl, c0, nk, D);
    chunk_softmax(sc, s_m, s_l, s_alpha, wid, lane);
    __syncthreads();
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      int d = tid + k * ATT_THREADS;
      if (d < D) {
#pragma unroll
        for (int r = 0; r < ATT_RMAX; ++r) acc[r][k] *= s_alpha[r];
        const T* vcol = reinterpret_cast<const T*>(tile_raw) + d;
#pragma unroll 4
        for (int j = 0; j < ATT_CH; ++j) {  // every row's sum runs over the keys in order
          const float v = to_f(vcol[j * (rowb / (int)sizeof(T))]);
#pragma unroll
          for (int r = 0; r < ATT_RMAX; ++r) acc[r][k] = fmaf(sc[r * ATT_CH + j], v, acc[r][k]);  // p = 0 past nk
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
  return true;
}

// attn_partial_bf16_d64 / _d128: attn_partial_bf16 for head size DH in {64, 128} with 16-byte aligned K/V
// rows (the decoder's caches), in a fraction of the code: compile-time sizes, no scalar fallback, no index
// divisions in the loops, the key loop of P.V rolled. The arithmetic is attn_partial_body's, operation for
// operation (the same tile_dot, softmax and P.V order), so it writes the same bits (tests/test_cuda_attention.py).
template <int DH, bool ROWS = false, bool TREE = false>
__device__ bool attn_partial_fast(const bf16_t* q, const bf16_t* kc, const bf16_t* vc, float* ws_m, float* ws_l,
                                  float* ws_acc, const int* pos_ptr, int q_off, i64 qsb, i64 qsh, i64 qst, i64 ksb,
                                  i64 ksh, i64 ksl, i64 vsb, i64 vsh, i64 vsl, int Hq, int Hkv, int Tq, int L,
                                  int KB, float scale, int split, int nsplit, bool& waited,
                                  const int* tslot = nullptr, bool preload = true, const int* tbase = nullptr,
                                  const int* tanc = nullptr, int tw = 0) {
  constexpr int CPR = DH * 2 / 16;                 // 16-byte pieces per K/V row
  constexpr int PER = ATT_CH * CPR / ATT_THREADS;  // pieces per thread per tile
  constexpr int ROWB = DH * 2 + 16;                // tile row stride (bytes): 16-byte aligned, bank-skewed
  static_assert(DH <= ATT_THREADS && PER >= 1, "one output column per thread");
  __shared__ __align__(16) float qs[ATT_RMAX * DH];
  __shared__ __align__(16) unsigned char tile[ATT_CH * ROWB];
  __shared__ float sc[ATT_RMAX * ATT_CH];
  __shared__ float s_alpha[ATT_RMAX], s_m[ATT_RMAX], s_l[ATT_RMAX];
  __shared__ i64 s_qoff[ATT_RMAX], s_row[ATT_RMAX];
  const int tid = threadIdx.x, lane = tid & 31, wid = tid >> 5;
  const int b = blockIdx.y / Hkv, kvh = blockIdx.y % Hkv;
  const int G = Hq / Hkv;
  const int r0 = blockIdx.z * ATT_RMAX;
  const int nrows = min(ATT_RMAX, G * Tq - r0);
  if (tid < nrows) {  // row r: query head kvh * G + (r0 + r) / Tq, token (r0 + r) % Tq
    const int rr = r0 + tid, h = kvh * G + rr / Tq, t = rr % Tq;
    s_qoff[tid] = b * qsb + h * qsh + t * qst;
    s_row[tid] = ((i64)b * Hq + h) * Tq + t;
  }
  // ROWS (attn_rows_partial_*): b is a token of the step, at position pos_ptr[b], of sequence tslot[b]
  const int q_start = (pos_ptr ? pos_ptr[ROWS ? b : 0] : 0) + q_off;
  // one past the last key any row of this block sees: its latest token's (t = (r0 + r) % Tq, largest at
  // the end of the rows or at Tq - 1 when they wrap)
  const int t0 = r0 % Tq, tmax = (nrows >= Tq || t0 + nrows > Tq) ? Tq - 1 : t0 + nrows - 1;
  const int kmax = min(q_start + tmax, L - 1) + 1;
  const int kstart = split * KB, kend = min(kstart + KB, kmax);
  if (kstart >= kmax) return false;  // uniform over the block: before any barrier
  const i64 sb = TREE ? 0 : ROWS ? (i64)tslot[b] : (i64)b;
  const unsigned char* kb = reinterpret_cast<const unsigned char*>(kc + sb * ksb + kvh * ksh);
  const unsigned char* vb = reinterpret_cast<const unsigned char*>(vc + sb * vsb + kvh * vsh);
  const i64 kslb = ksl * 2, vslb = vsl * 2;
  // TREE (attn_tree_partial_*): token b's keys in the order a decode step at its position reads them: the cache
  // below the tree's first row base, then its ancestors and itself, key base + k at row base + tanc[b * tw + k]
  const int base = TREE ? *tbase : 0;
  auto krow = [&](int v) -> i64 {
    if constexpr (TREE) return v < base ? (i64)v : (i64)base + tanc[b * tw + (v - base)];
    else return (i64)v;
  };
  // the chunk starting at key c0 -> registers (piece e = tid + u * ATT_THREADS: key e / CPR, piece e % CPR;
  // zeros past kend): issued a chunk ahead, so its round trip overlaps the work on the one before
  uint4 kreg[PER], vreg[PER];
  auto load_chunk = [&](int c0, int lo, int hi) {  // keys c0 + j in [lo, hi) are loaded, the rest zeroed
#pragma unroll
    for (int u = 0; u < PER; ++u) {
      const int e = tid + u * ATT_THREADS, j = e / CPR, c = e % CPR;
      const bool ok = c0 + j >= lo && c0 + j < hi;
      const i64 kr = ok ? krow(c0 + j) : 0;
      kreg[u] = ok ? __ldg(reinterpret_cast<const uint4*>(kb + kr * kslb) + c) : make_uint4(0, 0, 0, 0);
      vreg[u] = ok ? __ldg(reinterpret_cast<const uint4*>(vb + kr * vslb) + c) : make_uint4(0, 0, 0, 0);
    }
  };
  auto store_chunk = [&](const uint4 (&reg)[PER]) {
#pragma unroll
    for (int u = 0; u < PER; ++u) {
      const int e = tid + u * ATT_THREADS;
      *reinterpret_cast<uint4*>(tile + (e / CPR) * ROWB + (e % CPR) * 16) = reg[u];
    }
  };
  __syncthreads();  // s_qoff
  // The keys before q_start were cached by earlier steps: on the first split they are loaded before
  // pdl_wait, while the QKV GEMV that writes this step's keys, values and queries finishes.
  // (ROWS without preload: a prefill step, whose tokens see keys this step's QKV GEMV writes: none early)
  // (TREE: the keys below the tree's first row; the tree's rows are this step's)
  const int pre = waited || (ROWS && !preload) ? kstart : min(kend, TREE ? base : q_start);
  load_chunk(kstart, kstart, pre);
  if (!waited) {
    pdl_wait();
    waited = true;
  }
  float qv[ATT_RMAX * DH / ATT_THREADS];  // query rows (fp32, pre-scaled), loaded with the first chunk
#pragma unroll
  for (int u = 0; u < ATT_RMAX * DH / ATT_THREADS; ++u) {
    const int r = tid / DH + u * (ATT_THREADS / DH);
    qv[u] = r < nrows ? to_f(q[s_qoff[r] + tid % DH]) * scale : 0.f;
  }
  if (pre < kend) {  // this step's keys (and, after the first split, every key): after the wait
#pragma unroll
    for (int u = 0; u < PER; ++u) {
      const int e = tid + u * ATT_THREADS, j = e / CPR, c = e % CPR;
      if (kstart + j >= pre && kstart + j < kend) {
        const i64 kr = krow(kstart + j);
        kreg[u] = __ldg(reinterpret_cast<const uint4*>(kb + kr * kslb) + c);
        vreg[u] = __ldg(reinterpret_cast<const uint4*>(vb + kr * vslb) + c);
      }
    }
  }
#pragma unroll
  for (int u = 0; u < ATT_RMAX * DH / ATT_THREADS; ++u) qs[(tid / DH + u * (ATT_THREADS / DH)) * DH + tid % DH] = qv[u];
  if (tid < ATT_RMAX) { s_m[tid] = -MT_INF; s_l[tid] = 0.f; }
  float acc[ATT_RMAX];
#pragma unroll
  for (int r = 0; r < ATT_RMAX; ++r) acc[r] = 0.f;
  // scores: thread tid takes key j = tid % 32 for rows ra = tid / 32 and ra + 4 (one read of the key row)
  static_assert(ATT_RMAX * ATT_CH == 2 * ATT_THREADS, "two scores a thread");
  const int sj = tid % ATT_CH, ra = tid / ATT_CH, rb = ra + ATT_THREADS / ATT_CH;
  const int ta = q_start + (r0 + ra) % Tq, tb = q_start + (r0 + rb) % Tq;

  for (int c0 = kstart; c0 < kend; c0 += ATT_CH) {
    const int nk = min(ATT_CH, kend - c0);
    store_chunk(kreg);
    __syncthreads();
    {
      float sa, sb;
      tile_dot2(qs + ra * DH, qs + rb * DH, reinterpret_cast<const bf16_t*>(tile + sj * ROWB), DH, sa, sb);
      const bool kj = sj < nk;  // a key of this chunk
      sc[ra * ATT_CH + sj] = (ra < nrows && kj && c0 + sj <= ta) ? sa : -MT_INF;
      sc[rb * ATT_CH + sj] = (rb < nrows && kj && c0 + sj <= tb) ? sb : -MT_INF;
    }
    __syncthreads();
    store_chunk(vreg);  // V into the tile (K no longer needed) while the warps update the softmax
    if (c0 + ATT_CH < kend) load_chunk(c0 + ATT_CH, c0 + ATT_CH, kend);
    chunk_softmax(sc, s_m, s_l, s_alpha, wid, lane);
    __syncthreads();
    if (tid < DH) {
#pragma unroll
      for (int r = 0; r < ATT_RMAX; ++r) acc[r] *= s_alpha[r];
      const bf16_t* vcol = reinterpret_cast<const bf16_t*>(tile) + tid;
#pragma unroll 4
      for (int j = 0; j < ATT_CH; ++j) {  // every row's sum runs over the keys in order
        const float v = to_f(vcol[j * (ROWB / 2)]);
#pragma unroll
        for (int r = 0; r < ATT_RMAX; ++r) acc[r] = fmaf(sc[r * ATT_CH + j], v, acc[r]);  // p = 0 past nk
      }
    }
    __syncthreads();
  }
  if (tid < DH) {  // the accumulators through shared memory (q is no longer needed): a rolled write loop
#pragma unroll
    for (int r = 0; r < ATT_RMAX; ++r) qs[r * DH + tid] = acc[r];
  }
  __syncthreads();
  for (int r = 0; r < nrows; ++r) {
    const i64 w = s_row[r] * nsplit + split;
    if (tid == 0) { ws_m[w] = s_m[r]; ws_l[w] = s_l[r]; }
    if (tid < DH) ws_acc[w * DH + tid] = qs[r * DH + tid];
  }
  return true;
}

template <typename T, bool ROWS = false>
__device__ void attn_combine_body(const float* ws_m, const float* ws_l, const float* ws_acc, T* out, i64 osb,
                                  i64 osh, i64 ost, int Hq, int Tq, int D, int nsplit, const int* pos_ptr,
                                  int q_off, int L, int KB) {
  // every thread merges the splits itself (merge_all_splits): m and l are broadcast reads, acc is
  // coalesced over d, up to ATT_CG splits cost one round trip to memory and no block barrier. Fixed
  // order per row: the result does not depend on Tq.
  const i64 row = blockIdx.x;
  const int t = (int)(row % Tq);
  const i64 bh = row / Tq;
  const int h = (int)(bh % Hq), b = (int)(bh / Hq);
  const float* m = ws_m + row * nsplit;
  const float* l = ws_l + row * nsplit;
  const int d = threadIdx.x;
  // only the splits holding a key this row sees: the rest are empty (m = -inf, l = 0, acc = 0), and
  // merging an empty split leaves (M, den, num) bit for bit unchanged, so skipping them changes no bit
  const int q_start = (pos_ptr ? pos_ptr[ROWS ? b : 0] : 0) + q_off;  // ROWS: b's own position
  const int nvis = min(nsplit, min(q_start + t, L - 1) / KB + 1);
  const float o = merge_all_splits([&](int s, float& ms, float& ls, float& as) {
    ms = m[s];
    ls = l[s];
    as = d < D ? ws_acc[(row * nsplit + s) * D + d] : 0.f;
  }, nvis);
  if (d < D) out[b * osb + h * osh + t * ost + d] = from_f<T>(o);
}

extern "C" {
#define ATT_INST(sfx, T)                                                                                  \
  __global__ void __launch_bounds__(ATT_THREADS) attn_partial_##sfx(                                      \
      const T* q, const T* kc, const T* vc, float* ws_m, float* ws_l, float* ws_acc, const int* pos_ptr,   \
      int q_off, i64 qsb, i64 qsh, i64 qst, i64 ksb, i64 ksh, i64 ksl, i64 vsb, i64 vsh, i64 vsl, int Hq,  \
      int Hkv, int Tq, int D, int L, int KB, float scale, int nsplit) {                                    \
    pdl_wait();                                                                                           \
    for (int split = blockIdx.x; split < nsplit; split += gridDim.x) {                                   \
      if (!attn_partial_body<T>(q, kc, vc, ws_m, ws_l, ws_acc, pos_ptr, q_off, qsb, qsh, qst, ksb,  \
                                       ksh, ksl, vsb, vsh, vsl, Hq, Hkv, Tq, D, L, KB, scale, (T*)0, 0, 0, \
                                       0, split, nsplit))                                                 \
        break; /* past every visible key: so is every later split */                                      \
      __syncthreads(); /* the next split rewrites shared state this one read (one body in the code) */    \
    }                                                                                                     \
  }                                                                                                       \
  __global__ void attn_combine_##sfx(const float* ws_m, const float* ws_l, const float* ws_acc, T* out,    \
                                     i64 osb, i64 osh, i64 ost, int Hq, int Tq, int D, int nsplit,         \
                                     const int* pos_ptr, int q_off, int L, int KB) {                       \
    pdl_trigger(); /* the O projection may start streaming its weights */                                 \
    pdl_wait();                                                                                           \
    attn_combine_body<T>(ws_m, ws_l, ws_acc, out, osb, osh, ost, Hq, Tq, D, nsplit, pos_ptr, q_off, L, KB); \
  }
ATT_INST(f32, float)
ATT_INST(bf16, bf16_t)
#define ATT_FAST_INST(DH)                                                                                 \
  __global__ void __launch_bounds__(ATT_THREADS) attn_partial_bf16_d##DH(                                 \
      const bf16_t* q, const bf16_t* kc, const bf16_t* vc, float* ws_m, float* ws_l, float* ws_acc,       \
      const int* pos_ptr, int q_off, i64 qsb, i64 qsh, i64 qst, i64 ksb, i64 ksh, i64 ksl, i64 vsb, i64 vsh, \
      i64 vsl, int Hq, int Hkv, int Tq, int D, int L, int KB, float scale, int nsplit) {                  \
    /* pdl_wait inside, after the position and the earlier steps' keys are loaded: the kernel before */  \
    /* (the QKV GEMV) writes neither, and it starts this one only after its own wait, so every writer */ \
    /* of the position (set_pos, decode_advance, spec_accept: earlier launches) has finished */          \
    bool waited = false;                                                                                  \
    for (int split = blockIdx.x; split < nsplit; split += gridDim.x) {                                   \
      if (!attn_partial_fast<DH>(q, kc, vc, ws_m, ws_l, ws_acc, pos_ptr, q_off, qsb, qsh, qst, ksb, ksh,  \
                                 ksl, vsb, vsh, vsl, Hq, Hkv, Tq, L, KB, scale, split, nsplit, waited))   \
        break;                                                                                            \
      __syncthreads();                                                                                    \
    }                                                                                                     \
  }
ATT_FAST_INST(64)
ATT_FAST_INST(128)
// The batched step's attention (minitorch/cuda/batch.py): each of the step's T tokens is its own "batch" entry b
// (Tq = 1) of sequence tslot[b] at position pos[b], seeing keys 0 .. pos[b] of that sequence's caches (kc + tslot[b]
// * ksb). The same body, splits and merge as attn_partial_bf16_d* / attn_combine_bf16, so a token gets the bits a
// one-token decode step gives it at that position. preload = 1 (decode steps: every key before a token's position
// was written by an earlier step) lets the first split's earlier keys load before pdl_wait; a prefill step passes 0
// (its tokens see keys the same step writes). Grid (slots, T * Hkv, ceil(G / 8)); combine grid (T * Hq).
#define ATT_ROWS_INST(DH)                                                                                 \
  __global__ void __launch_bounds__(ATT_THREADS) attn_rows_partial_bf16_d##DH(                            \
      const bf16_t* q, const bf16_t* kc, const bf16_t* vc, float* ws_m, float* ws_l, float* ws_acc,       \
      const int* pos, const int* tslot, int preload, i64 qsb, i64 qsh, i64 ksb, i64 ksh, i64 ksl, int Hq,  \
      int Hkv, int L, int KB, float scale, int nsplit) {                                                   \
    bool waited = false;                                                                                  \
    for (int split = blockIdx.x; split < nsplit; split += gridDim.x) {                                   \
      if (!attn_partial_fast<DH, true>(q, kc, vc, ws_m, ws_l, ws_acc, pos, 0, qsb, qsh, 0, ksb, ksh, ksl, \
                                       ksb, ksh, ksl, Hq, Hkv, 1, L, KB, scale, split, nsplit, waited,     \
                                       tslot, preload != 0))                                              \
        break;                                                                                            \
      __syncthreads();                                                                                    \
    }                                                                                                     \
  }
ATT_ROWS_INST(64)
ATT_ROWS_INST(128)
// A draft tree's verify step (minitorch/cuda/decoder.py CudaDecoder.tree_step): token b of the step (Tq = 1, the
// batched layout) sits at position pos[b] = *tbase + its depth and reads the keys a decode step at that position
// reads, in the same order: positions below *tbase from the cache rows of the same index, then its ancestors and
// itself (its path from the tree's root), key *tbase + k at row *tbase + tanc[b * tw + k] (the tree's rows follow
// *tbase in step order). Same body, splits and merge (attn_rows_combine_bf16 over pos) as the decode step, so a
// tree row is built to get a decode step's bits (tests/test_cuda_tree.py checks it, on an H100); it never
// reads a sibling branch's rows. Grid (slots, T * Hkv, ceil(G / 8)).
#define ATT_TREE_INST(DH)                                                                                 \
  __global__ void __launch_bounds__(ATT_THREADS) attn_tree_partial_bf16_d##DH(                            \
      const bf16_t* q, const bf16_t* kc, const bf16_t* vc, float* ws_m, float* ws_l, float* ws_acc,       \
      const int* pos, const int* tbase, const int* tanc, int tw, i64 qsb, i64 qsh, i64 ksh, i64 ksl, int Hq, \
      int Hkv, int L, int KB, float scale, int nsplit) {                                                   \
    bool waited = false;                                                                                  \
    for (int split = blockIdx.x; split < nsplit; split += gridDim.x) {                                   \
      if (!attn_partial_fast<DH, true, true>(q, kc, vc, ws_m, ws_l, ws_acc, pos, 0, qsb, qsh, 0, 0, ksh, ksl, \
                                             0, ksh, ksl, Hq, Hkv, 1, L, KB, scale, split, nsplit, waited,  \
                                             nullptr, true, tbase, tanc, tw))                              \
        break;                                                                                            \
      __syncthreads();                                                                                    \
    }                                                                                                     \
  }
ATT_TREE_INST(64)
ATT_TREE_INST(128)
__global__ void attn_rows_combine_bf16(const float* ws_m, const float* ws_l, const float* ws_acc, bf16_t* out,
                                       int Hq, int D, int nsplit, const int* pos, int L, int KB) {
  pdl_trigger();
  pdl_wait();
  attn_combine_body<bf16_t, true>(ws_m, ws_l, ws_acc, out, (i64)Hq * D, D, 0, Hq, 1, D, nsplit, pos, 0, L, KB);
}
}
