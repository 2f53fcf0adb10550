// decode.cu: device-side bookkeeping between graph-captured decode steps (no host round trip).
//
// decode_advance: one thread. After a step over T tokens whose greedy next ids are next_ids[0..T):
//   history[*pos + T] = next_ids[T-1] (when history is non-null and the index < hist_len),
//   tokens[0] = next_ids[T-1] (the next step's input), *pos += T, and when rng is not null
//   rng[1] += ndraw (the sampler's counter, kernels/sampling.cu: the step drew ndraw uniforms).
// set_pos: *pos = value (a kernel, so it can sit inside a captured graph or a stream).
// Launch: grid (1), block (1).
// batch_advance: the batched step's (minitorch/cuda/batch.py) per sequence: for each slot b < B with active[b],
//   tokens[b] = next_ids[b] (the next step's input), pos[b] += 1, rng[2b + 1] += 1 (its sampler's counter: one
//   uniform a token, as decode_advance counts for a one-sequence decode). Launch: grid (ceil(B / 128)), block 128.
#include "common.cuh"

extern "C" {
__global__ void decode_advance(int* pos, i64* tokens, const i64* next_ids, i64* history, int T, int hist_len,
                               unsigned long long* rng, int ndraw) {
  pdl_wait();
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  int p = *pos + T;
  i64 nxt = next_ids[T - 1];
  if (history && p < hist_len) history[p] = nxt;
  tokens[0] = nxt;
  *pos = p;
  if (rng) rng[1] += (unsigned long long)ndraw;
}
__global__ void batch_advance(int* pos, i64* tokens, const i64* next_ids, const int* active, int B,
                              unsigned long long* rng) {
  pdl_wait();
  const int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= B || !active[b]) return;
  tokens[b] = next_ids[b];
  pos[b] += 1;
  rng[2 * b + 1] += 1ull;
}
__global__ void set_pos(int* pos, int value) {
  if (threadIdx.x == 0 && blockIdx.x == 0) *pos = value;
}
}
