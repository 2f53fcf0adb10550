// gemv.cu: bf16 weight x few-token activation products for the decode / verify steps
// (y[t, n] = sum_k x[t, k] * W[n, k]), memory-bound on reading W once.
//
// Launch layout: 256 threads (8 warps) a block, one warp per output row n (grid-stride over rows),
//   grid = min(ceil(N / 8), 8 * SMs). Each lane streams 16-byte chunks (8 bf16) of the weight row,
//   4 in flight (unrolled), multiplies them with the same chunk of every token's activation
//   (read through the read-only cache) and keeps T fp32 sums; a warp shuffle reduces them.
// Shapes: W (N, K) bf16 row-major, x (T, x_stride) bf16; T <= TMAX of the instantiation
//   (gemv{1,4,8,16}_bf16). Exactly one output: yb (T, N) bf16, yf (T, N) fp32, or resid (T, N)
//   fp32 that the product is ADDED to (the residual stream).
// Limits: K % 8 == 0, x_stride % 8 == 0, W / x 16-byte aligned (the host checks); N, K < 2^31.
#include "common.cuh"

__device__ __forceinline__ void bf16x8_to_f32(const uint4& v, float* f) {
  const unsigned int w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = __uint_as_float(w[i] << 16);
    f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
}

template <int TMAX>
__device__ void gemv_body(const bf16_t* __restrict__ W, const bf16_t* __restrict__ x, bf16_t* __restrict__ yb,
                          float* __restrict__ yf, float* __restrict__ resid, int N, int K, int T, int x_stride) {
  const int lane = threadIdx.x & 31;
  const int nw = (gridDim.x * blockDim.x) >> 5;
  const int K8 = K >> 3;
  for (int n = (blockIdx.x * blockDim.x + threadIdx.x) >> 5; n < N; n += nw) {
    const uint4* __restrict__ wr = reinterpret_cast<const uint4*>(W + (i64)n * K);
    float acc[TMAX];
#pragma unroll
    for (int t = 0; t < TMAX; ++t) acc[t] = 0.f;
    int k8 = lane;
    for (; k8 + 96 < K8; k8 += 128) {  // 4 weight chunks in flight
      uint4 w4[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) w4[u] = __ldg(wr + k8 + 32 * u);
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        float wf[8];
        bf16x8_to_f32(w4[u], wf);
#pragma unroll
        for (int t = 0; t < TMAX; ++t) {
          if (t < T) {
            float xf[8];
            bf16x8_to_f32(__ldg(reinterpret_cast<const uint4*>(x + (i64)t * x_stride) + k8 + 32 * u), xf);
#pragma unroll
            for (int i = 0; i < 8; ++i) acc[t] = fmaf(wf[i], xf[i], acc[t]);
          }
        }
      }
    }
    for (; k8 < K8; k8 += 32) {
      float wf[8];
      bf16x8_to_f32(__ldg(wr + k8), wf);
#pragma unroll
      for (int t = 0; t < TMAX; ++t) {
        if (t < T) {
          float xf[8];
          bf16x8_to_f32(__ldg(reinterpret_cast<const uint4*>(x + (i64)t * x_stride) + k8), xf);
#pragma unroll
          for (int i = 0; i < 8; ++i) acc[t] = fmaf(wf[i], xf[i], acc[t]);
        }
      }
    }
#pragma unroll
    for (int t = 0; t < TMAX; ++t) acc[t] = warp_sum(acc[t]);
    if (lane == 0) {
#pragma unroll
      for (int t = 0; t < TMAX; ++t) {
        if (t < T) {
          i64 o = (i64)t * N + n;
          if (resid) resid[o] += acc[t];
          else if (yf) yf[o] = acc[t];
          else yb[o] = from_f<bf16_t>(acc[t]);
        }
      }
    }
  }
}

extern "C" {
#define GEMV_INST(TM)                                                                                   \
  __global__ void __launch_bounds__(256) gemv##TM##_bf16(const bf16_t* W, const bf16_t* x, bf16_t* yb,   \
                                                         float* yf, float* resid, int N, int K, int T,    \
                                                         int x_stride) {                                 \
    gemv_body<TM>(W, x, yb, yf, resid, N, K, T, x_stride);                                               \
  }
GEMV_INST(1)
GEMV_INST(4)
GEMV_INST(8)
GEMV_INST(16)
}
