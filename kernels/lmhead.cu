// lmhead.cu: a speculative draft's LM head with 8-bit weights (CudaDecoder(lm_head_int8=True)).
//
// Why: the 0.5B draft's bf16 LM head (151,936 x 896) is 27% of the bytes a draft step reads and ~81 us of a
// ~0.7 ms step on the H200 (docs/GPU_RESULTS.md, round 8). A draft's numbers only decide which tokens are
// proposed (the target's verify decides the output), so its head can read half the bytes.
//
// lmhead_i8_f32: y[n] = scale[n] * sum_k W[n][k] * x[k] for n < N: one input row x (bf16, K values), int8
//   rows W (N x K, row-major, 16-byte aligned, K % 16 == 0, K <= LH_KMAX), fp32 per-row scales, fp32 y.
//   Grid ceil(N / (LH_WARPS * LH_ROWS)), LH_THREADS threads: a warp takes LH_ROWS rows, its lanes 16-code
//   chunks c = lane, lane + 32, ...; each row's sum is a lane-ordered fp32 sum then a warp reduction, so a
//   launch is deterministic. The first chunk of every row is loaded before pdl_wait (weights are constant);
//   x goes to shared memory after it.
#include "common.cuh"

#define LH_THREADS 256
#define LH_WARPS (LH_THREADS / 32)
#define LH_ROWS 4
#define LH_KMAX 8192
#ifndef LH_BROKEN
#define LH_BROKEN 0  // tests only: every row's last chunk is left out of its sum
#endif

// 16 int8 codes (one 16-byte chunk) dotted with 16 floats of shared memory.
__device__ __forceinline__ float dot4_i8(unsigned int w, const float* x, float s) {
  const int v = (int)w;
  const float4 xv = *reinterpret_cast<const float4*>(x);
  s = fmaf((float)((v << 24) >> 24), xv.x, s);
  s = fmaf((float)((v << 16) >> 24), xv.y, s);
  s = fmaf((float)((v << 8) >> 24), xv.z, s);
  return fmaf((float)(v >> 24), xv.w, s);
}
__device__ __forceinline__ float dot16_i8(const uint4& w, const float* x) {
  return dot4_i8(w.w, x + 12, dot4_i8(w.z, x + 8, dot4_i8(w.y, x + 4, dot4_i8(w.x, x, 0.f))));
}

extern "C" __global__ void __launch_bounds__(LH_THREADS)
lmhead_i8_f32(const signed char* __restrict__ W, const float* __restrict__ scale, const bf16_t* x, float* y, int N,
              int K) {
  __shared__ __align__(16) float xs[LH_KMAX];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int row0 = (blockIdx.x * LH_WARPS + warp) * LH_ROWS;
  const int nch = K >> 4;
  const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
  uint4 first[LH_ROWS];  // each row's chunk `lane`, in flight before the wait
#pragma unroll
  for (int r = 0; r < LH_ROWS; ++r)
    first[r] = (row0 + r < N && lane < nch)
                   ? __ldcs(reinterpret_cast<const uint4*>(W + (i64)(row0 + r) * K) + lane) : zero;
  pdl_wait();  // x is the previous kernel's output
  for (int i = threadIdx.x; i < K; i += LH_THREADS) xs[i] = to_f(x[i]);
  __syncthreads();
  float acc[LH_ROWS];
#pragma unroll
  for (int r = 0; r < LH_ROWS; ++r) acc[r] = lane < nch - LH_BROKEN ? dot16_i8(first[r], xs + 16 * lane) : 0.f;
  for (int c = lane + 32; c < nch - LH_BROKEN; c += 32) {
    uint4 w[LH_ROWS];
#pragma unroll
    for (int r = 0; r < LH_ROWS; ++r)
      w[r] = row0 + r < N ? __ldcs(reinterpret_cast<const uint4*>(W + (i64)(row0 + r) * K) + c) : zero;
#pragma unroll
    for (int r = 0; r < LH_ROWS; ++r) acc[r] += dot16_i8(w[r], xs + 16 * c);
  }
#pragma unroll
  for (int r = 0; r < LH_ROWS; ++r) {
    const float s = warp_sum(acc[r]);
    if (lane == 0 && row0 + r < N) y[row0 + r] = s * scale[row0 + r];
  }
}
