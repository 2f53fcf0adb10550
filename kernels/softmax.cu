// softmax.cu: softmax and log-softmax over the last dim of a contiguous (rows, n) matrix.
//
// Launch layout: one block per row (grid.x = rows, <= 2^31-1), blockDim = 256 or 1024 (host picks
// 1024 when n >= 4096); any n >= 1 (no 1,024 cap: threads stride over the row). Pass 1 keeps an
// online (max, sum of exp) per thread and merges them across the block; pass 2 writes.
// fp32 accumulation for fp32 and bf16 storage. -inf inputs give 0 (log: -inf); a row of all -inf
// gives NaN, as torch does.
#include "common.cuh"

template <typename T>
__device__ void softmax_body(const T* x, T* out, int n, int log_mode) {
  __shared__ float bufm[32], bufs[32];
  const T* row = x + (i64)blockIdx.x * n;
  T* orow = out + (i64)blockIdx.x * n;
  float m = -MT_INF, s = 0.f;
  for (int k = threadIdx.x; k < n; k += blockDim.x) {
    float v = to_f(row[k]);
    if (v > m) { s = (m == -MT_INF) ? 0.f : s * __expf(m - v); m = v; }
    if (v != -MT_INF) s += __expf(v - m);
  }
  // merge (m, s) across the warp, then across warps
  for (int o = 16; o > 0; o >>= 1) {
    float om = __shfl_xor_sync(0xffffffffu, m, o), os = __shfl_xor_sync(0xffffffffu, s, o);
    float nm = fmaxf(m, om);
    s = (nm == -MT_INF) ? 0.f : s * __expf(m - nm) + os * __expf(om - nm);
    m = nm;
  }
  int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
  if (lane == 0) { bufm[wid] = m; bufs[wid] = s; }
  __syncthreads();
  m = lane < nw ? bufm[lane] : -MT_INF;
  s = lane < nw ? bufs[lane] : 0.f;
  for (int o = 16; o > 0; o >>= 1) {
    float om = __shfl_xor_sync(0xffffffffu, m, o), os = __shfl_xor_sync(0xffffffffu, s, o);
    float nm = fmaxf(m, om);
    s = (nm == -MT_INF) ? 0.f : s * __expf(m - nm) + os * __expf(om - nm);
    m = nm;
  }
  if (log_mode) {
    float lse = m + logf(s);
    for (int k = threadIdx.x; k < n; k += blockDim.x) orow[k] = from_f<T>(to_f(row[k]) - lse);
  } else {
    float inv = 1.f / s;
    for (int k = threadIdx.x; k < n; k += blockDim.x) orow[k] = from_f<T>(__expf(to_f(row[k]) - m) * inv);
  }
}

extern "C" {
__global__ void softmax_f32(const float* x, float* out, int n, int log_mode) { softmax_body<float>(x, out, n, log_mode); }
__global__ void softmax_bf16(const bf16_t* x, bf16_t* out, int n, int log_mode) { softmax_body<bf16_t>(x, out, n, log_mode); }
}
