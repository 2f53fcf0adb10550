// elementwise.cu: map (unary), zip (binary, broadcasting), where, fill and dtype casts over strided tensors.
//
// Launch layout: 1-D grid-stride loop, 256 threads a block, grid = min(ceil(n/256), 65535*8).
// Shapes: any rank <= MAX_DIMS (8); strides in elements; `meta` is a device int64 array
//   map/cast: [nd, shape[nd], out_strides[nd], a_strides[nd]]
//   zip:      [nd, shape[nd], out_strides[nd], a_strides[nd], b_strides[nd]]
//   where:    [nd, shape[nd], out_strides[nd], c_strides[nd], a_strides[nd], b_strides[nd]]
// with broadcast dims given stride 0 by the host. The *_contig variants need every operand
// contiguous and of the output's shape (no meta). Limits: n < 2^62; in-place (out aliasing an
// input at the same positions) is allowed, overlapping shifted views are not.
// dtypes: f32, bf16 (uint16 bits) and i64 storage; arithmetic in fp32 (i64 in double).
#include "common.cuh"

// Unary op codes (keep in sync with minitorch/cuda/launch.py MAP_OPS).
__device__ __forceinline__ float map_op(int op, float x) {
  switch (op) {
    case 0: return x;                                   // id
    case 1: return -x;                                  // neg
    case 2: return 1.f / x;                             // inv
    case 3: return expf(x);                             // exp
    case 4: return logf(x);                             // log
    case 5: return sqrtf(x);                            // sqrt
    case 6: return rsqrtf(x);                           // rsqrt
    case 7: return x >= 0.f ? 1.f / (1.f + expf(-x)) : expf(x) / (1.f + expf(x));  // sigmoid
    case 8: return x > 0.f ? x : 0.f;                   // relu
    case 9: return x / (1.f + expf(-x));                // silu
    case 10: return tanhf(x);                           // tanh
    case 11: return fabsf(x);                           // abs
    case 12: return x * x;                              // square
    default: return __int_as_float(0x7fc00000);         // unknown op -> NaN
  }
}
__device__ __forceinline__ double map_op_d(int op, double x) {
  switch (op) {
    case 0: return x;
    case 1: return -x;
    case 11: return fabs(x);
    case 12: return x * x;
    default: return (double)map_op(op, (float)x);
  }
}

// Binary op codes (keep in sync with minitorch/cuda/launch.py ZIP_OPS).
template <typename F> __device__ __forceinline__ F zip_op(int op, F a, F b) {
  switch (op) {
    case 0: return a + b;                               // add
    case 1: return a - b;                               // sub
    case 2: return a * b;                               // mul
    case 3: return a / b;                               // div
    case 4: return (F)pow((double)a, (double)b);        // pow
    case 5: return a < b ? (F)1 : (F)0;                 // lt
    case 6: return a > b ? (F)1 : (F)0;                 // gt
    case 7: return a == b ? (F)1 : (F)0;                // eq
    case 8: return a > b ? a : b;                       // max
    case 9: return a < b ? a : b;                       // min
    case 10: return a > (F)0 ? b : (F)0;                // relu_back(x, grad)
    case 11: return b / a;                              // log_back(x, grad)
    case 12: return -b / (a * a);                       // inv_back(x, grad)
    case 13: return a != b ? (F)1 : (F)0;               // ne
    default: return (F)0;
  }
}
template <> __device__ __forceinline__ float zip_op<float>(int op, float a, float b) {
  if (op == 4) return powf(a, b);
  switch (op) {
    case 0: return a + b;
    case 1: return a - b;
    case 2: return a * b;
    case 3: return a / b;
    case 5: return a < b ? 1.f : 0.f;
    case 6: return a > b ? 1.f : 0.f;
    case 7: return a == b ? 1.f : 0.f;
    case 8: return fmaxf(a, b);
    case 9: return fminf(a, b);
    case 10: return a > 0.f ? b : 0.f;
    case 11: return b / a;
    case 12: return -b / (a * a);
    case 13: return a != b ? 1.f : 0.f;
    default: return __int_as_float(0x7fc00000);
  }
}

__device__ __forceinline__ double ld_d(const i64* p, i64 i) { return (double)p[i]; }
__device__ __forceinline__ double ld_d(const float* p, i64 i) { return (double)p[i]; }
__device__ __forceinline__ double ld_d(const bf16_t* p, i64 i) { return (double)to_f(p[i]); }
__device__ __forceinline__ void st_d(i64* p, i64 i, double v) { p[i] = (i64)v; }
__device__ __forceinline__ void st_d(float* p, i64 i, double v) { p[i] = (float)v; }
__device__ __forceinline__ void st_d(bf16_t* p, i64 i, double v) { p[i] = from_f<bf16_t>((float)v); }

#define GRID_LOOP(i, n) \
  for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (i64)gridDim.x * blockDim.x)

template <typename T>
__device__ void map_body(const T* a, T* out, const i64* meta, i64 n, int op) {
  int nd = (int)meta[0];
  const i64* shape = meta + 1;
  GRID_LOOP(i, n) {
    i64 oo = strided_offset(i, nd, shape, shape + nd);
    i64 ao = strided_offset(i, nd, shape, shape + 2 * nd);
    st_d(out, oo, map_op_d(op, ld_d(a, ao)));
  }
}
template <typename T>
__device__ void map_contig_body(const T* a, T* out, i64 n, int op) {
  GRID_LOOP(i, n) st_d(out, i, map_op_d(op, ld_d(a, i)));
}
// fp32/bf16 specialisations compute in float (double only for i64).
template <>
__device__ void map_body<float>(const float* a, float* out, const i64* meta, i64 n, int op) {
  int nd = (int)meta[0];
  const i64* shape = meta + 1;
  GRID_LOOP(i, n) {
    out[strided_offset(i, nd, shape, shape + nd)] = map_op(op, a[strided_offset(i, nd, shape, shape + 2 * nd)]);
  }
}
template <>
__device__ void map_body<bf16_t>(const bf16_t* a, bf16_t* out, const i64* meta, i64 n, int op) {
  int nd = (int)meta[0];
  const i64* shape = meta + 1;
  GRID_LOOP(i, n) {
    out[strided_offset(i, nd, shape, shape + nd)] =
        from_f<bf16_t>(map_op(op, to_f(a[strided_offset(i, nd, shape, shape + 2 * nd)])));
  }
}
template <>
__device__ void map_contig_body<float>(const float* a, float* out, i64 n, int op) {
  GRID_LOOP(i, n) out[i] = map_op(op, a[i]);
}
template <>
__device__ void map_contig_body<bf16_t>(const bf16_t* a, bf16_t* out, i64 n, int op) {
  GRID_LOOP(i, n) out[i] = from_f<bf16_t>(map_op(op, to_f(a[i])));
}

template <typename T, typename TO>
__device__ void zip_body(const T* a, const T* b, TO* out, const i64* meta, i64 n, int op) {
  int nd = (int)meta[0];
  const i64* shape = meta + 1;
  GRID_LOOP(i, n) {
    i64 oo = strided_offset(i, nd, shape, shape + nd);
    i64 ao = strided_offset(i, nd, shape, shape + 2 * nd);
    i64 bo = strided_offset(i, nd, shape, shape + 3 * nd);
    st_d(out, oo, zip_op<double>(op, ld_d(a, ao), ld_d(b, bo)));
  }
}
template <typename T, typename TO>
__device__ void zip_f_body(const T* a, const T* b, TO* out, const i64* meta, i64 n, int op) {
  int nd = (int)meta[0];
  const i64* shape = meta + 1;
  GRID_LOOP(i, n) {
    i64 oo = strided_offset(i, nd, shape, shape + nd);
    i64 ao = strided_offset(i, nd, shape, shape + 2 * nd);
    i64 bo = strided_offset(i, nd, shape, shape + 3 * nd);
    out[oo] = from_f<TO>(zip_op<float>(op, to_f(a[ao]), to_f(b[bo])));
  }
}
template <typename T, typename TO>
__device__ void zip_f_contig_body(const T* a, const T* b, TO* out, i64 n, int op) {
  GRID_LOOP(i, n) out[i] = from_f<TO>(zip_op<float>(op, to_f(a[i]), to_f(b[i])));
}

template <typename TI, typename TO>
__device__ void cast_body(const TI* a, TO* out, const i64* meta, i64 n) {
  int nd = (int)meta[0];
  const i64* shape = meta + 1;
  GRID_LOOP(i, n) {
    st_d(out, strided_offset(i, nd, shape, shape + nd), ld_d(a, strided_offset(i, nd, shape, shape + 2 * nd)));
  }
}

extern "C" {
#define MAP_INST(sfx, T)                                                                          \
  __global__ void map_##sfx(const T* a, T* out, const i64* meta, i64 n, int op) {                 \
    map_body<T>(a, out, meta, n, op);                                                             \
  }                                                                                               \
  __global__ void map_contig_##sfx(const T* a, T* out, i64 n, int op) { map_contig_body<T>(a, out, n, op); }
MAP_INST(f32, float)
MAP_INST(bf16, bf16_t)
MAP_INST(i64, i64)

#define ZIPF_INST(sfx, T, TO)                                                                     \
  __global__ void zip_##sfx(const T* a, const T* b, TO* out, const i64* meta, i64 n, int op) {    \
    zip_f_body<T, TO>(a, b, out, meta, n, op);                                                    \
  }                                                                                               \
  __global__ void zip_contig_##sfx(const T* a, const T* b, TO* out, i64 n, int op) {              \
    zip_f_contig_body<T, TO>(a, b, out, n, op);                                                   \
  }
ZIPF_INST(f32, float, float)
ZIPF_INST(bf16, bf16_t, bf16_t)
ZIPF_INST(bf16_f32, bf16_t, float)

__global__ void zip_i64(const i64* a, const i64* b, i64* out, const i64* meta, i64 n, int op) {
  zip_body<i64, i64>(a, b, out, meta, n, op);
}
__global__ void zip_i64_f32(const i64* a, const i64* b, float* out, const i64* meta, i64 n, int op) {
  zip_body<i64, float>(a, b, out, meta, n, op);
}

#define CAST_INST(sfx, TI, TO)                                                                    \
  __global__ void cast_##sfx(const TI* a, TO* out, const i64* meta, i64 n) { cast_body<TI, TO>(a, out, meta, n); }
CAST_INST(f32_f32, float, float)
CAST_INST(f32_bf16, float, bf16_t)
CAST_INST(f32_i64, float, i64)
CAST_INST(bf16_f32, bf16_t, float)
CAST_INST(bf16_bf16, bf16_t, bf16_t)
CAST_INST(bf16_i64, bf16_t, i64)
CAST_INST(i64_f32, i64, float)
CAST_INST(i64_bf16, i64, bf16_t)
CAST_INST(i64_i64, i64, i64)

// where: out = c != 0 ? a : b; c float32; meta [nd, shape, out_strides, c_strides, a_strides, b_strides].
#define WHERE_INST(sfx, T)                                                                        \
  __global__ void where_##sfx(const float* c, const T* a, const T* b, T* out, const i64* meta, i64 n) { \
    int nd = (int)meta[0];                                                                        \
    const i64* shape = meta + 1;                                                                  \
    GRID_LOOP(i, n) {                                                                             \
      bool take_a = c[strided_offset(i, nd, shape, shape + 2 * nd)] != 0.f;                        \
      out[strided_offset(i, nd, shape, shape + nd)] =                                             \
          take_a ? a[strided_offset(i, nd, shape, shape + 3 * nd)] : b[strided_offset(i, nd, shape, shape + 4 * nd)]; \
    }                                                                                             \
  }
WHERE_INST(f32, float)
WHERE_INST(bf16, bf16_t)
WHERE_INST(i64, i64)

// fill: out[i] = value for a contiguous buffer.
__global__ void fill_f32(float* out, i64 n, float v) { GRID_LOOP(i, n) out[i] = v; }
__global__ void fill_bf16(bf16_t* out, i64 n, float v) { bf16_t b = from_f<bf16_t>(v); GRID_LOOP(i, n) out[i] = b; }
__global__ void fill_i64(i64* out, i64 n, i64 v) { GRID_LOOP(i, n) out[i] = v; }
}
