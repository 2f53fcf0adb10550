// gemv.cu: bf16 weight x few-token activation products for the decode / verify steps
// (y[t, n] = sum_k x[t, k] * W[n, k]), memory-bound on reading W once.
//
// Launch layout: one block of 256 threads (8 warps) per ROWS consecutive output rows
//   (grid = ceil(N / ROWS)). All 256 threads split each row's K axis into 16-byte chunks (8 bf16),
//   two chunks of every row in flight per thread, so each warp reads 512 contiguous bytes of a row
//   per load; an activation chunk, read once through the read-only cache, serves all ROWS rows.
//   Sums stay in fp32: a warp shuffle, then 8 warps are merged through shared memory.
// Instantiations gemv{TMAX}[_silu|_norm]_bf16 for T <= TMAX tokens: TMAX 1, 4 and 8 use ROWS = 4,
//   TMAX 16 uses ROWS = 2. Input modes:
//   plain: x (T, x_stride) bf16.
//   _silu: x rows hold 2K values [gate | up]; the input is bf16(silu(gate) * up), bit for bit what
//          gate_up_silu_bf16 (activation.cu) would have written (the SwiGLU product fused into the
//          down projection, so fused and unfused steps compute identical values).
// Per-token reduction order: every instantiation (any TMAX, ROWS) accumulates token t of row n in
//   the same order (thread k8 chain of fmaf, warp shuffle, 8 warps in order), so a token's result
//   does not depend on how many tokens share the launch (greedy speculative == autoregressive).
//   _norm: x is the fp32 residual stream (T, K) and nw a bf16 RMSNorm weight; each block computes
//          rsqrt(mean(x^2) + eps) per token itself and uses bf16(bf16(x * inv) * nw), exactly what
//          add_rmsnorm (norm.cu) would have written (the norm fused into the next projection).
// Outputs (exactly one non-null): yb (T, N) bf16, yf (T, N) fp32, or resid (T, N) fp32 that the
//   product is ADDED to (the residual stream).
// PDL: weights are prefetched into L2 before pdl_wait() (common.cuh), so under programmatic dependent
//   launch the weight stream overlaps the previous kernel; the successor is triggered after the loop.
// Limits: K % 8 == 0, x_stride % 8 == 0, W / x 16-byte aligned (the host checks); N, K < 2^31.
#include "common.cuh"

#define GEMV_THREADS 256

__device__ __forceinline__ void bf16x8_to_f32(const uint4& v, float* f) {
  const unsigned int w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = __uint_as_float(w[i] << 16);
    f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
}
__device__ __forceinline__ float round_bf16(float x) { return to_f(from_f<bf16_t>(x)); }

enum { MODE_PLAIN = 0, MODE_SILU = 1, MODE_NORM = 2 };

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
    if (MODE == MODE_SILU) {
      float uf[8];
      bf16x8_to_f32(__ldg(reinterpret_cast<const uint4*>(xt + K) + k8), uf);
#pragma unroll
      for (int i = 0; i < 8; ++i) xf[i] = round_bf16(xf[i] / (1.f + __expf(-xf[i])) * uf[i]);
    }
  }
}

template <int ROWS, int TMAX, int MODE>
__device__ __forceinline__ void gemv_accum(const uint4 (&wv)[ROWS], const void* __restrict__ x,
                                           const bf16_t* __restrict__ nw, const float* inv, int k8, int T,
                                           int x_stride, int K, float (&acc)[ROWS][TMAX]) {
  float wf[ROWS][8];
#pragma unroll
  for (int r = 0; r < ROWS; ++r) bf16x8_to_f32(wv[r], wf[r]);
#pragma unroll
  for (int t = 0; t < TMAX; ++t) {
    if (t < T) {
      float xf[8];
      load_x8<MODE>(x, nw, t, k8, x_stride, K, MODE == MODE_NORM ? inv[t] : 0.f, xf);
#pragma unroll
      for (int r = 0; r < ROWS; ++r)
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[r][t] = fmaf(wf[r][i], xf[i], acc[r][t]);
    }
  }
}

template <int ROWS, int TMAX, int MODE>
__device__ void gemv_body(const bf16_t* __restrict__ W, const void* __restrict__ x, const bf16_t* __restrict__ nw,
                          float eps, bf16_t* __restrict__ yb, float* __restrict__ yf, float* __restrict__ resid,
                          int N, int K, int T, int x_stride) {
  __shared__ float red[GEMV_THREADS / 32][ROWS * TMAX];
  __shared__ float s_inv[TMAX];
  const int tid = threadIdx.x, lane = tid & 31, wid = tid >> 5;
  const int n0 = blockIdx.x * ROWS;
  const int K8 = K >> 3;
  const uint4* __restrict__ wr[ROWS];
#pragma unroll
  for (int r = 0; r < ROWS; ++r) wr[r] = reinterpret_cast<const uint4*>(W + (i64)min(n0 + r, N - 1) * K);
  // start the weight stream (constant data) into L2 before waiting for the previous kernel (PDL) and
  // before the (latency-bound) norm statistics
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
    if (tid < K8) asm volatile("prefetch.global.L2 [%0];" ::"l"(wr[r] + tid));
    if (tid + GEMV_THREADS < K8) asm volatile("prefetch.global.L2 [%0];" ::"l"(wr[r] + tid + GEMV_THREADS));
  }
  pdl_wait();  // x / resid / outputs are touched only after this
  if (MODE == MODE_NORM) {
    float ss[TMAX];
#pragma unroll
    for (int t = 0; t < TMAX; ++t) {
      ss[t] = 0.f;
      if (t < T) {
        const float* xt = reinterpret_cast<const float*>(x) + (i64)t * K;
        for (int k = tid; k < K; k += GEMV_THREADS) ss[t] = fmaf(xt[k], xt[k], ss[t]);
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
  int k8 = tid;
  for (; k8 + GEMV_THREADS < K8; k8 += 2 * GEMV_THREADS) {
    uint4 a[ROWS], b[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) { a[r] = __ldg(wr[r] + k8); b[r] = __ldg(wr[r] + k8 + GEMV_THREADS); }
    gemv_accum<ROWS, TMAX, MODE>(a, x, nw, inv, k8, T, x_stride, K, acc);
    gemv_accum<ROWS, TMAX, MODE>(b, x, nw, inv, k8 + GEMV_THREADS, T, x_stride, K, acc);
  }
  if (k8 < K8) {
    uint4 a[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) a[r] = __ldg(wr[r] + k8);
    gemv_accum<ROWS, TMAX, MODE>(a, x, nw, inv, k8, T, x_stride, K, acc);
  }
  pdl_trigger();  // weights streamed: the next kernel may launch and prefetch its own
  __syncthreads();  // `red` is reused below
#pragma unroll
  for (int r = 0; r < ROWS; ++r)
#pragma unroll
    for (int t = 0; t < TMAX; ++t) {
      float v = warp_sum(acc[r][t]);
      if (lane == 0) red[wid][r * TMAX + t] = v;
    }
  __syncthreads();
  if (tid < ROWS * TMAX) {
    int r = tid / TMAX, t = tid % TMAX, n = n0 + r;
    if (n < N && t < T) {
      float s = 0.f;
#pragma unroll
      for (int w = 0; w < GEMV_THREADS / 32; ++w) s += red[w][tid];
      i64 o = (i64)t * N + n;
      if (resid) resid[o] += s;
      else if (yf) yf[o] = s;
      else yb[o] = from_f<bf16_t>(s);
    }
  }
}

extern "C" {
#define GEMV_KERNEL(NAME, TM, ROWS, MODE)                                                                \
  __global__ void __launch_bounds__(GEMV_THREADS) NAME(const bf16_t* W, const void* x, const bf16_t* nw,  \
                                                       float eps, bf16_t* yb, float* yf, float* resid,    \
                                                       int N, int K, int T, int x_stride) {               \
    gemv_body<ROWS, TM, MODE>(W, x, nw, eps, yb, yf, resid, N, K, T, x_stride);                           \
  }
#define GEMV_INST(TM, ROWS)                                  \
  GEMV_KERNEL(gemv##TM##_bf16, TM, ROWS, MODE_PLAIN)         \
  GEMV_KERNEL(gemv##TM##_silu_bf16, TM, ROWS, MODE_SILU)     \
  GEMV_KERNEL(gemv##TM##_norm_bf16, TM, ROWS, MODE_NORM)
GEMV_INST(1, 4)
GEMV_INST(4, 4)
GEMV_INST(8, 4)
GEMV_INST(16, 2)
}
