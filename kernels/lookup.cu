// lookup.cu: prompt lookup on the device, so that --draft-extend's looked-up drafts need no host round trip
// (minitorch/generation/cuda.py). The target decoder keeps the run's tokens so far (the prompt, then each
// round's emitted tokens) in ctx[0..*ctx_len); its last entry is the pending token. Launch layouts: one block
// each (below).
//
// ngram_lookup: grid (1), block (LOOKUP_THREADS). S = ctx[0..L) followed by the draft's gq tokens
//   ttok[1..1+gq) (L = *ctx_len, |S| = N = L + gq). For n = min(max_n, N - 1) down to 1: the latest start
//   s <= N - n - 1 with S[s..s+n) == S[N-n..N); the first n that has one gives the k drafts after it,
//   ttok[1+gq+i] = S[s+n+i], written in order i = 0..k-1 and read through S, so a continuation that reaches
//   S's end goes on copying from the drafts it has just written (an overlapping copy, as in LZ77). No match:
//   S's last token, k times (the same copy from s + n = N - 1). NGramDrafter's rule
//   (minitorch/generation/drafters.py) where it finds k tokens; it proposes fewer where this copies on:
//   a verify graph has a fixed number of rows, and any proposal is exact (a point mass to spec_accept).
//   The search walks back from S's end a block of starts at a time and stops at the first block with a
//   match (matches are mostly recent), so a step costs a few microseconds at thousands of tokens.
// ngram_select: grid (1), block (LOOKUP_THREADS). Prompt lookup first (--draft-lookup M, a head's greedy rounds):
//   the same search over S = ctx[0..L) alone, n = min(max_n, L - 1) down to min_n only; where an n-gram of at
//   least min_n tokens ending S occurred before, the k tokens after its latest occurrence replace the round's
//   drafts, ttok[1+i] = S[s+n+i] (copying on from what it wrote past S's end, as ngram_lookup does); where none
//   did, ttok is left as it was (the head's drafts, gathered before). lookup_select_reference in
//   tests/test_generation_cuda_host.py states the rule; tests/test_cuda_lookup.py holds this kernel to it.
// context_append: grid (1), block (128). After spec_accept wrote out = [n, d_1..d_n, next]:
//   ctx[*ctx_len + j] = out[1 + j] for j <= n (the round's emitted tokens), *ctx_len += n + 1, never past cap.
#include "common.cuh"

#define LOOKUP_THREADS 512

__device__ __forceinline__ i64 seq_at(const i64* ctx, int L, const i64* ttok, int i) {
  return i < L ? ctx[i] : ttok[1 + i - L];
}

// The latest match of S's last n tokens for the first n from min(max_n, N - 1) down to min_n that has one (S: the
// N = L + gq tokens seq_at reads): its s + n, where the copy starts; -1 when no n >= min_n has one. Every thread of
// the block calls it and gets the same answer; `best` is the block's shared scratch.
__device__ int latest_match(const i64* ctx, int L, const i64* ttok, int N, int max_n, int min_n, int* best) {
  const int tid = threadIdx.x;
  for (int n = min(max_n, N - 1); n >= min_n; --n) {
    if (tid == 0) *best = -1;
    __syncthreads();
    bool any = false;
    for (int top = N - n - 1; top >= 0 && !any; top -= LOOKUP_THREADS) {  // starts top, top - 1, ...
      int s = top - tid;
      bool hit = s >= 0 && s <= N - n - 1;
      for (int j = 0; j < n && hit; ++j) hit = seq_at(ctx, L, ttok, s + j) == seq_at(ctx, L, ttok, N - n + j);
      if (hit) atomicMax(best, s);  // the latest match
      any = __syncthreads_or(hit);
    }
    const int b = *best;
    __syncthreads();  // everyone has read best before the next n resets it
    if (any) return b + n;
  }
  return -1;
}

extern "C" {
__global__ void ngram_lookup(i64* ttok, const i64* ctx, const int* ctx_len, int gq, int k, int max_n) {
  pdl_wait();
  __shared__ int best;
  const int L = *ctx_len, N = L + gq;
  int src = latest_match(ctx, L, ttok, N, max_n, 1, &best);
  if (src < 0) src = N - 1;  // no match: copy S's last token forward
  if (threadIdx.x == 0)
    for (int i = 0; i < k; ++i) ttok[1 + gq + i] = seq_at(ctx, L, ttok, src + i);  // in order: overlapping copy
}

__global__ void ngram_select(i64* ttok, const i64* ctx, const int* ctx_len, int k, int max_n, int min_n) {
  pdl_wait();
  __shared__ int best;
  const int L = *ctx_len;
  const int src = latest_match(ctx, L, ttok, L, max_n, min_n, &best);
  if (src >= 0 && threadIdx.x == 0)
    for (int i = 0; i < k; ++i) ttok[1 + i] = seq_at(ctx, L, ttok, src + i);  // past ctx: the tokens just written
}

__global__ void context_append(i64* ctx, int* ctx_len, const i64* out, int cap) {
  pdl_wait();
  const int L = *ctx_len, n = (int)out[0];
  for (int j = threadIdx.x; j <= n; j += blockDim.x)
    if (L + j < cap) ctx[L + j] = out[1 + j];
  __syncthreads();  // every thread has read *ctx_len
  if (threadIdx.x == 0) *ctx_len = min(L + n + 1, cap);
}
}
