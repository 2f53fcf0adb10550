// embedding.cu: embedding gather (token ids -> rows of the embedding matrix).
//
// embedding_*: weight (V, D) contiguous, ids int64 (n,), out (n, D) contiguous.
//   Launch: grid (n), 256 threads striding over D. An id outside [0, V) writes NaN rows (the host
//   checks ids it can see; ids produced on the device are checked by being visible in the logits).
// embedding_bf16_f32 / embedding_f32_f32 write fp32 rows (the decode path's fp32 residual stream).
#include "common.cuh"

template <typename T, typename TO>
__device__ void embedding_body(const T* w, const i64* ids, TO* out, int V, int D) {
  i64 id = ids[blockIdx.x];
  TO* orow = out + (i64)blockIdx.x * D;
  if (id < 0 || id >= V) {
    for (int d = threadIdx.x; d < D; d += blockDim.x) orow[d] = from_f<TO>(__int_as_float(0x7fc00000));
    return;
  }
  const T* row = w + id * D;
  for (int d = threadIdx.x; d < D; d += blockDim.x) orow[d] = from_f<TO>(to_f(row[d]));
}

extern "C" {
__global__ void embedding_f32(const float* w, const i64* ids, float* out, int V, int D) { embedding_body<float, float>(w, ids, out, V, D); }
__global__ void embedding_bf16(const bf16_t* w, const i64* ids, bf16_t* out, int V, int D) { embedding_body<bf16_t, bf16_t>(w, ids, out, V, D); }
__global__ void embedding_bf16_f32(const bf16_t* w, const i64* ids, float* out, int V, int D) { pdl_wait(); embedding_body<bf16_t, float>(w, ids, out, V, D); }
}
