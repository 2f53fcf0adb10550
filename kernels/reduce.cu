// reduce.cu: reductions along one dim (sum, prod, max, min) over strided tensors, and row argmax.
//
// Launch layout. reduce_warp_*: one warp per output element, 8 warps (256 threads) a block, grid-stride over
//   outputs; best for many outputs. reduce_block_*: one block (256 threads) per output element;
//   best for few outputs over long dims. meta (device int64):
//   [nd, out_shape[nd] (reduced dim = 1), out_strides[nd], a_strides[nd]]; the reduced dim has
//   length R and input stride `rstride`. Accumulation in fp32 (double for i64).
// argmax_partial_* + argmax_final: argmax over the last dim of a contiguous (rows, n) matrix, any
//   n < 2^31, in two launches: grid (nchunks, rows) x 256 threads, each block scanning `chunk`
//   elements into a workspace (rows x nchunks values and indices), then grid (rows) x 256 threads
//   merging them. out is int64 (rows,); NaN wins (as numpy/torch), ties go to the lowest index.
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

// argmax order: NaN beats every number (numpy / torch), equal values go to the lowest index.
__device__ __forceinline__ bool am_better(float v, int i, float bv, int bi) {
  bool vn = v != v, bn = bv != bv;
  if (vn != bn) return vn;
  if (!vn && v != bv) return v > bv;
  return i < bi;
}
__device__ __forceinline__ void am_warp(float& bv, int& bi) {
  for (int o = 16; o > 0; o >>= 1) {
    float ov = __shfl_xor_sync(0xffffffffu, bv, o);
    int oi = __shfl_xor_sync(0xffffffffu, bi, o);
    if (am_better(ov, oi, bv, bi)) { bv = ov; bi = oi; }
  }
}
// Block-wide (value, index) arg-reduction; result valid in thread 0.
__device__ __forceinline__ void am_block(float& bv, int& bi) {
  __shared__ float sv[32];
  __shared__ int si[32];
  int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  am_warp(bv, bi);
  if (lane == 0) { sv[wid] = bv; si[wid] = bi; }
  __syncthreads();
  if (wid == 0) {
    bv = lane < nw ? sv[lane] : -MT_INF;
    bi = lane < nw ? si[lane] : 0x7fffffff;
    am_warp(bv, bi);
  }
}

// Phase 1: grid (nchunks, rows); block b of row r scans [b*chunk, min((b+1)*chunk, n)).
template <typename T>
__device__ void argmax_partial_body(const T* x, float* ws_v, int* ws_i, int n, int chunk) {
  const T* row = x + (i64)blockIdx.y * n;
  int lo = blockIdx.x * chunk, hi = min(lo + chunk, n);
  float bv = -MT_INF;
  int bi = 0x7fffffff;
  for (int k = lo + threadIdx.x; k < hi; k += blockDim.x) {
    float v = to_f(row[k]);
    if (am_better(v, k, bv, bi)) { bv = v; bi = k; }
  }
  am_block(bv, bi);
  if (threadIdx.x == 0) {
    ws_v[blockIdx.y * gridDim.x + blockIdx.x] = bv;
    ws_i[blockIdx.y * gridDim.x + blockIdx.x] = bi;
  }
}

extern "C" {
// Phase 2: grid (rows), 32..1024 threads: merge the nchunks partial results of each row.
__global__ void argmax_final(const float* ws_v, const int* ws_i, i64* out, int nchunks) {
  pdl_wait();
  float bv = -MT_INF;
  int bi = 0x7fffffff;
  for (int c = threadIdx.x; c < nchunks; c += blockDim.x) {
    float v = ws_v[blockIdx.x * nchunks + c];
    int i = ws_i[blockIdx.x * nchunks + c];
    if (am_better(v, i, bv, bi)) { bv = v; bi = i; }
  }
  am_block(bv, bi);
  if (threadIdx.x == 0) out[blockIdx.x] = (bi == 0x7fffffff) ? 0 : bi;
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

__global__ void argmax_partial_f32(const float* x, float* wv, int* wi, int n, int chunk) {
  pdl_wait();
  argmax_partial_body<float>(x, wv, wi, n, chunk);
}
__global__ void argmax_partial_bf16(const bf16_t* x, float* wv, int* wi, int n, int chunk) {
  argmax_partial_body<bf16_t>(x, wv, wi, n, chunk);
}
}
