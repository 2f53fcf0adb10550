// tree.cu: a draft tree's round on the CUDA-graph path (minitorch/generation/cuda.py tree_speculative_generate_cuda,
// greedy). The tree's T rows follow the target's cache position in step order: row 0 is the pending token (the
// root), row r > 0 hangs under row parents[r] < r. The verify step (CudaDecoder.tree_step) gives every row the
// logits a decode step at its position gives it; these kernels build the rows, accept, and keep the accepted path.
// Launch layout (grid, block) and what each writes:
//
// topk_f32: grid (1), block (TOPK_THREADS). out[0..K) = the K largest of logits[0..V) (row 0), largest first, ties to
//   the lower index (argmax_final's rule, so out[0] is the argmax). K <= TOPK_MAX. The reference of the two below.
// topk_part_f32: grid (B), block (TOPK_THREADS). Block b: the K largest of logits[b * chunk .. min(V, (b + 1) * chunk))
//   by the same rule into pv / pi[b * K .. b * K + K) (values and indices; -inf / INT_MAX where the chunk has fewer).
// topk_merge_f32: grid (1), block (TOPK_THREADS). out[0..K) = the indices of the K best of the n candidates (pv, pi) by
//   the same rule: the K best of every chunk hold the K best of all, so out is topk_f32's. The draft head's top-k
//   lists of a tree round (generation/cuda.py HeadGpuDrafter._top_k), where topk_f32's one block read all 32,768 logits
//   a depth (a 16-row tree round on an H100 drafted 0.41 steps against a gamma-6 chain's 0.25). topk_f32 is now used
//   by its test only.
// tree_alternatives: grid (1), block (32). The tree's rows past the chain (rows 1..g, row d at depth d): row r hangs
//   under chain row parents[r] = d - 1, so it is an alternative at depth d; the rows of one depth follow each other and
//   take, in order, the best of that depth's top-k list (lists + (d - 1) * K, the draft's distribution for the chain's
//   token at depth d) that are not the chain's token there (tokens[d]).
// tree_positions: grid (1), block (32). tpos[r] = *pos + depth[r]: where each row sits (its rotation, the keys it
//   sees: attn_tree_partial_*).
// tree_accept: grid (1), block (1). The greedy walk: from the root, the child whose token is the row's argmax
//   (next[row]), as long as there is one. out = [n, the accepted tokens, the argmax of the last accepted row] (the
//   chain engine's spec_out), path = [n, rows of the accepted tokens] (increasing: a child's row follows its parent's).
// tree_keep: grid (2 * L + 1, Hkv), block (128). The accepted path's rows moved to the positions they now hold: in
//   each of the L layers' K and V caches (kv: 2L pointers to (Hkv, max_len, D) bf16) and in xn (the final normed
//   hidden states, (T, H) bf16: the draft head's next round reads rows 0..n), row path[i] -> row i for i = 1..n
//   (cache rows past *pos). Each thread moves its own columns in order of i; since path[i] >= i and the path
//   increases, no row is read after it was written.
// tree_advance: grid (1), block (1). *pos += n + 1 and tokens[0] = the next token (the next round's root).
#include "common.cuh"

#define TOPK_THREADS 256
#define TOPK_MAX 8

// Block-wide top K of n candidates (get(j, v, i): candidate j's value and index): each thread keeps its own best K (value
// desc, index asc), then K rounds of a block-wide pick; emit(r, v, i) by thread 0 for the r-th best.
template <typename Get, typename Emit>
__device__ __forceinline__ void block_topk(Get get, int n, int K, Emit emit) {
  float bv[TOPK_MAX];
  int bi[TOPK_MAX];
#pragma unroll
  for (int k = 0; k < TOPK_MAX; ++k) { bv[k] = -MT_INF; bi[k] = 0x7fffffff; }
  for (int j = threadIdx.x; j < n; j += TOPK_THREADS) {
    float v;
    int i;
    get(j, v, i);
    if (!(v > bv[K - 1] || (v == bv[K - 1] && i < bi[K - 1]))) continue;
    int k = K - 1;
    while (k > 0 && (v > bv[k - 1] || (v == bv[k - 1] && i < bi[k - 1]))) {
      bv[k] = bv[k - 1];
      bi[k] = bi[k - 1];
      --k;
    }
    bv[k] = v;
    bi[k] = i;
  }
  __shared__ float sv[TOPK_THREADS];
  __shared__ int si[TOPK_THREADS], st[TOPK_THREADS];
  int head = 0;  // this thread's next candidate
  for (int r = 0; r < K; ++r) {
    sv[threadIdx.x] = head < K ? bv[head] : -MT_INF;
    si[threadIdx.x] = head < K ? bi[head] : 0x7fffffff;
    st[threadIdx.x] = threadIdx.x;
    __syncthreads();
    for (int s = TOPK_THREADS / 2; s > 0; s >>= 1) {
      if (threadIdx.x < s) {
        const int a = threadIdx.x, b = a + s;
        if (sv[b] > sv[a] || (sv[b] == sv[a] && si[b] < si[a])) { sv[a] = sv[b]; si[a] = si[b]; st[a] = st[b]; }
      }
      __syncthreads();
    }
    if (threadIdx.x == 0) emit(r, sv[0], si[0]);
    if (threadIdx.x == st[0]) ++head;
    __syncthreads();
  }
}

extern "C" {

__global__ void __launch_bounds__(TOPK_THREADS) topk_f32(const float* logits, int V, int K, i64* out) {
  block_topk([&](int j, float& v, int& i) { v = logits[j]; i = j; }, V, K,
             [&](int r, float, int i) { out[r] = i; });
}

__global__ void __launch_bounds__(TOPK_THREADS) topk_part_f32(const float* logits, int V, int K, int chunk, float* pv,
                                                              int* pi) {
  const int first = blockIdx.x * chunk;
  const int n = max(0, min(V - first, chunk));
  float* bv = pv + (i64)blockIdx.x * K;
  int* bi = pi + (i64)blockIdx.x * K;
  block_topk([&](int j, float& v, int& i) { v = logits[first + j]; i = first + j; }, n, K,
             [&](int r, float v, int i) { bv[r] = v; bi[r] = i; });
}

__global__ void __launch_bounds__(TOPK_THREADS) topk_merge_f32(const float* pv, const int* pi, int n, int K, i64* out) {
  block_topk([&](int j, float& v, int& i) { v = pv[j]; i = pi[j]; }, n, K,
             [&](int r, float, int i) { out[r] = i; });
}

__global__ void tree_alternatives(i64* tokens, const i64* lists, int K, int g, const int* parents, int T) {
  if (threadIdx.x != 0) return;
  int d_prev = 0, k = 0;
  for (int r = g + 1; r < T; ++r) {
    const int d = parents[r] + 1;
    if (d != d_prev) { d_prev = d; k = 0; }
    const i64* list = lists + (i64)(d - 1) * K;
    while (k < K && list[k] == tokens[d]) ++k;
    tokens[r] = k < K ? list[k++] : tokens[d];  // a list without enough others: a copy of the chain's token
  }
}

__global__ void tree_positions(const int* pos, const int* depth, int* tpos, int T) {
  for (int r = threadIdx.x; r < T; r += blockDim.x) tpos[r] = *pos + depth[r];
}

__global__ void tree_accept(const i64* next, const i64* tokens, const int* parents, int T, int* path, i64* out) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  int cur = 0, n = 0;
  for (;;) {
    const i64 want = next[cur];
    int c = -1;
    for (int r = cur + 1; r < T; ++r)
      if (parents[r] == cur && tokens[r] == want) { c = r; break; }
    if (c < 0) break;
    ++n;
    path[n] = c;
    out[n] = want;
    cur = c;
  }
  path[0] = n;
  out[0] = n;
  out[n + 1] = next[cur];
}

__global__ void tree_keep(bf16_t* const* kv, int L2, const int* pos, const int* path, int Hkv, int max_len, int D,
                          bf16_t* xn, int H) {
  const int n = path[0];
  if ((int)blockIdx.x < L2) {
    bf16_t* c = kv[blockIdx.x] + ((i64)blockIdx.y * max_len + *pos) * D;
    for (int i = 1; i <= n; ++i) {
      const int src = path[i];
      if (src == i) continue;
      for (int d = threadIdx.x; d < D; d += blockDim.x) c[(i64)i * D + d] = c[(i64)src * D + d];
    }
  } else if (blockIdx.y == 0) {
    for (int i = 1; i <= n; ++i) {
      const int src = path[i];
      if (src == i) continue;
      for (int d = threadIdx.x; d < H; d += blockDim.x) xn[(i64)i * H + d] = xn[(i64)src * H + d];
    }
  }
}

__global__ void tree_advance(int* pos, i64* tokens, const i64* out) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  const int n = (int)out[0];
  *pos += n + 1;
  tokens[0] = out[n + 1];
}

}  // extern "C"
