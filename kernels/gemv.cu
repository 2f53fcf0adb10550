// gemv.cu: bf16 weight x few-token activation products for the decode / verify steps
// (y[t, n] = sum_k x[t, k] * W[n, k]), memory-bound on reading W once.
//
// Launch layout: one block of 256 threads (8 warps) per ROWS consecutive output rows
//   (grid = ceil(N / ROWS)). All 256 threads split each row's K axis into 16-byte chunks (8 bf16),
//   two chunks of every row in flight per thread, so each warp reads 512 contiguous bytes of a row
//   per load; an activation chunk, read once through the read-only cache, serves all ROWS rows.
//   Sums stay in fp32: a warp shuffle, then 8 warps are merged through shared memory.
// Instantiations gemv{TMAX}[_gusilu|_resnorm|_qkvrope|_norm_qkvrope]_bf16 for T <= TMAX tokens: TMAX 1, 4, 5
//   and 8 use ROWS = 4, TMAX 16 uses ROWS = 2 (5 exists for gamma = 4 verify steps: fewer registers
//   than 8); one-token extras gemv1r8_* (8 rows a block, one chunk of each row in flight per thread:
//   for short rows, K <= 2048, where a thread has one chunk a row). Variants that lost their A/B
//   (gemv1r2_*, the _silu input mode, _norm outside the QKV projection) are in kernels/NOTES.md.
//   Input modes:
//   plain: x (T, x_stride) bf16.
// Per-token reduction order: every instantiation (any TMAX, ROWS) accumulates token t of row n in
//   the same order (thread k8 chain of fmaf, warp shuffle, 8 warps in order), so a token's result
//   does not depend on how many tokens share the launch (greedy speculative == autoregressive).
//   Kernels with more than 8 sums a warp (ROWS * TMAX: the verify steps) reduce them all in one
//   reduce-scatter (warp_sum_scatter: the same partners in the same order as warp_sum, so the same
//   bits) with P - 1 + log2(32 / P) shuffles for P padded sums instead of 5 a sum.
//   norm (gemv{TMAX}_norm_qkvrope_*, the QKV projection of models with hidden <= 2048): x is the fp32
//          residual stream (T, K) and nw a bf16 RMSNorm weight; each block computes
//          rsqrt(mean(x^2) + eps) per token itself (from the thread's own 16-byte chunks, the ones
//          its loop reads again from L1; a fixed order) and uses bf16(bf16(x * inv) * nw), what
//          add_rmsnorm (norm.cu) writes up to the order of the sum of squares (the norm fused into
//          the next projection: the previous one only adds into the residual stream; nw, eps appended).
// Outputs (exactly one non-null): yb (T, N) bf16, yf (T, N) fp32, or resid (T, N) fp32 that the
//   product is ADDED to (the residual stream).
// Epilogue variants (own kernels, one extra argument `counter`, a device uint32 that is 0 between
//   launches):
//   gemv{TMAX}_gusilu_bf16: W rows interleaved [gate 0, up 0, gate 1, up 1, ...] (N = 2I, even);
//          writes yb (T, I) = bf16(silu(bf16(gate)) * bf16(up)), bit for bit what gate_up_silu_bf16
//          writes from a bf16 [gate | up] row (the SwiGLU product done once, in the gate/up GEMV).
//   gemv{TMAX}_resnorm_bf16: resid (T, N) += product, then the LAST block to finish (a grid-wide
//          ticket on `counter`, reset to 0 by that block) computes yb (T, N) = bf16(bf16(resid * inv)
//          * nw), inv = rsqrt(mean(resid^2) + eps) per token: add + RMSNorm without its own launch.
//          The norm is computed by one block in a fixed order, so it does not depend on T either.
//   gemv{TMAX}_qkvrope_bf16 (own argument list): the QKV projection with W's rows permuted within
//          each head to (0, D/2, 1, D/2 + 1, ...); adds the (permuted) bias to the bf16-rounded
//          product, applies rope at position *pos + t and writes q_out (T, Hq, D) and the K / V
//          caches (Hkv, max_len, D): qkv_rope_append_il_bf16 (kv_cache.cu) without its own launch.
// PDL and memory round trips (kernels/NOTES.md): one-token kernels load their first weight chunks into
//   registers BEFORE pdl_wait() (weights are constant, so a block that is resident while the previous
//   kernel finishes has its first weight round trip behind it), and their epilogue operands are in
//   flight with the weight stream instead of after the reduction: the qkv bias (before the wait), the
//   cache position and the residual values the block adds to (right after it), the RMSNorm weight with
//   the last block's row. The successor is triggered right after pdl_wait(), so its blocks can be
//   resident and load their own weights during this kernel's tail. Weights are loaded evict-first
//   (ld.global.cs: the weight stream leaves L1 and L2 to code, K/V and activations).
// 8-bit rows (gemv1[r16]*_i8, gemv2*_i8: steps of a speculative draft, CudaDecoder(int8_weights=True)): the
//   same body with int8 codes and one fp32 scale a row; a thread's chunk holds 8 codes (converted by byte
//   permute), its sums are scaled before the reduction.
// Limits: K % 8 == 0, x_stride % 8 == 0, W / x 16-byte aligned (the host checks); N, K < 2^31.
#include "common.cuh"
#include "qkv_rope.cuh"

#define WLD(p) __ldcs(p)  // weight loads: evict-first in L1 and L2 (the same values as __ldg; only the policy)

#define GEMV_THREADS 256

__device__ __forceinline__ float round_bf16(float x) { return to_f(from_f<bf16_t>(x)); }

// One reduce-scatter stage over lane offset o: M live slots y[0..M); a lane with bit o set keeps the upper
// half, the other the lower half, each adding its partner's copy of the half it keeps (own + partner's,
// as warp_sum adds), into y[0..M/2).
template <int M>
__device__ __forceinline__ void rs_stage(float (&y)[32], int lane, int o) {
  const bool hi = (lane & o) != 0;
#pragma unroll
  for (int k = 0; k < M / 2; ++k) {
    const float send = hi ? y[k] : y[k + M / 2];
    const float keep = hi ? y[k + M / 2] : y[k];
    y[k] = keep + __shfl_xor_sync(0xffffffffu, send, o);
  }
}
// warp_sum of each of P (a power of two <= 32) values y[0..P) (each lane its own), bit for bit: every
// partial sum meets the same partner in the same order (offsets 16, 8, 4, 2, 1) as in warp_sum, and float
// addition commutes. The reduce-scatter stages halve the values a lane carries, so P values cost P - 1 +
// log2(32 / P) shuffles instead of 5 P. Lane l returns the sum of value l / (32 / P).
template <int P>
__device__ __forceinline__ float warp_sum_scatter(float (&y)[32], int lane) {
  if constexpr (P >= 2) rs_stage<P>(y, lane, 16);
  if constexpr (P >= 4) rs_stage<P / 2>(y, lane, 8);
  if constexpr (P >= 8) rs_stage<P / 4>(y, lane, 4);
  if constexpr (P >= 16) rs_stage<P / 8>(y, lane, 2);
  if constexpr (P >= 32) rs_stage<P / 16>(y, lane, 1);
  float v = y[0];
#pragma unroll
  for (int o = 16 / P; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

enum { MODE_PLAIN = 0, MODE_NORM = 2 };

// The 8 input values of token t at chunk k8, in fp32, for the given input mode.
template <int MODE>
__device__ __forceinline__ void load_x8(const void* __restrict__ xv, const bf16_t* __restrict__ nw, int t, int k8,
                                        int x_stride, int K, float inv, float* xf) {
  if (MODE == MODE_NORM) {
    const float* xt = reinterpret_cast<const float*>(xv) + (i64)t * K + k8 * 8;
    float4 a = __ldg(reinterpret_cast<const float4*>(xt));
    float4 b = __ldg(reinterpret_cast<const float4*>(xt) + 1);
    float wf[8];
    bf16x8_to_f32(__ldg(reinterpret_cast<const uint4*>(nw) + k8), wf);
    const float v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
    for (int i = 0; i < 8; ++i) xf[i] = round_bf16(round_bf16(v[i] * inv) * wf[i]);
  } else {
    const bf16_t* xt = reinterpret_cast<const bf16_t*>(xv) + (i64)t * x_stride;
    bf16x8_to_f32(__ldg(reinterpret_cast<const uint4*>(xt) + k8), xf);
  }
}

// Weight chunks: 8 bf16 weights in 16 bytes (WB = 2), or 8 signed 8-bit codes in 8 bytes (WB = 1: the *_i8
// kernels; the row's scale is applied once, after the loop): a row has K / 8 chunks either way.
template <int WB> struct WChunk { typedef uint4 type; };
template <> struct WChunk<1> { typedef uint2 type; };
template <typename C> __device__ __forceinline__ C zero_chunk();
template <> __device__ __forceinline__ uint4 zero_chunk<uint4>() { return make_uint4(0u, 0u, 0u, 0u); }
template <> __device__ __forceinline__ uint2 zero_chunk<uint2>() { return make_uint2(0u, 0u); }
// 4 codes (bytes of u, signed) -> 4 floats. PRMT: the biased byte (code + 128) becomes the low byte of the
// float 2^23 + code + 128, exact, and one subtraction leaves the code (no I2F, a quarter-rate instruction).
__device__ __forceinline__ void i8x4_to_f32(unsigned int u, float* f) {
  const unsigned int b = u ^ 0x80808080u;
#pragma unroll
  for (int i = 0; i < 4; ++i) f[i] = __uint_as_float(__byte_perm(b, 0x4B000000u, 0x7650 + i)) - 8388736.f;
}
template <int WB>
__device__ __forceinline__ void wchunk_to_f32(const uint4& v, float* f) {
  static_assert(WB == 2, "16-byte chunks hold bf16 weights");
  bf16x8_to_f32(v, f);
}
template <int WB>
__device__ __forceinline__ void wchunk_to_f32(const uint2& v, float* f) {
  i8x4_to_f32(v.x, f); i8x4_to_f32(v.y, f + 4);
}

// Chunk kc of each of the block's rows times the same inputs of every token: CW weights a chunk, CW / 8 input
// loads of 8 values (inputs 8 * (kc * CW / 8 + h) ...), products in input order.
template <int ROWS, int TMAX, int MODE, int WB = 2, typename C = uint4>
__device__ __forceinline__ void gemv_accum(const C (&wv)[ROWS], const void* __restrict__ x,
                                           const bf16_t* __restrict__ nw, const float* inv, int kc, int T,
                                           int x_stride, int K, float (&acc)[ROWS][TMAX]) {
  constexpr int CW = 8;  // weights a chunk, bf16 or 8-bit
  float wf[ROWS][CW];
#pragma unroll
  for (int r = 0; r < ROWS; ++r) wchunk_to_f32<WB>(wv[r], wf[r]);
#pragma unroll
  for (int t = 0; t < TMAX; ++t) {
    if (t < T) {
#pragma unroll
      for (int h = 0; h < CW / 8; ++h) {
        float xf[8];
        load_x8<MODE>(x, nw, t, kc * (CW / 8) + h, x_stride, K, MODE == MODE_NORM ? inv[t] : 0.f, xf);
#pragma unroll
        for (int r = 0; r < ROWS; ++r)
#pragma unroll
          for (int i = 0; i < 8; ++i) acc[r][t] = fmaf(wf[r][8 * h + i], xf[i], acc[r][t]);
      }
    }
  }
}

// The last block's RMSNorm of one complete residual row (other blocks wrote it: read from L2 with
// ordered loads after the ticket's fence): out = bf16(bf16(row * inv) * nw), inv = rsqrt(mean(row^2) + eps).
// Fast path (n % 4 == 0, n <= RN_V * 4 * GEMV_THREADS = 4096): every 16-byte load issued before the first use,
// the row kept in registers; else a scalar loop. The sum of squares runs in a fixed order either way.
// `buf` needs GEMV_THREADS / 32 floats of shared memory.
__device__ __forceinline__ float4 ld_cg_f4(const float* p) {
  float4 v;
  asm volatile("ld.global.cg.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ float ld_cg_f1(const float* p) {
  float v;
  asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(v) : "l"(p) : "memory");
  return v;
}
#define RN_V 4
__device__ void resnorm_row(const float* row, const bf16_t* __restrict__ nw, bf16_t* __restrict__ out, int n,
                            float eps, float* buf) {
  const int tid = threadIdx.x, lane = tid & 31, wid = tid >> 5;
  const bool vec = (n & 3) == 0 && n <= RN_V * 4 * GEMV_THREADS && (((size_t)row) & 15) == 0 &&
                   (((size_t)nw) & 7) == 0;
  float4 v[RN_V];
  uint2 wv[RN_V];  // the norm weight's 4 bf16 of each float4 (issued with the row: same round trip)
  float ss = 0.f;
  if (vec) {
#pragma unroll
    for (int u = 0; u < RN_V; ++u) {
      int k = 4 * (tid + u * GEMV_THREADS);
      v[u] = k < n ? ld_cg_f4(row + k) : make_float4(0.f, 0.f, 0.f, 0.f);
      wv[u] = k < n ? __ldg(reinterpret_cast<const uint2*>(nw + k)) : make_uint2(0u, 0u);
    }
#pragma unroll
    for (int u = 0; u < RN_V; ++u)
      ss = fmaf(v[u].w, v[u].w, fmaf(v[u].z, v[u].z, fmaf(v[u].y, v[u].y, fmaf(v[u].x, v[u].x, ss))));
  } else {
    for (int k = tid; k < n; k += GEMV_THREADS) { float x = ld_cg_f1(row + k); ss = fmaf(x, x, ss); }
  }
  ss = warp_sum(ss);
  __syncthreads();  // buf reuse
  if (lane == 0) buf[wid] = ss;
  __syncthreads();
  float tot = 0.f;
#pragma unroll
  for (int w = 0; w < GEMV_THREADS / 32; ++w) tot += buf[w];
  const float inv = rsqrtf(tot / n + eps);
  if (vec) {
#pragma unroll
    for (int u = 0; u < RN_V; ++u) {
      int k = 4 * (tid + u * GEMV_THREADS);
      if (k < n) {
        const float x[4] = {v[u].x, v[u].y, v[u].z, v[u].w};
        const float wf[4] = {__uint_as_float(wv[u].x << 16), __uint_as_float(wv[u].x & 0xffff0000u),
                             __uint_as_float(wv[u].y << 16), __uint_as_float(wv[u].y & 0xffff0000u)};
#pragma unroll
        for (int i = 0; i < 4; ++i) out[k + i] = from_f<bf16_t>(round_bf16(x[i] * inv) * wf[i]);
      }
    }
  } else {
    for (int k = tid; k < n; k += GEMV_THREADS)
      out[k] = from_f<bf16_t>(round_bf16(ld_cg_f1(row + k) * inv) * to_f(nw[k]));
  }
}

enum { OUT_PLAIN = 0, OUT_GUSILU = 1, OUT_RESNORM = 2, OUT_QKVROPE = 3, OUT_QKVROPE_TREE = 4 };

// What the QKV rope epilogue needs (zero for the other kernels).
struct RopeArgs {
  const bf16_t* bias;  // permuted like W's rows, or null
  const int* pos;      // device int32: position of token 0 (tslot null), or of each token (tslot set)
  float theta;
  QkvOut<bf16_t> out;  // q (T, Hq, D), K / V caches (Hkv, max_len, D)
  const int* tslot = nullptr;  // the batched kernels (gemvtcb*): token t's sequence, whose caches start at
  i64 slot_stride = 0;         // kc / vc + tslot[t] * slot_stride (per-slot caches (S, Hkv, max_len, D))
  const int* depth = nullptr;  // OUT_QKVROPE_TREE (a draft tree's verify step): token t is rotated at position
                               // *pos + depth[t] and cached at row *pos + t
};

// One weight chunk (8 weights) of each of the block's rows at chunk index k8 (zeros past the row's end).
template <int ROWS, typename P, typename C>
__device__ __forceinline__ void load_w(const P (&wr)[ROWS], int k8, int K8, C (&w)[ROWS]) {
#pragma unroll
  for (int r = 0; r < ROWS; ++r) w[r] = k8 < K8 ? WLD(wr[r] + k8) : zero_chunk<C>();
}

// After the reduction: red[w][r * TMAX + t] holds warp w's partial sum of output row n0 + r, token t; the
// sum is taken over the 8 warps in order, then written as OUT says. Shared by the CUDA-core GEMV above and
// the tensor-core GEMV below. EE: the one-token kernels loaded the epilogue operands early (eb1 / eb2: the
// qkv bias pair, epos: the cache position, rold: the residual value).
template <int ROWS, int TMAX, int OUT, bool EE>
__device__ __forceinline__ void gemv_epilogue(float (*red)[ROWS * TMAX], int n0, int N, int T,
                                              bf16_t* __restrict__ yb, float* __restrict__ yf,
                                              float* __restrict__ resid, const bf16_t* __restrict__ nw,
                                              float eps, unsigned int* counter, const RopeArgs& ra,
                                              float eb1, float eb2, int epos, float rold) {
  const int tid = threadIdx.x;
  if (OUT == OUT_QKVROPE || OUT == OUT_QKVROPE_TREE) {
    // rows n0 + 2p, n0 + 2p + 1 = elements i, i + D/2 of head h (permuted rows): bias, rotate, write
    // q / the K cache / the V cache, exactly as qkv_rope_append_il_bf16 does from the bf16 product
    if (tid < (ROWS / 2) * TMAX) {
      const int p = tid / TMAX, t = tid % TMAX, n = n0 + 2 * p;
      if (n < N && t < T) {  // N = H3 * D, D even: row n + 1 exists too
        float x1 = 0.f, x2 = 0.f;
#pragma unroll
        for (int w = 0; w < GEMV_THREADS / 32; ++w) x1 += red[w][(2 * p) * TMAX + t];
#pragma unroll
        for (int w = 0; w < GEMV_THREADS / 32; ++w) x2 += red[w][(2 * p + 1) * TMAX + t];
        x1 = round_bf16(x1);
        x2 = round_bf16(x2);
        if (ra.bias) {
          if (!EE) { eb1 = to_f(ra.bias[n]); eb2 = to_f(ra.bias[n + 1]); }
          x1 = __fadd_rn(x1, eb1);
          x2 = __fadd_rn(x2, eb2);
        }
        const int D = ra.out.D, h = n / D, i = (n - h * D) >> 1;
        if (ra.tslot) {  // batched: token t belongs to sequence tslot[t] and sits at position pos[t]
          QkvOut<bf16_t> o = ra.out;
          const i64 off = (i64)ra.tslot[t] * ra.slot_stride;
          o.kc += off;
          o.vc += off;
          qkv_store_pair<bf16_t>(o, h, t, ra.pos[t], i, x1, x2, ra.theta, RopeExact());
        } else {
          if (!EE) epos = *ra.pos;
          if constexpr (OUT == OUT_QKVROPE_TREE)  // a tree's row: rotated at its depth, cached at its own row
            qkv_store_pair_at<bf16_t>(ra.out, h, t, epos + ra.depth[t], epos + t, i, x1, x2, ra.theta, RopeExact());
          else
            qkv_store_pair<bf16_t>(ra.out, h, t, epos + t, i, x1, x2, ra.theta, RopeExact());
        }
      }
    }
    return;
  }
  if (OUT == OUT_GUSILU) {
    // rows n0 + 2p (gate) and n0 + 2p + 1 (up) -> column (n0 / 2) + p of the SwiGLU product
    if (tid < (ROWS / 2) * TMAX) {
      const int p = tid / TMAX, t = tid % TMAX, n = n0 + 2 * p;
      if (n < N && t < T) {  // N even: row n + 1 exists too
        float g = 0.f, u = 0.f;
#pragma unroll
        for (int w = 0; w < GEMV_THREADS / 32; ++w) g += red[w][(2 * p) * TMAX + t];
#pragma unroll
        for (int w = 0; w < GEMV_THREADS / 32; ++w) u += red[w][(2 * p + 1) * TMAX + t];
        g = round_bf16(g);
        u = round_bf16(u);
        yb[(i64)t * (N >> 1) + (n >> 1)] = from_f<bf16_t>(g / (1.f + __expf(-g)) * u);
      }
    }
    return;
  }
  if (tid < ROWS * TMAX) {
    const int r = tid / TMAX, t = tid % TMAX, n = n0 + r;
    if (n < N && t < T) {
      float s = 0.f;
#pragma unroll
      for (int w = 0; w < GEMV_THREADS / 32; ++w) s += red[w][tid];
      i64 o = (i64)t * N + n;
      if (OUT == OUT_RESNORM || resid) resid[o] = (EE ? rold : resid[o]) + s;
      else if (yf) yf[o] = s;
      else yb[o] = from_f<bf16_t>(s);
    }
  }
  if (OUT == OUT_RESNORM) {
    // grid-wide ticket: the last block to finish normalises the (now complete) residual rows
    __shared__ int s_last;
    __threadfence();  // this block's resid writes, visible device-wide before its ticket
    __syncthreads();
    if (tid == 0) s_last = atomicAdd(counter, 1u) == gridDim.x - 1;
    __syncthreads();
    if (!s_last) return;
    __threadfence();
    for (int t = 0; t < T; ++t)  // `red` as a flat buffer: 8 * ROWS * TMAX >= 8 floats
      resnorm_row(resid + (i64)t * N, nw, yb + (i64)t * N, N, eps, &red[0][0]);
    if (tid == 0) *counter = 0u;  // ready for the next launch (which waits for this grid to finish)
  }
}

// CH: weight chunks of each row in flight per thread (2, or 1 for the 8-rows-a-block kernels). Either
// way thread tid accumulates chunks tid, tid + 256, tid + 512, ... in increasing order, so every
// instantiation sums a token's row in the same order.
// WB: bytes a weight, 2 (bf16 rows) or 1 (8-bit rows: the *_i8 kernels, W int8 codes (K % 16 == 0) and wscale
// one fp32 scale a row; each thread's sums are scaled by its row's scale before the reduction). A thread's
// chunk c holds 8 bf16 weights or 8 codes: inputs 8c ... 8c + 7.
template <int ROWS, int TMAX, int MODE, int OUT, int CH = 2, int WB = 2>
__device__ void gemv_body(const void* __restrict__ W, const void* __restrict__ x, const bf16_t* __restrict__ nw,
                          float eps, bf16_t* __restrict__ yb, float* __restrict__ yf, float* __restrict__ resid,
                          int N, int K, int T, int x_stride, unsigned int* counter, const RopeArgs ra,
                          const float* __restrict__ wscale = nullptr) {
  __shared__ float red[GEMV_THREADS / 32][ROWS * TMAX];
  __shared__ float s_inv[TMAX];
  const int tid = threadIdx.x, lane = tid & 31, wid = tid >> 5;
  const int n0 = blockIdx.x * ROWS;
  const int K8 = K >> 3;
  constexpr bool I8 = WB == 1;
  typedef typename WChunk<WB>::type C;  // a thread's weight chunk (uint4, or uint2 for 8-code chunks)
  const int KC = I8 ? K / 8 : K8;  // weight chunks a row, 8 weights each (the 8-bit kernels' signed division kept:
                                   // the build is the same code as before their chunk size was fixed at 8)
  const C* __restrict__ wr[ROWS];
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
    const i64 e = (i64)min(n0 + r, N - 1) * K;  // the row's first element
    if constexpr (I8) wr[r] = reinterpret_cast<const C*>(reinterpret_cast<const signed char*>(W) + e);
    else wr[r] = reinterpret_cast<const C*>(reinterpret_cast<const bf16_t*>(W) + e);
  }
  float wsc[ROWS];  // 8-bit rows: their scales (constant: loaded before the wait)
#pragma unroll
  for (int r = 0; r < ROWS; ++r) wsc[r] = I8 ? __ldg(wscale + min(n0 + r, N - 1)) : 1.f;
  int k8 = tid;
  C a[ROWS], b[ROWS];
  // one-token kernels (the decode step) load their first weight chunks before the wait: the weights are
  // constant, so those loads may be in flight while the previous kernel ends. Kernels for several
  // tokens keep the loads inside the loop (holding the chunks across the wait cost them registers:
  // 73 -> 96 for gemv16_bf16, 2 blocks a multiprocessor instead of 3)
  constexpr bool EW = TMAX == 1;
  if (EW) {
    load_w<ROWS>(wr, k8, KC, a);
    if (CH == 2) load_w<ROWS>(wr, k8 + GEMV_THREADS, KC, b);
  }
  // epilogue operands, in flight with the weight stream instead of after the reduction (one-token
  // kernels; for several tokens the early loads cost registers: 80 -> 96 for gemv16_resnorm_bf16)
  constexpr bool EE = TMAX == 1;
  const int ep = tid / TMAX, et = tid % TMAX;  // epilogue thread: row (pair) ep, token et (prologue loads)
  float eb1 = 0.f, eb2 = 0.f;
  if (OUT == OUT_QKVROPE && EE && ra.bias && tid < (ROWS / 2) * TMAX && n0 + 2 * ep < N) {
    eb1 = to_f(ra.bias[n0 + 2 * ep]);  // constant: before the wait too
    eb2 = to_f(ra.bias[n0 + 2 * ep + 1]);
  }
  pdl_wait();  // x / resid / pos / outputs are touched only after this
  pdl_trigger();  // the next kernel may launch now: its blocks load their own weights during our tail
  int epos = 0;
  float rold = 0.f;
  if (EE) {
    if (OUT == OUT_QKVROPE && tid < (ROWS / 2) * TMAX) epos = *ra.pos;
    if ((OUT == OUT_RESNORM || resid) && tid < ROWS * TMAX && n0 + ep < N && et < T)
      rold = resid[(i64)et * N + n0 + ep];
  }
  if (MODE == MODE_NORM) {
    // each token's sum of squares from the thread's own chunks (k8, k8 + 256, ... in order: the loop
    // below reads the same addresses again, from L1), then the 8 warps in order
    float ss[TMAX];
#pragma unroll
    for (int t = 0; t < TMAX; ++t) {
      ss[t] = 0.f;
      if (t < T) {
        const float4* xt = reinterpret_cast<const float4*>(reinterpret_cast<const float*>(x) + (i64)t * K);
        for (int c = tid; c < K8; c += GEMV_THREADS) {
          const float4 u = __ldg(xt + 2 * c), v = __ldg(xt + 2 * c + 1);
          ss[t] = fmaf(u.x, u.x, ss[t]); ss[t] = fmaf(u.y, u.y, ss[t]); ss[t] = fmaf(u.z, u.z, ss[t]);
          ss[t] = fmaf(u.w, u.w, ss[t]); ss[t] = fmaf(v.x, v.x, ss[t]); ss[t] = fmaf(v.y, v.y, ss[t]);
          ss[t] = fmaf(v.z, v.z, ss[t]); ss[t] = fmaf(v.w, v.w, ss[t]);
        }
      }
      ss[t] = warp_sum(ss[t]);
      if (lane == 0) red[wid][t] = ss[t];
    }
    __syncthreads();
    if (tid < TMAX) {
      float s = 0.f;
#pragma unroll
      for (int w = 0; w < GEMV_THREADS / 32; ++w) s += red[w][tid];
      s_inv[tid] = rsqrtf(s / K + eps);
    }
    __syncthreads();
  }
  float inv[TMAX];
#pragma unroll
  for (int t = 0; t < TMAX; ++t) inv[t] = MODE == MODE_NORM ? s_inv[t] : 0.f;
  float acc[ROWS][TMAX];
#pragma unroll
  for (int r = 0; r < ROWS; ++r)
#pragma unroll
    for (int t = 0; t < TMAX; ++t) acc[r][t] = 0.f;
  if (!EW) {  // loads inside the loop, in the order of the EW path below (the same sums, bit for bit)
    if (CH == 2) {
      for (; k8 + GEMV_THREADS < KC; k8 += 2 * GEMV_THREADS) {
        C c[ROWS], d[ROWS];
#pragma unroll
        for (int r = 0; r < ROWS; ++r) { c[r] = WLD(wr[r] + k8); d[r] = WLD(wr[r] + k8 + GEMV_THREADS); }
        gemv_accum<ROWS, TMAX, MODE, WB, C>(c, x, nw, inv, k8, T, x_stride, K, acc);
        gemv_accum<ROWS, TMAX, MODE, WB, C>(d, x, nw, inv, k8 + GEMV_THREADS, T, x_stride, K, acc);
      }
    } else {
      for (; k8 + GEMV_THREADS < KC; k8 += GEMV_THREADS) {
        C c[ROWS];
#pragma unroll
        for (int r = 0; r < ROWS; ++r) c[r] = WLD(wr[r] + k8);
        gemv_accum<ROWS, TMAX, MODE, WB, C>(c, x, nw, inv, k8, T, x_stride, K, acc);
      }
    }
    if (k8 < KC) {
      C c[ROWS];
#pragma unroll
      for (int r = 0; r < ROWS; ++r) c[r] = WLD(wr[r] + k8);
      gemv_accum<ROWS, TMAX, MODE, WB, C>(c, x, nw, inv, k8, T, x_stride, K, acc);
    }
  }
  // EW: a (and b) hold chunks k8 (and k8 + 256): the first iteration uses them, later ones load their own
  bool pre = true;
  if (!EW) {
  } else if (CH == 2) {
    for (; k8 + GEMV_THREADS < KC; k8 += 2 * GEMV_THREADS) {
      if (!pre) {
#pragma unroll
        for (int r = 0; r < ROWS; ++r) { a[r] = WLD(wr[r] + k8); b[r] = WLD(wr[r] + k8 + GEMV_THREADS); }
      }
      pre = false;
      gemv_accum<ROWS, TMAX, MODE, WB, C>(a, x, nw, inv, k8, T, x_stride, K, acc);
      gemv_accum<ROWS, TMAX, MODE, WB, C>(b, x, nw, inv, k8 + GEMV_THREADS, T, x_stride, K, acc);
    }
  } else {
    for (; k8 + GEMV_THREADS < KC; k8 += GEMV_THREADS) {
      if (!pre) {
#pragma unroll
        for (int r = 0; r < ROWS; ++r) a[r] = WLD(wr[r] + k8);
      }
      pre = false;
      gemv_accum<ROWS, TMAX, MODE, WB, C>(a, x, nw, inv, k8, T, x_stride, K, acc);
    }
  }
  if (EW && k8 < KC) {
    if (!pre) {
#pragma unroll
      for (int r = 0; r < ROWS; ++r) a[r] = WLD(wr[r] + k8);
    }
    gemv_accum<ROWS, TMAX, MODE, WB, C>(a, x, nw, inv, k8, T, x_stride, K, acc);
  }
  if (I8) {
#pragma unroll
    for (int r = 0; r < ROWS; ++r)
#pragma unroll
      for (int t = 0; t < TMAX; ++t) acc[r][t] *= wsc[r];
  }
  __syncthreads();  // `red` is reused below
  constexpr int NV = ROWS * TMAX;  // sums of this warp: (row r, token t) at r * TMAX + t
  if constexpr (NV > 8 && NV <= 32) {  // several tokens: one reduce-scatter, the same bits
    constexpr int P = NV <= 16 ? 16 : 32;
    float y[32];
#pragma unroll
    for (int j = 0; j < 32; ++j) y[j] = j < NV ? acc[j / TMAX][j % TMAX] : 0.f;
    const float v = warp_sum_scatter<P>(y, lane);
    const int j = lane / (32 / P);
    if (lane % (32 / P) == 0 && j < NV) red[wid][j] = v;
  } else {
#pragma unroll
    for (int r = 0; r < ROWS; ++r)
#pragma unroll
      for (int t = 0; t < TMAX; ++t) {
        float v = warp_sum(acc[r][t]);
        if (lane == 0) red[wid][r * TMAX + t] = v;
      }
  }
  __syncthreads();
  gemv_epilogue<ROWS, TMAX, OUT, EE>(red, n0, N, T, yb, yf, resid, nw, eps, counter, ra, eb1, eb2, epos, rold);
}

// ---------------------------------------------------------------------------------------------------
// Tensor-core GEMV for 1..TT tokens (TT = 8 or 16): gemvtc{TT}[_gusilu|_resnorm|_qkvrope]_bf16, the
// products of the exact mode gemv="tc" (minitorch/cuda/decoder.py), decode and verify steps alike.
// Block: 8 output rows, 256 threads (8 warps) splitting K in chunks of 32 inputs: warp w takes chunks
// w, w + 8, w + 16, ... in increasing order and accumulates them with mma.m16n8k16 (bf16 in, fp32
// accumulate): A = the tokens (16 rows: token t in row t, zero rows past T), B = the block's 8 weight
// rows, D = (16 tokens x 8 rows) in the warp's registers. Lane (g = lane / 4, c = lane % 4) loads one
// 16-byte piece of weight row n0 + g, inputs 32 ch + 8 c .. + 7, and the same inputs of tokens g and
// g + 8; the piece's first 4 inputs are the mma's k slots (2c, 2c + 1, 2c + 8, 2c + 9) of one mma, the
// last 4 of a second one. That maps k slots to inputs the same way for A and B (any fixed permutation
// of the summation index leaves the product's terms unchanged), so every load is a coalesced 16-byte
// load of a row, and no shared memory or ldmatrix is needed.
// Exactness: the tensor core computes each D element from its own A row and B column, so token t's
// sums do not depend on the other tokens (zero or not), on T, or on TT (gemvtc8 hard-wires rows 8..15
// to zero; gemvtc16 loads them): every step of <= 16 tokens gives a token the bits a one-token step
// gives it, the foundation of greedy speculative == greedy autoregressive in this mode. The 8 warps'
// partial sums are then added in order by gemv_epilogue, like the CUDA-core kernels'.
// NT: weight tiles of 8 rows a block (1: gemvtc{TT}_*, 8 rows; 2: gemvtc{TT}w_*, 16 rows, for products
// with many output rows: twice the weight bytes in flight per thread for one set of token loads). The
// tiles' mma's are independent, so NT changes no bit; neither does U (chunks a warp loads per round:
// the chunks are accumulated in the same order however they are grouped into loads). Only the split of
// K over the 8 warps fixes the order. U per instantiation: GEMV_TC_INST's fourth argument. Each round also
// loads the next round's weights before its products (two rounds in flight).
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], unsigned int a0, unsigned int a1, unsigned int a2,
                                               unsigned int a3, unsigned int b0, unsigned int b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#endif
}

template <int TT, int NT, int U, int OUT>
__device__ void gemv_tc_body(const bf16_t* __restrict__ W, const bf16_t* __restrict__ x, const bf16_t* __restrict__ nw,
                             float eps, bf16_t* __restrict__ yb, float* __restrict__ yf, float* __restrict__ resid,
                             int N, int K, int T, int x_stride, unsigned int* counter, const RopeArgs ra) {
  constexpr int ROWS = 8 * NT, WARPS = GEMV_THREADS / 32;
  __shared__ float red[WARPS][ROWS * TT];
  const int tid = threadIdx.x, lane = tid & 31, wid = tid >> 5, g = lane >> 2, c = lane & 3;
  const int n0 = blockIdx.x * ROWS;
  const int NC = (K + 31) >> 5, K8 = K >> 3;  // chunks of 32 inputs; 16-byte pieces of a row
  const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
  const uint4* __restrict__ wrow[NT];
#pragma unroll
  for (int j = 0; j < NT; ++j) wrow[j] = reinterpret_cast<const uint4*>(W + (i64)min(n0 + 8 * j + g, N - 1) * K);
  const int gl = g;  // the token of this lane's A rows: g (and g + 8)
  const uint4* __restrict__ xlo = reinterpret_cast<const uint4*>(x + (i64)gl * x_stride);        // token g
  const uint4* __restrict__ xhi = reinterpret_cast<const uint4*>(x + (i64)(gl + 8) * x_stride);  // token g + 8
  const bool lo = gl < T, hi = TT == 16 && gl + 8 < T;
  uint4 wv[U][NT];
#pragma unroll
  for (int u = 0; u < U; ++u) {  // the first round's weights before the wait (they are constant)
    const int p = 4 * (wid + WARPS * u) + c;
#pragma unroll
    for (int j = 0; j < NT; ++j) wv[u][j] = p < K8 ? WLD(wrow[j] + p) : zero;
  }
  pdl_wait();  // x / resid / pos / outputs are touched only after this
  pdl_trigger();
  float d[NT][4];
#pragma unroll
  for (int j = 0; j < NT; ++j) d[j][0] = d[j][1] = d[j][2] = d[j][3] = 0.f;
  for (int ch0 = wid; ch0 < NC; ch0 += WARPS * U) {
    // the next round's weights are loaded before this round's products (two rounds in flight)
    uint4 wn[U][NT];
    const bool more = ch0 + WARPS * U < NC;
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int p = 4 * (ch0 + WARPS * (U + u)) + c;
#pragma unroll
      for (int j = 0; j < NT; ++j) wn[u][j] = more && p < K8 ? WLD(wrow[j] + p) : zero;
    }
    uint4 xa[U], xb[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int p = 4 * (ch0 + WARPS * u) + c;
      xa[u] = lo && p < K8 ? __ldg(xlo + p) : zero;
      xb[u] = hi && p < K8 ? __ldg(xhi + p) : zero;
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (ch0 + WARPS * u < NC) {
#pragma unroll
        for (int j = 0; j < NT; ++j) {
          mma_bf16_16816(d[j], xa[u].x, xb[u].x, xa[u].y, xb[u].y, wv[u][j].x, wv[u][j].y);
          mma_bf16_16816(d[j], xa[u].z, xb[u].z, xa[u].w, xb[u].w, wv[u][j].z, wv[u][j].w);
        }
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int j = 0; j < NT; ++j) wv[u][j] = wn[u][j];
  }
  // tile j: d0 / d1 = token g, rows 8j + 2c / 8j + 2c + 1; d2 / d3 = token g + 8 (TT = 16 only)
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    red[wid][(8 * j + 2 * c) * TT + g] = d[j][0];
    red[wid][(8 * j + 2 * c + 1) * TT + g] = d[j][1];
    if (TT == 16) {
      red[wid][(8 * j + 2 * c) * TT + g + 8] = d[j][2];
      red[wid][(8 * j + 2 * c + 1) * TT + g + 8] = d[j][3];
    }
  }
  __syncthreads();
  gemv_epilogue<ROWS, TT, OUT, false>(red, n0, N, T, yb, yf, resid, nw, eps, counter, ra, 0.f, 0.f, 0, 0.f);
}

// Batched tensor-core products with MT tiles of 16 tokens a block (gemvtcm*, minitorch/cuda/batch.py): the weight
// fragments a warp loads for a chunk serve all MT tiles before the next chunk (gemvtcb* reloads them, through L2, in
// each tile's block). Tile m of the block accumulates exactly the mma sequence gemvtc16 runs for its 16 tokens (the
// same chunks, in the same order, into its own accumulators), and its 8 warp partials are added by the same epilogue:
// a token's bits are the one-token step's. Grid (ceil(T / (16 MT)), ceil(N / ROWS)), ROWS = 8 NT.
template <int NT, int U, int MT, int OUT>
__device__ void gemv_tcm_body(const bf16_t* __restrict__ W, const bf16_t* __restrict__ x, float eps,
                              bf16_t* __restrict__ yb, float* __restrict__ yf, float* __restrict__ resid, int N, int K,
                              int T, int x_stride, unsigned int* counter, const RopeArgs ra0) {
  constexpr int ROWS = 8 * NT, WARPS = GEMV_THREADS / 32, TT = 16;
  __shared__ float red[MT][WARPS][ROWS * TT];
  const int tid = threadIdx.x, lane = tid & 31, wid = tid >> 5, g = lane >> 2, c = lane & 3;
  const int n0 = blockIdx.y * ROWS, tb = blockIdx.x * MT * TT;
  const int NC = (K + 31) >> 5, K8 = K >> 3;
  const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
  const uint4* __restrict__ wrow[NT];
#pragma unroll
  for (int j = 0; j < NT; ++j) wrow[j] = reinterpret_cast<const uint4*>(W + (i64)min(n0 + 8 * j + g, N - 1) * K);
  const uint4* xlo[MT];
  const uint4* xhi[MT];
  bool lo[MT], hi[MT];
#pragma unroll
  for (int m = 0; m < MT; ++m) {  // tile m's A rows of this lane: tokens tb + 16 m + g and + 8
    const int t = tb + TT * m + g;
    lo[m] = t < T;
    hi[m] = t + 8 < T;
    xlo[m] = reinterpret_cast<const uint4*>(x + (i64)min(t, T - 1) * x_stride);
    xhi[m] = reinterpret_cast<const uint4*>(x + (i64)min(t + 8, T - 1) * x_stride);
  }
  uint4 wv[U][NT];
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int p = 4 * (wid + WARPS * u) + c;
#pragma unroll
    for (int j = 0; j < NT; ++j) wv[u][j] = p < K8 ? WLD(wrow[j] + p) : zero;
  }
  pdl_wait();
  pdl_trigger();
  float d[MT][NT][4];
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int j = 0; j < NT; ++j) d[m][j][0] = d[m][j][1] = d[m][j][2] = d[m][j][3] = 0.f;
  for (int ch0 = wid; ch0 < NC; ch0 += WARPS * U) {
    uint4 wn[U][NT];
    const bool more = ch0 + WARPS * U < NC;
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int p = 4 * (ch0 + WARPS * (U + u)) + c;
#pragma unroll
      for (int j = 0; j < NT; ++j) wn[u][j] = more && p < K8 ? WLD(wrow[j] + p) : zero;
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int p = 4 * (ch0 + WARPS * u) + c;
      if (ch0 + WARPS * u < NC) {
#pragma unroll
        for (int m = 0; m < MT; ++m) {
          const uint4 xa = lo[m] && p < K8 ? __ldg(xlo[m] + p) : zero;
          const uint4 xb = hi[m] && p < K8 ? __ldg(xhi[m] + p) : zero;
#pragma unroll
          for (int j = 0; j < NT; ++j) {
            mma_bf16_16816(d[m][j], xa.x, xb.x, xa.y, xb.y, wv[u][j].x, wv[u][j].y);
            mma_bf16_16816(d[m][j], xa.z, xb.z, xa.w, xb.w, wv[u][j].z, wv[u][j].w);
          }
        }
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int j = 0; j < NT; ++j) wv[u][j] = wn[u][j];
  }
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      red[m][wid][(8 * j + 2 * c) * TT + g] = d[m][j][0];
      red[m][wid][(8 * j + 2 * c + 1) * TT + g] = d[m][j][1];
      red[m][wid][(8 * j + 2 * c) * TT + g + 8] = d[m][j][2];
      red[m][wid][(8 * j + 2 * c + 1) * TT + g + 8] = d[m][j][3];
    }
  __syncthreads();
  for (int m = 0; m < MT; ++m) {
    const int t0 = tb + TT * m;
    if (t0 >= T) break;
    RopeArgs ra = ra0;
    if (OUT == OUT_QKVROPE) {
      ra.pos += t0;
      ra.tslot += t0;
      ra.out.q_out += (i64)t0 * ra.out.Hq * ra.out.D;
    }
    const i64 o = (i64)t0 * (OUT == OUT_GUSILU ? (N >> 1) : N);
    gemv_epilogue<ROWS, TT, OUT, false>(red[m], n0, N, min(TT, T - t0), yb ? yb + o : yb, yf ? yf + o : yf,
                                        resid ? resid + o : resid, (const bf16_t*)0, eps, counter, ra, 0.f, 0.f, 0,
                                        0.f);
  }
}

extern "C" {
// Blocks a multiprocessor the compiler must allow (a register cap): one-token instantiations keep 4
// (cap 64; the weight stream needs the occupancy, and uncapped the compiler took ~85 registers, 3
// blocks); the 4-, 5- and 16-token plain / epilogue / rope ones keep 3 (cap 80, no spills: uncapped
// they took 88-96 registers, 2 blocks, after the round-3 changes; the 8-token ones need ~110).
// XIN: the input is normalised / SwiGLU'd per chunk (more registers: no cap for several tokens).
#define GEMV_MINB(TM, XIN) ((TM) == 1 ? 4 : ((TM) != 8 && !(XIN)) ? 3 : 1)
#define GEMV_KERNEL_CH(NAME, TM, ROWS, MODE, CH, MINB)                                                   \
  __global__ void __launch_bounds__(GEMV_THREADS, MINB) NAME(const bf16_t* W, const void* x, const bf16_t* nw, \
                                                             float eps, bf16_t* yb, float* yf, float* resid, \
                                                             int N, int K, int T, int x_stride) {         \
    gemv_body<ROWS, TM, MODE, OUT_PLAIN, CH>(W, x, nw, eps, yb, yf, resid, N, K, T, x_stride, 0, RopeArgs{}); \
  }
#define GEMV_KERNEL(NAME, TM, ROWS, MODE) GEMV_KERNEL_CH(NAME, TM, ROWS, MODE, 2, GEMV_MINB(TM, MODE != MODE_PLAIN))
#define GEMV_EPI_KERNEL_CH(NAME, TM, ROWS, MODE, OUT, CH, MINB)                                          \
  __global__ void __launch_bounds__(GEMV_THREADS, MINB) NAME(                                             \
      const bf16_t* W, const void* x, const bf16_t* nw, float eps, bf16_t* yb, float* yf, float* resid,   \
      int N, int K, int T, int x_stride, unsigned int* counter) {                                         \
    gemv_body<ROWS, TM, MODE, OUT, CH>(W, x, nw, eps, yb, yf, resid, N, K, T, x_stride, counter,          \
                                       RopeArgs{});                                                      \
  }
#define GEMV_EPI_KERNEL(NAME, TM, ROWS, OUT) GEMV_EPI_KERNEL_CH(NAME, TM, ROWS, MODE_PLAIN, OUT, 2, GEMV_MINB(TM, 0))
// rope kernels: the one-token ones uncapped (57 / 64 registers; a minimum of 1 block took them to ~90),
// the 4-, 5- and 16-token ones 3 blocks (as GEMV_MINB), the norm-input ones uncapped
#define GEMV_ROPE_LB_1 __launch_bounds__(GEMV_THREADS)
#define GEMV_ROPE_LB_4 __launch_bounds__(GEMV_THREADS, 3)
#define GEMV_ROPE_LB_5 __launch_bounds__(GEMV_THREADS, 3)
#define GEMV_ROPE_LB_8 __launch_bounds__(GEMV_THREADS)
#define GEMV_ROPE_LB_16 __launch_bounds__(GEMV_THREADS, 3)
#define GEMV_ROPE_KERNEL(NAME, TM, ROWS)                                                                 \
  __global__ void GEMV_ROPE_LB_##TM NAME(const bf16_t* W, const bf16_t* x, int N, int K, int T, \
                                                       const bf16_t* bias, bf16_t* q_out, bf16_t* kc,     \
                                                       bf16_t* vc, const int* pos, int Hq, int Hkv, int D, \
                                                       int max_len, float theta) {                        \
    gemv_body<ROWS, TM, MODE_PLAIN, OUT_QKVROPE>(                                                         \
        W, x, 0, 0.f, 0, 0, 0, N, K, T, K, 0,                                                             \
        RopeArgs{bias, pos, theta, QkvOut<bf16_t>{q_out, kc, vc, Hq, Hkv, D, max_len}});                 \
  }
// the same with the RMSNorm computed by each block from the fp32 residual stream x (MODE_NORM):
// the previous projection only adds into the residual (no ticket tail); nw, eps appended
#define GEMV_NORM_ROPE_KERNEL(NAME, TM, ROWS)                                                            \
  __global__ void __launch_bounds__(GEMV_THREADS) NAME(const bf16_t* W, const float* x, int N, int K, int T, \
                                                       const bf16_t* bias, bf16_t* q_out, bf16_t* kc,     \
                                                       bf16_t* vc, const int* pos, int Hq, int Hkv, int D, \
                                                       int max_len, float theta, const bf16_t* nw, float eps) { \
    gemv_body<ROWS, TM, MODE_NORM, OUT_QKVROPE>(                                                          \
        W, x, nw, eps, 0, 0, 0, N, K, T, K, 0,                                                            \
        RopeArgs{bias, pos, theta, QkvOut<bf16_t>{q_out, kc, vc, Hq, Hkv, D, max_len}});                 \
  }
#define GEMV_INST(TM, ROWS)                                  \
  GEMV_KERNEL(gemv##TM##_bf16, TM, ROWS, MODE_PLAIN)         \
  GEMV_EPI_KERNEL(gemv##TM##_gusilu_bf16, TM, ROWS, OUT_GUSILU) \
  GEMV_EPI_KERNEL(gemv##TM##_resnorm_bf16, TM, ROWS, OUT_RESNORM) \
  GEMV_ROPE_KERNEL(gemv##TM##_qkvrope_bf16, TM, ROWS)        \
  GEMV_NORM_ROPE_KERNEL(gemv##TM##_norm_qkvrope_bf16, TM, ROWS)
GEMV_INST(1, 4)
// one-token products with short rows (K <= 2048: one 16-byte chunk of a row per thread) and many
// output rows (the 1.5B gate/up and vocabulary projections): 8 rows a block, one chunk of each in
// flight per thread (twice the bytes in flight a block of the 4-row kernel at that K; any K works)
GEMV_KERNEL_CH(gemv1r8_bf16, 1, 8, MODE_PLAIN, 1, 3)
GEMV_EPI_KERNEL_CH(gemv1r8_gusilu_bf16, 1, 8, MODE_PLAIN, OUT_GUSILU, 1, 3)
GEMV_INST(4, 4)
GEMV_INST(5, 4)
GEMV_INST(8, 4)
GEMV_INST(16, 2)
// one-token products on 8-bit rows (CudaDecoder(int8_weights=True): a speculative draft's steps, whose numbers
// only decide which tokens are proposed): W int8 codes (N, K), K % 16 == 0, wscale fp32 (N,), the rest as the
// bf16 kernels of the same name; one argument list for the plain and epilogue kernels (counter, then wscale).
// A thread's 16-byte loads carry 16 codes: the same load count as a bf16 row of half the length
#define GEMV_I8_KERNEL(NAME, TM, ROWS, MODE, OUT, CH, MINB)                                                 \
  __global__ void __launch_bounds__(GEMV_THREADS, MINB) NAME(                                             \
      const signed char* W, const void* x, const bf16_t* nw, float eps, bf16_t* yb, float* yf, float* resid, \
      int N, int K, int T, int x_stride, unsigned int* counter, const float* wscale) {                    \
    gemv_body<ROWS, TM, MODE, OUT, CH, 1>(W, x, nw, eps, yb, yf, resid, N, K, T, x_stride, counter,       \
                                          RopeArgs{}, wscale);                                            \
  }
#define GEMV_I8_ROPE_KERNEL(NAME, TM, MODE)                                                                \
  __global__ void __launch_bounds__(GEMV_THREADS) NAME(const signed char* W, const void* x, int N, int K, int T, \
                                                       const bf16_t* bias, bf16_t* q_out, bf16_t* kc,     \
                                                       bf16_t* vc, const int* pos, int Hq, int Hkv, int D, \
                                                       int max_len, float theta, const bf16_t* nw, float eps, \
                                                       const float* wscale) {                             \
    gemv_body<4, TM, MODE, OUT_QKVROPE, 2, 1>(                                                        \
        W, x, nw, eps, 0, 0, 0, N, K, T, K, 0,                                                            \
        RopeArgs{bias, pos, theta, QkvOut<bf16_t>{q_out, kc, vc, Hq, Hkv, D, max_len}}, wscale);         \
  }
// TM tokens (1, or 2: the draft's first step of a round after a fully accepted one takes the last draft and
// the bonus token); 4 output rows a block, or BIG for products of many output rows (gate/up, the LM head;
// K <= 4096: at most one chunk a row a thread): 16 rows a block for one token (the bytes in flight of the
// bf16 gemv1r8_* at half the blocks), 8 for two (the same sums a thread)
#define GEMV_I8_INST(TM, BIG, BMINB)                                                                       \
  GEMV_I8_KERNEL(gemv##TM##_i8, TM, 4, MODE_PLAIN, OUT_PLAIN, 2, 4)                                        \
  GEMV_I8_KERNEL(gemv##TM##_gusilu_i8, TM, 4, MODE_PLAIN, OUT_GUSILU, 2, 4)                                \
  GEMV_I8_KERNEL(gemv##TM##_resnorm_i8, TM, 4, MODE_PLAIN, OUT_RESNORM, 2, 4)                              \
  GEMV_I8_KERNEL(gemv##TM##r##BIG##_i8, TM, BIG, MODE_PLAIN, OUT_PLAIN, 1, BMINB)                          \
  GEMV_I8_KERNEL(gemv##TM##r##BIG##_gusilu_i8, TM, BIG, MODE_PLAIN, OUT_GUSILU, 1, BMINB)                  \
  GEMV_I8_ROPE_KERNEL(gemv##TM##_qkvrope_i8, TM, MODE_PLAIN)                                               \
  GEMV_I8_ROPE_KERNEL(gemv##TM##_norm_qkvrope_i8, TM, MODE_NORM)
GEMV_I8_INST(1, 16, 2)
GEMV_I8_INST(2, 8, 2)
// tensor-core kernels (gemv="tc"): the plain / epilogue argument lists of the kernels above
#define GEMV_TC_INST(NAME, TT, NT, U, MINB)                                                               \
  __global__ void __launch_bounds__(GEMV_THREADS, MINB) NAME##_bf16(                                       \
      const bf16_t* W, const void* x, const bf16_t* nw, float eps, bf16_t* yb, float* yf, float* resid,   \
      int N, int K, int T, int x_stride) {                                                                 \
    gemv_tc_body<TT, NT, U, OUT_PLAIN>(W, (const bf16_t*)x, nw, eps, yb, yf, resid, N, K, T, x_stride, 0, \
                                       RopeArgs{});                                                        \
  }                                                                                                        \
  __global__ void __launch_bounds__(GEMV_THREADS, MINB) NAME##_gusilu_bf16(                                \
      const bf16_t* W, const void* x, const bf16_t* nw, float eps, bf16_t* yb, float* yf, float* resid,   \
      int N, int K, int T, int x_stride, unsigned int* counter) {                                          \
    gemv_tc_body<TT, NT, U, OUT_GUSILU>(W, (const bf16_t*)x, nw, eps, yb, yf, resid, N, K, T, x_stride,   \
                                        counter, RopeArgs{});                                              \
  }                                                                                                        \
  __global__ void __launch_bounds__(GEMV_THREADS, MINB) NAME##_resnorm_bf16(                               \
      const bf16_t* W, const void* x, const bf16_t* nw, float eps, bf16_t* yb, float* yf, float* resid,   \
      int N, int K, int T, int x_stride, unsigned int* counter) {                                          \
    gemv_tc_body<TT, NT, U, OUT_RESNORM>(W, (const bf16_t*)x, nw, eps, yb, yf, resid, N, K, T, x_stride,  \
                                         counter, RopeArgs{});                                             \
  }                                                                                                        \
  __global__ void __launch_bounds__(GEMV_THREADS, MINB) NAME##_qkvrope_bf16(                               \
      const bf16_t* W, const bf16_t* x, int N, int K, int T, const bf16_t* bias, bf16_t* q_out, bf16_t* kc, \
      bf16_t* vc, const int* pos, int Hq, int Hkv, int D, int max_len, float theta) {                      \
    gemv_tc_body<TT, NT, U, OUT_QKVROPE>(W, x, 0, 0.f, 0, 0, 0, N, K, T, K, 0,                            \
                                         RopeArgs{bias, pos, theta, QkvOut<bf16_t>{q_out, kc, vc, Hq, Hkv, D, max_len}}); \
  }
GEMV_TC_INST(gemvtc8, 8, 1, 4, 2)
GEMV_TC_INST(gemvtc8w, 8, 2, 4, 2)
GEMV_TC_INST(gemvtc16, 16, 1, 4, 2)
GEMV_TC_INST(gemvtc16w, 16, 2, 2, 2)
// a draft tree's verify step (minitorch/cuda/decoder.py CudaDecoder.tree_step): the QKV kernel above with token t
// rotated at position *pos + depth[t] (its depth in the tree) and cached at row *pos + t; the same products and
// rounding as a decode step's at that position (tests/test_cuda_tree.py checks the rows; they pass on an H100)
#define GEMV_TC_TREE_INST(NAME, TT, NT, U, MINB)                                                          \
  __global__ void __launch_bounds__(GEMV_THREADS, MINB) NAME##_qkvrope_tree_bf16(                          \
      const bf16_t* W, const bf16_t* x, int N, int K, int T, const bf16_t* bias, bf16_t* q_out, bf16_t* kc, \
      bf16_t* vc, const int* pos, int Hq, int Hkv, int D, int max_len, float theta, const int* depth) {    \
    gemv_tc_body<TT, NT, U, OUT_QKVROPE_TREE>(                                                            \
        W, x, 0, 0.f, 0, 0, 0, N, K, T, K, 0,                                                             \
        RopeArgs{bias, pos, theta, QkvOut<bf16_t>{q_out, kc, vc, Hq, Hkv, D, max_len}, nullptr, 0, depth}); \
  }
GEMV_TC_TREE_INST(gemvtc8, 8, 1, 4, 2)
GEMV_TC_TREE_INST(gemvtc8w, 8, 2, 4, 2)
GEMV_TC_TREE_INST(gemvtc16, 16, 1, 4, 2)
GEMV_TC_TREE_INST(gemvtc16w, 16, 2, 2, 2)
// Batched tensor-core products (minitorch/cuda/batch.py, BatchDecoder): T tokens of up to T different sequences,
// in tiles of 16. Grid (ceil(T / 16), ceil(N / ROWS)): blockIdx.x is the token tile, the fastest-varying index, so
// the tiles that read one weight tile are scheduled together and all but the first find it in L2 (the weights
// cross DRAM about once a step, whatever T); blockIdx.y is the weight tile. Each tile gets gemvtc16's mma sequence
// on its own 16 tokens (gemv_tcm_body above), so token t gets the bits a one-token gemvtc step gives it (the
// exactness argument above): a row of a batch equals its batch-1 decode, and rows never mix. The QKV kernel writes token t's
// key and value into its own sequence's caches, kc / vc + tslot[t] * slot_stride, at position pos[t]. There is no
// resnorm kernel (its last-block ticket would normalise all T rows in one block): gemv_resnorm_rows_bf16 below.
// NAME_bf16 / _gusilu_bf16 / _qkvrope_bf16 over gemv_tcm_body: MT tiles of 16 tokens and 8 NT weight rows a block.
// gemvtcb (one tile, 8 rows) and gemvtcbw (one tile, 16 rows) are the one-tile case; gemvtcm takes 4 tiles (64 tokens).
#define GEMV_TCM_INST(NAME, NT, U, MT, MINB)                                                              \
  __global__ void __launch_bounds__(GEMV_THREADS, MINB) NAME##_bf16(                                       \
      const bf16_t* W, const void* x, const bf16_t* nw, float eps, bf16_t* yb, float* yf, float* resid,   \
      int N, int K, int T, int x_stride) {                                                                 \
    gemv_tcm_body<NT, U, MT, OUT_PLAIN>(W, (const bf16_t*)x, eps, yb, yf, resid, N, K, T, x_stride, 0,     \
                                        RopeArgs{});                                                       \
  }                                                                                                        \
  __global__ void __launch_bounds__(GEMV_THREADS, MINB) NAME##_gusilu_bf16(                                \
      const bf16_t* W, const void* x, const bf16_t* nw, float eps, bf16_t* yb, float* yf, float* resid,   \
      int N, int K, int T, int x_stride, unsigned int* counter) {                                          \
    gemv_tcm_body<NT, U, MT, OUT_GUSILU>(W, (const bf16_t*)x, eps, yb, yf, resid, N, K, T, x_stride,       \
                                         counter, RopeArgs{});                                             \
  }                                                                                                        \
  __global__ void __launch_bounds__(GEMV_THREADS, MINB) NAME##_qkvrope_bf16(                               \
      const bf16_t* W, const bf16_t* x, int N, int K, int T, const bf16_t* bias, bf16_t* q_out, bf16_t* kc, \
      bf16_t* vc, const int* pos, int Hq, int Hkv, int D, int max_len, float theta, const int* tslot,     \
      i64 slot_stride) {                                                                                   \
    RopeArgs ra{bias, pos, theta, QkvOut<bf16_t>{q_out, kc, vc, Hq, Hkv, D, max_len}};                    \
    ra.tslot = tslot;                                                                                      \
    ra.slot_stride = slot_stride;                                                                          \
    gemv_tcm_body<NT, U, MT, OUT_QKVROPE>(W, x, 0.f, 0, 0, 0, N, K, T, K, 0, ra);                          \
  }
GEMV_TCM_INST(gemvtcb, 1, 4, 1, 2)
GEMV_TCM_INST(gemvtcbw, 2, 2, 1, 2)
GEMV_TCM_INST(gemvtcm, 2, 2, 4, 2)
// out row t = RMSNorm(resid row t) * nw for T rows, one block of GEMV_THREADS a row: resnorm_row, the function the
// resnorm epilogue's last block runs, with the same block size, so the same bits (the batched step's norms).
__global__ void __launch_bounds__(GEMV_THREADS) gemv_resnorm_rows_bf16(const float* resid, const bf16_t* nw,
                                                                       bf16_t* out, int N, float eps) {
  __shared__ float buf[GEMV_THREADS / 32];
  pdl_wait();
  pdl_trigger();
  resnorm_row(resid + (i64)blockIdx.x * N, nw, out + (i64)blockIdx.x * N, N, eps, buf);
}
}
