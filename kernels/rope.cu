// rope.cu: rotary position embedding, transformers' rotate_half convention.
//
// rope_*: x contiguous (rows, D) with rows = prod(leading dims) * T and the position of row r
//   being r % T; cos/sin contiguous (T, D) in the storage dtype of x. out may alias x.
//   out[d] = x[d] * cos[t][d] + rotate_half(x)[d] * sin[t][d],
//   rotate_half(x) = cat(-x[D/2:], x[:D/2]). Launch: grid-stride over rows * D/2 rotation pairs, 256 threads.
// Limits: D even. fp32 arithmetic, one rounding to the storage dtype.
#include "common.cuh"

template <typename T>
__device__ void rope_body(const T* x, const T* cos_t, const T* sin_t, T* out, i64 rows, int T_len, int D) {
  // one thread per rotation pair (d, d + D/2): both are read before either is written, so
  // out may alias x.
  int half = D >> 1;
  i64 n = rows * half;
  for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {
    i64 r = i / half;
    int d = (int)(i - r * half);
    int t = (int)(r % T_len);
    const T* xr = x + r * D;
    const T* cr = cos_t + (i64)t * D;
    const T* sr = sin_t + (i64)t * D;
    float x1 = to_f(xr[d]), x2 = to_f(xr[d + half]);
    float o1 = x1 * to_f(cr[d]) - x2 * to_f(sr[d]);
    float o2 = x2 * to_f(cr[d + half]) + x1 * to_f(sr[d + half]);
    out[r * D + d] = from_f<T>(o1);
    out[r * D + d + half] = from_f<T>(o2);
  }
}

extern "C" {
__global__ void rope_f32(const float* x, const float* c, const float* s, float* out, i64 rows, int T_len, int D) {
  rope_body<float>(x, c, s, out, rows, T_len, D);
}
__global__ void rope_bf16(const bf16_t* x, const bf16_t* c, const bf16_t* s, bf16_t* out, i64 rows, int T_len, int D) {
  rope_body<bf16_t>(x, c, s, out, rows, T_len, D);
}
}
