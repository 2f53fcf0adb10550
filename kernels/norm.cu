// norm.cu: RMSNorm, LayerNorm and the fused residual-add + RMSNorm of the decode path.
//
// Launch layout: one block per row (grid.x = rows), 256 threads a block (1024 for n >= 4096);
// rows contiguous, any n >= 1. Sums of squares and means in fp32 for fp32 and bf16 storage.
// rmsnorm:      out = w * (x * rsqrt(mean(x^2) + eps)); for bf16 the normalised value is rounded to
//               bf16 before the weight multiply, as transformers' Qwen2RMSNorm does.
// layernorm:    out = (x - mean) * rsqrt(var + eps) * w + b   (biased variance, two-pass).
// add_rmsnorm:  resid (fp32, rows x n) += delta (T, may be null); out (T) = rmsnorm(resid) * w;
//               any blockDim (multiple of 32); the first 8 * blockDim elements stay in registers.
#include "common.cuh"

template <typename T>
__device__ void rmsnorm_body(const T* x, const T* w, T* out, int n, float eps) {
  __shared__ float buf[32];
  const T* row = x + (i64)blockIdx.x * n;
  T* orow = out + (i64)blockIdx.x * n;
  float ss = 0.f;
  for (int k = threadIdx.x; k < n; k += blockDim.x) { float v = to_f(row[k]); ss += v * v; }
  ss = block_sum(ss, buf);
  float inv = rsqrtf(ss / n + eps);
  for (int k = threadIdx.x; k < n; k += blockDim.x)
    orow[k] = from_f<T>(to_f(from_f<T>(to_f(row[k]) * inv)) * to_f(w[k]));
}

template <typename T>
__device__ void layernorm_body(const T* x, const T* w, const T* b, T* out, int n, float eps) {
  __shared__ float buf[32];
  const T* row = x + (i64)blockIdx.x * n;
  T* orow = out + (i64)blockIdx.x * n;
  float s = 0.f;
  for (int k = threadIdx.x; k < n; k += blockDim.x) s += to_f(row[k]);
  float mean = block_sum(s, buf) / n;
  float v2 = 0.f;
  for (int k = threadIdx.x; k < n; k += blockDim.x) { float d = to_f(row[k]) - mean; v2 += d * d; }
  float inv = rsqrtf(block_sum(v2, buf) / n + eps);
  for (int k = threadIdx.x; k < n; k += blockDim.x)
    orow[k] = from_f<T>((to_f(row[k]) - mean) * inv * to_f(w[k]) + (b ? to_f(b[k]) : 0.f));
}

template <typename T>
__device__ void add_rmsnorm_body(float* resid, const T* delta, const T* w, T* out, int n, float eps) {
  // one pass over memory: each thread keeps its first 8 elements in registers
  __shared__ float buf[32];
  float* row = resid + (i64)blockIdx.x * n;
  const T* drow = delta ? delta + (i64)blockIdx.x * n : (const T*)0;
  T* orow = out + (i64)blockIdx.x * n;
  const int bd = blockDim.x;
  float v[8];
  float ss = 0.f;
#pragma unroll
  for (int u = 0; u < 8; ++u) {
    int k = threadIdx.x + u * bd;
    v[u] = 0.f;
    if (k < n) {
      float x = row[k];
      if (drow) { x += to_f(drow[k]); row[k] = x; }
      v[u] = x;
      ss += x * x;
    }
  }
  for (int k = threadIdx.x + 8 * bd; k < n; k += bd) {
    float x = row[k];
    if (drow) { x += to_f(drow[k]); row[k] = x; }
    ss += x * x;
  }
  ss = block_sum(ss, buf);
  float inv = rsqrtf(ss / n + eps);
#pragma unroll
  for (int u = 0; u < 8; ++u) {
    int k = threadIdx.x + u * bd;
    if (k < n) orow[k] = from_f<T>(to_f(from_f<T>(v[u] * inv)) * to_f(w[k]));
  }
  for (int k = threadIdx.x + 8 * bd; k < n; k += bd) orow[k] = from_f<T>(to_f(from_f<T>(row[k] * inv)) * to_f(w[k]));
}

extern "C" {
#define NORM_INST(sfx, T)                                                                         \
  __global__ void rmsnorm_##sfx(const T* x, const T* w, T* out, int n, float eps) {                \
    rmsnorm_body<T>(x, w, out, n, eps);                                                           \
  }                                                                                               \
  __global__ void layernorm_##sfx(const T* x, const T* w, const T* b, T* out, int n, float eps) {  \
    layernorm_body<T>(x, w, b, out, n, eps);                                                      \
  }                                                                                               \
  __global__ void add_rmsnorm_##sfx(float* resid, const T* delta, const T* w, T* out, int n, float eps) { \
    pdl_trigger(); /* the next projection may start streaming its weights */                      \
    pdl_wait();                                                                                   \
    add_rmsnorm_body<T>(resid, delta, w, out, n, eps);                                            \
  }
NORM_INST(f32, float)
NORM_INST(bf16, bf16_t)
}
