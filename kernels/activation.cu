// activation.cu: SiLU-gated multiply (SwiGLU), out = silu(gate) * up, in fp32 arithmetic.
//
// silu_mul_*: gate, up, out contiguous of n elements. gate_up_silu_*: gu (rows, 2*I) holding
//   [gate | up] per row (the decode path's fused gate/up projection) -> out (rows, I).
//   gate_up_silu_il_*: the same from interleaved rows [gate 0, up 0, gate 1, up 1, ...] (the decode
//   path's gate/up weight layout, kernels/gemv.cu gemv*_gusilu_bf16).
//   Launch: grid-stride, 256 threads.
#include "common.cuh"

__device__ __forceinline__ float silu_f(float g) { return g / (1.f + __expf(-g)); }

template <typename T>
__device__ void silu_mul_body(const T* gate, const T* up, T* out, i64 n) {
  for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x)
    out[i] = from_f<T>(silu_f(to_f(gate[i])) * to_f(up[i]));
}
template <typename T>
__device__ void gate_up_silu_body(const T* gu, T* out, i64 rows, int I) {
  i64 n = rows * I;
  for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {
    i64 r = i / I;
    int c = (int)(i - r * I);
    const T* row = gu + r * 2 * I;
    out[i] = from_f<T>(silu_f(to_f(row[c])) * to_f(row[I + c]));
  }
}

template <typename T>
__device__ void gate_up_silu_il_body(const T* gu, T* out, i64 rows, int I) {
  i64 n = rows * I;
  for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x)
    out[i] = from_f<T>(silu_f(to_f(gu[2 * i])) * to_f(gu[2 * i + 1]));
}

extern "C" {
__global__ void silu_mul_f32(const float* g, const float* u, float* o, i64 n) { silu_mul_body<float>(g, u, o, n); }
__global__ void silu_mul_bf16(const bf16_t* g, const bf16_t* u, bf16_t* o, i64 n) { silu_mul_body<bf16_t>(g, u, o, n); }
__global__ void gate_up_silu_f32(const float* gu, float* o, i64 rows, int I) { gate_up_silu_body<float>(gu, o, rows, I); }
__global__ void gate_up_silu_bf16(const bf16_t* gu, bf16_t* o, i64 rows, int I) { pdl_wait(); gate_up_silu_body<bf16_t>(gu, o, rows, I); }
__global__ void gate_up_silu_il_bf16(const bf16_t* gu, bf16_t* o, i64 rows, int I) { pdl_wait(); gate_up_silu_il_body<bf16_t>(gu, o, rows, I); }
}
