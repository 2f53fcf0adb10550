// common.cuh: shared helpers for every kernels/*.cu file.
//
// Storage types: float (fp32) and bf16 held as raw uint16 bits (CuPy has no bfloat16 dtype).
// bf16 is converted by bit manipulation (round to nearest even), so no cuda_bf16.h is needed and
// the same sources compile under nvcc and NVRTC. All arithmetic is done in fp32.
#pragma once

typedef unsigned short bf16_t;
typedef long long i64;

#define MAX_DIMS 8
#define MT_INF __int_as_float(0x7f800000)

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(bf16_t x) { return __uint_as_float(((unsigned int)x) << 16); }

// Eight bf16 values (one 16-byte load) -> eight floats.
__device__ __forceinline__ void bf16x8_to_f32(const uint4& v, float* f) {
  const unsigned int w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = __uint_as_float(w[i] << 16);
    f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
}

template <typename T> __device__ __forceinline__ T from_f(float x);
template <> __device__ __forceinline__ float from_f<float>(float x) { return x; }
template <> __device__ __forceinline__ bf16_t from_f<bf16_t>(float x) {
  unsigned int u = __float_as_uint(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (bf16_t)((u >> 16) | 0x40u);  // NaN stays NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return (bf16_t)(u >> 16);
}

// Programmatic dependent launch (sm_90+). A kernel launched with the PDL attribute may start while
// its predecessor in the stream is still running: pdl_wait() blocks until the predecessor grid has
// completed and its writes are visible, so it must come before any read or write of data another
// kernel produces or consumes. pdl_trigger() lets the successor launch early (it then waits in its own
// pdl_wait). Both are no-ops on older GPUs and for kernels launched without the attribute.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Block-wide reductions; `buf` needs 32 floats of shared memory; every thread gets the result.
__device__ __forceinline__ float block_sum(float v, float* buf) {
  int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) buf[wid] = v;
  __syncthreads();
  v = (lane < nw) ? buf[lane] : 0.f;
  return warp_sum(v);
}
__device__ __forceinline__ float block_max(float v, float* buf) {
  int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) buf[wid] = v;
  __syncthreads();
  v = (lane < nw) ? buf[lane] : -MT_INF;
  return warp_max(v);
}

// Thread-block clusters (sm_90): the blocks of one cluster read each other's shared memory. Before
// sm_90 (or launched without clusters) a block is a cluster of one: rank 0 of size 1.
__device__ __forceinline__ void cluster_sync() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
#else
  __syncthreads();
#endif
}
__device__ __forceinline__ float ld_cluster(const float* p, int rank) {  // *p in block `rank`'s shared memory
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  float v;
  unsigned int local = (unsigned int)__cvta_generic_to_shared(p), remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(rank));
  asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(remote));
  return v;
#else
  return *p;
#endif
}
__device__ __forceinline__ unsigned cluster_rank() {
  unsigned r = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
#endif
  return r;
}
__device__ __forceinline__ unsigned cluster_size() {
  unsigned n = 1;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(n));
#endif
  return n;
}

// Strided index: position `i` in a row-major walk of `shape` -> element offset under `strides`.
__device__ __forceinline__ i64 strided_offset(i64 i, int nd, const i64* shape, const i64* strides) {
  i64 off = 0;
  for (int d = nd - 1; d >= 0; --d) {
    i64 s = shape[d];
    i64 c = i % s;
    i /= s;
    off += c * strides[d];
  }
  return off;
}
