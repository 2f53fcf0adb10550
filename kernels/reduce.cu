// reduce.cu: reductions along one dim (sum, prod, max, min) over strided tensors, and row argmax.
//
// Launch layout. reduce_warp_*: one warp per output element, 8 warps (256 threads) a block, grid-stride over
//   outputs; best for many outputs. reduce_block_*: one block (256 threads) per output element;
//   best for few outputs over long dims. meta (device int64):
//   [nd, out_shape[nd] (reduced dim = 1), out_strides[nd], a_strides[nd]]; the reduced dim has
//   length R and input stride `rstride`. Accumulation in fp32 (double for i64).
// argmax_*: rows of a contiguous (rows, n) matrix, one block of 1024 threads per row, any n < 2^31;
//   out is int64 (rows,), ties go to the lowest index; NaN is never chosen over a number.
// Limits: rank <= 8.
#include "common.cuh"

template <typename F> __device__ __forceinline__ F red_init(int op) {
  return op == 0 ? (F)0 : op == 1 ? (F)1 : op == 2 ? (F)-MT_INF : (F)MT_INF;
}
template <typename F> __device__ __forceinline__ F red_apply(int op, F a, F b) {
  switch (op) {
    case 0: return a + b;
    case 1: return a * b;
    case 2: return (a != a || a > b) ? a : b;      // max; propagates NaN
    default: return (a != a || a < b) ? a : b;     // min; propagates NaN
  }
}
__device__ __forceinline__ float ldf(const float* p, i64 i) { return p[i]; }
__device__ __forceinline__ float ldf(const bf16_t* p, i64 i) { return to_f(p[i]); }
__device__ __forceinline__ double ldf(const i64* p, i64 i) { return (double)p[i]; }
__device__ __forceinline__ void stf(float* p, i64 i, float v) { p[i] = v; }
__device__ __forceinline__ void stf(bf16_t* p, i64 i, float v) { p[i] = from_f<bf16_t>(v); }
__device__ __forceinline__ void stf(i64* p, i64 i, double v) { p[i] = (i64)v; }

template <typename F> __device__ __forceinline__ F warp_red(int op, F v) {
  for (int o = 16; o > 0; o >>= 1) v = red_apply<F>(op, v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

template <typename T, typename F>
__device__ void reduce_warp_body(const T* a, T* out, const i64* meta, i64 nout, i64 R, i64 rstride, int op) {
  int nd = (int)meta[0];
  const i64* shape = meta + 1;
  int lane = threadIdx.x & 31;
  i64 w = ((i64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  i64 nw = ((i64)gridDim.x * blockDim.x) >> 5;
  for (; w < nout; w += nw) {
    i64 base = strided_offset(w, nd, shape, shape + 2 * nd);
    F acc = red_init<F>(op);
    for (i64 k = lane; k < R; k += 32) acc = red_apply<F>(op, acc, (F)ldf(a, base + k * rstride));
    acc = warp_red<F>(op, acc);
    if (lane == 0) stf(out, strided_offset(w, nd, shape, shape + nd), acc);
  }
}

template <typename T, typename F>
__device__ void reduce_block_body(const T* a, T* out, const i64* meta, i64 nout, i64 R, i64 rstride, int op) {
  __shared__ F buf[32];
  int nd = (int)meta[0];
  const i64* shape = meta + 1;
  int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nwarp = blockDim.x >> 5;
  for (i64 o = blockIdx.x; o < nout; o += gridDim.x) {
    i64 base = strided_offset(o, nd, shape, shape + 2 * nd);
    F acc = red_init<F>(op);
    for (i64 k = threadIdx.x; k < R; k += blockDim.x) acc = red_apply<F>(op, acc, (F)ldf(a, base + k * rstride));
    acc = warp_red<F>(op, acc);
    __syncthreads();
    if (lane == 0) buf[wid] = acc;
    __syncthreads();
    if (wid == 0) {
      acc = lane < nwarp ? buf[lane] : red_init<F>(op);
      acc = warp_red<F>(op, acc);
      if (lane == 0) stf(out, strided_offset(o, nd, shape, shape + nd), acc);
    }
  }
}

template <typename T>
__device__ void argmax_body(const T* x, i64* out, int n) {
  __shared__ float sv[32];
  __shared__ int si[32];
  const T* row = x + (i64)blockIdx.x * n;
  float best = -MT_INF;
  int bi = 0x7fffffff;
  for (int k = threadIdx.x; k < n; k += blockDim.x) {
    float v = to_f(row[k]);
    if (v > best || (bi == 0x7fffffff && v == v)) { best = v; bi = k; }
  }
  for (int o = 16; o > 0; o >>= 1) {
    float ov = __shfl_xor_sync(0xffffffffu, best, o);
    int oi = __shfl_xor_sync(0xffffffffu, bi, o);
    if (ov > best || (ov == best && oi < bi)) { best = ov; bi = oi; }
  }
  int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
  if (lane == 0) { sv[wid] = best; si[wid] = bi; }
  __syncthreads();
  if (wid == 0) {
    best = lane < nw ? sv[lane] : -MT_INF;
    bi = lane < nw ? si[lane] : 0x7fffffff;
    for (int o = 16; o > 0; o >>= 1) {
      float ov = __shfl_xor_sync(0xffffffffu, best, o);
      int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (ov > best || (ov == best && oi < bi)) { best = ov; bi = oi; }
    }
    if (lane == 0) out[blockIdx.x] = (bi == 0x7fffffff) ? 0 : bi;
  }
}

extern "C" {
#define RED_INST(sfx, T, F)                                                                              \
  __global__ void reduce_warp_##sfx(const T* a, T* out, const i64* meta, i64 nout, i64 R, i64 rs, int op) { \
    reduce_warp_body<T, F>(a, out, meta, nout, R, rs, op);                                               \
  }                                                                                                      \
  __global__ void reduce_block_##sfx(const T* a, T* out, const i64* meta, i64 nout, i64 R, i64 rs, int op) { \
    reduce_block_body<T, F>(a, out, meta, nout, R, rs, op);                                              \
  }
RED_INST(f32, float, float)
RED_INST(bf16, bf16_t, float)
RED_INST(i64, i64, double)

__global__ void argmax_f32(const float* x, i64* out, int n) { argmax_body<float>(x, out, n); }
__global__ void argmax_bf16(const bf16_t* x, i64* out, int n) { argmax_body<bf16_t>(x, out, n); }
}
