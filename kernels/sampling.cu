// sampling.cu: sampling and the speculative acceptance test on the device, so that a CUDA-graph decode
// or verify step ends in token ids (the host reads back ids, never logits).
//
// Rules (the same as minitorch/generation/sampling.py and speculative.py): logits / temperature, then
// top-k (the k largest logits, ties at the k-th value kept), softmax, then top-p (the smallest set of
// most likely tokens whose mass reaches top_p, at least one; among equal probabilities the lower token
// id first), renormalised. Differences from the float64 CPU reference: float32 arithmetic, and the
// top-p mass is compared with top_p - 1e-6 (CPU: 1e-12) to absorb float32 summation error.
//
// Launch layouts. A row of V values is worked on by one cluster of C blocks of SAMPLE_THREADS threads
// (sm_90: C up to 16, launched as thread-block clusters; otherwise C = 1): block `rank` owns the slice
// [rank * S, (rank + 1) * S), S = ceil(V / C); every total is summed block by block in rank order
// through distributed shared memory, so every block gets the same bits, on every launch.
// sample_f32: grid (C, rows), block (SAMPLE_THREADS), clusters (C, 1, 1). Row r of logits (row stride
//   ld) -> its filtered probabilities, written to probs row slot(r) = (pos ? *pos + r0 + r : r) % Q (a
//   ring of Q rows, so a draft's probabilities stay readable by the acceptance test of its round). When
//   out_ids is not null it also draws one token per row by inverse CDF with u = uniform(rng[0],
//   rng[1] + r) into out_ids[r]; the counter rng[1] is advanced by whoever runs next (decode_advance).
// spec_accept: grid (C), block (SAMPLE_THREADS), clusters (C, 1, 1): one cluster. One speculative round
//   over target rows 0..g (the step's input was [pending, d_1..d_g]):
//     greedy (p == null):  accept while d_i == argmax[i-1]; next = argmax[n]
//     sampled:             accept d_i with probability min(1, p_i(d_i) / q_i(d_i)) (u * q < p); at the
//                          first rejection next ~ norm(max(p_i - q_i, 0)) (p_i if that has no mass);
//                          after g acceptances next ~ p_g (bonus). q == null: point-mass drafts (q = 1 at d_i).
//   The first gq drafts are the draft decoder's (gq = g, or fewer when the host appended looked-up tokens
//   d_gq+1..d_g, which are point masses); their q rows live in its ring at slot (*dpos - gq + i) % Q (the
//   draft ran gq steps); they hold qV <= V entries (a draft that proposes among the first qV tokens only):
//   q = 0 beyond. Writes out = [n, d_1..d_n, next] and sets up the next round without the host: target
//   *tpos += n + 1 and ttok[0] = next; for a draft decoder (dpos != null) *dpos = p0 + n + 1, dtok[0] =
//   next, or when its gq drafts were accepted *dpos = p0 + gq, dtok = [d_gq, d_gq+1..d_n, next] (its next
//   step feeds n - gq + 2 tokens; d_0 = the pending token when gq = 0). rng[1] += g + 1.
// gather_drafts: grid (1), block (128). ttok[1 + j] = history[*dpos - g + 1 + j] for j < g: the draft's
//   g newest tokens become the verify step's input after the pending token.
// rng: uniform(seed, counter) = splitmix64 finaliser of (mix(seed) + counter * golden ratio), top 24
//   bits -> [0, 1). Counter-based: the same seed and counter give the same number on any launch layout.
// Limits: V < 2^24 (float counts and indices are exact), g < 128.
#include "common.cuh"

typedef unsigned long long u64;
#define SAMPLE_THREADS 512
#define NWARP (SAMPLE_THREADS / 32)

__device__ __forceinline__ u64 mix64(u64 z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
__device__ __forceinline__ float uniform01(u64 seed, u64 counter) {
  u64 z = mix64(mix64(seed) + counter * 0x9E3779B97F4A7C15ull);
  return (float)(z >> 40) * (1.0f / 16777216.0f);
}

// Orderable 32-bit key of a float: a < b  <=>  key(a) < key(b) (for non-NaN values).
__device__ __forceinline__ unsigned okey(float x) {
  unsigned u = __float_as_uint(x);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Shared memory of one block: reduction scratch, the values it shows the cluster, the cluster's answers.
struct Scratch {
  float red[16 * NWARP];  // per-warp partial sums (up to 16 values a warp)
  float mine[16];         // this block's totals, read by the other blocks of the cluster
  float all[16];          // the cluster's totals
  float wsum[NWARP];      // per-warp sums of an index-ordered walk
};

// The cluster-wide sums of n <= 16 per-thread values v[0..n) (each block's threads sum their own
// elements first); every thread of every block gets all[0..n) with the same bits.
template <int N>
__device__ void cluster_sums(float (&v)[N], Scratch& s) {
  int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
#pragma unroll
  for (int j = 0; j < N; ++j) {
    float w = warp_sum(v[j]);
    if (lane == 0) s.red[j * NWARP + wid] = w;
  }
  __syncthreads();
  if (threadIdx.x < N) {
    float t = 0.f;
    for (int k = 0; k < NWARP; ++k) t += s.red[threadIdx.x * NWARP + k];
    s.mine[threadIdx.x] = t;
  }
  cluster_sync();  // every block's totals are visible
  if (threadIdx.x < N) {
    float t = 0.f;
    for (unsigned r = 0; r < cluster_size(); ++r) t += ld_cluster(&s.mine[threadIdx.x], (int)r);
    s.all[threadIdx.x] = t;
  }
  cluster_sync();  // all[] is complete, and no block rewrites mine[] before everyone has read it
#pragma unroll
  for (int j = 0; j < N; ++j) v[j] = s.all[j];
}
__device__ float cluster_sum(float v, Scratch& s) {
  float a[1] = {v};
  cluster_sums<1>(a, s);
  return a[0];
}
__device__ float cluster_max(float v, Scratch& s) {
  v = block_max(v, s.red);
  if (threadIdx.x == 0) s.mine[0] = v;
  cluster_sync();
  if (threadIdx.x == 0) {
    float m = -MT_INF;
    for (unsigned r = 0; r < cluster_size(); ++r) m = fmaxf(m, ld_cluster(&s.mine[0], (int)r));
    s.all[0] = m;
  }
  cluster_sync();
  return s.all[0];
}

// The largest key t with  sum of w(i) over keys(i) >= t  >= target, for kw(i, key, w) over the row
// ([lo, hi) in this block). Four bits a pass (15 candidate thresholds summed at once), 8 passes.
template <class KW>
__device__ unsigned find_threshold(KW kw, int lo, int hi, float target, Scratch& s) {
  unsigned prefix = 0;
  for (int shift = 28; shift >= 0; shift -= 4) {
    unsigned high = shift == 28 ? 0u : ~0u << (shift + 4);  // bits above this digit, fixed by the prefix
    float c[15];
#pragma unroll
    for (int j = 0; j < 15; ++j) c[j] = 0.f;
    for (int i = lo + threadIdx.x; i < hi; i += blockDim.x) {
      unsigned key;
      float w;
      kw(i, key, w);
      if (key < prefix) continue;
      unsigned d = (key & high) != prefix ? 15u : (key >> shift) & 15u;  // above the prefix: every digit
#pragma unroll
      for (int j = 0; j < 15; ++j) c[j] += (unsigned)(j + 1) <= d ? w : 0.f;
    }
    cluster_sums<15>(c, s);
    unsigned digit = 0;
    for (int j = 15; j >= 1; --j)
      if (c[j - 1] >= target) { digit = (unsigned)j; break; }
    prefix |= digit << shift;
  }
  return prefix;
}

// This block's slice [lo, hi) of a row of V values: block `rank` of the cluster owns S = ceil(V / C).
__device__ __forceinline__ void row_slice(int V, int& lo, int& hi) {
  int C = (int)cluster_size(), S = (V + C - 1) / C;
  lo = min(V, (int)cluster_rank() * S);
  hi = min(V, lo + S);
}

// Index-ordered walks: block rank owns [lo, hi); in it warp w owns span elements from lo + w * span,
// 32 consecutive elements a step (coalesced).
__device__ __forceinline__ int warp_span(int lo, int hi) { return 32 * ((hi - lo + 32 * NWARP - 1) / (32 * NWARP)); }

// Inverse CDF over the whole row: the first index i (blocks in rank order, then warps, then lanes) where
// the running sum of w exceeds u * total. Only an index with w > 0 is returned; every thread gets it.
template <class W>
__device__ int pick_index(W w, int lo, int hi, float u, Scratch& s) {
  int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, span = warp_span(lo, hi);
  int wlo = min(hi, lo + wid * span), whi = min(hi, wlo + span);
  float t = 0.f;
  for (int i = wlo + lane; i < whi; i += 32) t += w(i);
  t = warp_sum(t);
  if (lane == 0) s.wsum[wid] = t;
  __syncthreads();
  float mine = 0.f;  // this block's mass: its warps in order
  for (int k = 0; k < NWARP; ++k) mine += s.wsum[k];
  if (threadIdx.x == 0) s.mine[0] = mine;
  cluster_sync();
  // every block computes the same choice: which block, then (in that block) which warp
  int C = (int)cluster_size(), rank = (int)cluster_rank();
  float total = 0.f;
  for (int r = 0; r < C; ++r) total += ld_cluster(&s.mine[0], r);
  float target = u * total, cum = 0.f;
  int cb = -1, lastb = 0;
  for (int r = 0; r < C; ++r) {
    float m = ld_cluster(&s.mine[0], r);
    if (m > 0.f) lastb = r;
    if (cb < 0 && m > 0.f && cum + m > target) cb = r;
    if (cb < 0) cum += m;
  }
  if (cb < 0) { cb = lastb; cum = target - ld_cluster(&s.mine[0], lastb); }  // rounding: the last block with mass
  if (rank == cb) {
    float rem = target - cum;
    int cw = -1, lastw = 0;
    float wc = 0.f;
    for (int k = 0; k < NWARP; ++k) {
      if (s.wsum[k] > 0.f) lastw = k;
      if (cw < 0 && s.wsum[k] > 0.f && wc + s.wsum[k] > rem) cw = k;
      if (cw < 0) wc += s.wsum[k];
    }
    if (cw < 0) { cw = lastw; wc = rem - s.wsum[lastw]; }
    if (wid == cw) {
      float base = 0.f, left = rem - wc;
      int last_pos = -1, hit_at = -1;
      for (int i0 = wlo; i0 < whi && hit_at < 0; i0 += 32) {
        int i = i0 + lane;
        float v = i < whi ? w(i) : 0.f;
        float inc = v;  // inclusive scan over the 32 lanes
        for (int o = 1; o < 32; o <<= 1) {
          float x = __shfl_up_sync(0xffffffffu, inc, o);
          if (lane >= o) inc += x;
        }
        unsigned hit = __ballot_sync(0xffffffffu, v > 0.f && base + inc > left);
        unsigned pos = __ballot_sync(0xffffffffu, v > 0.f);
        if (pos) last_pos = i0 + 31 - __clz(pos);
        if (hit) hit_at = i0 + __ffs(hit) - 1;
        base += __shfl_sync(0xffffffffu, inc, 31);
      }
      if (lane == 0) s.mine[1] = (float)(hit_at >= 0 ? hit_at : last_pos);  // (rounding at the range's end)
    }
  }
  cluster_sync();
  int found = (int)ld_cluster(&s.mine[1], cb);  // every block reads the chosen block's answer
  cluster_sync();
  return found;
}

// Filtered probabilities of one row of logits x (V) into p (V): temperature, top-k, softmax, top-p.
__device__ void row_probs(const float* x, float* p, int V, float inv_temp, int top_k, float top_p, Scratch& s) {
  int lo, hi, rank = (int)cluster_rank();
  row_slice(V, lo, hi);
  unsigned kth = 0;  // logits with key < kth are dropped (top-k)
  if (top_k > 0 && top_k < V)
    kth = find_threshold([&](int i, unsigned& key, float& w) { key = okey(x[i]); w = 1.f; }, lo, hi, (float)top_k, s);
  float m = -MT_INF;
  for (int i = lo + threadIdx.x; i < hi; i += blockDim.x)
    if (okey(x[i]) >= kth) m = fmaxf(m, x[i]);
  m = cluster_max(m, s);
  float z = 0.f;
  for (int i = lo + threadIdx.x; i < hi; i += blockDim.x) {
    float e = okey(x[i]) >= kth ? __expf((x[i] - m) * inv_temp) : 0.f;
    p[i] = e;
    z += e;
  }
  float inv = 1.f / cluster_sum(z, s);
  for (int i = lo + threadIdx.x; i < hi; i += blockDim.x) p[i] *= inv;
  if (!(top_p < 1.f)) {
    cluster_sync();  // p is complete across the cluster before anyone samples from it
    return;
  }
  __syncthreads();
  // top-p: t = the smallest kept probability; every p > t is kept, and of the ties at t the lowest ids
  float target = top_p - 1e-6f;
  unsigned t = find_threshold([&](int i, unsigned& key, float& w) { w = p[i]; key = __float_as_uint(w); }, lo, hi,
                              target, s);
  float tv = __uint_as_float(t);
  int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, span = warp_span(lo, hi);
  int wlo = min(hi, lo + wid * span), whi = min(hi, wlo + span);
  float v2[2] = {0.f, 0.f};  // mass above t, ties at t (this thread's part of its warp's range)
  for (int i = wlo + lane; i < whi; i += 32) {
    v2[0] += p[i] > tv ? p[i] : 0.f;
    v2[1] += p[i] == tv ? 1.f : 0.f;
  }
  float ties_w = warp_sum(v2[1]);  // this warp's ties
  if (lane == 0) s.wsum[wid] = ties_w;
  __syncthreads();
  float before = 0.f;  // ties in this block's earlier warps, then in the earlier blocks
  for (int k = 0; k < wid; ++k) before += s.wsum[k];
  float block_ties = 0.f;
  for (int k = 0; k < NWARP; ++k) block_ties += s.wsum[k];
  if (threadIdx.x == 0) s.mine[2] = block_ties;
  cluster_sync();
  for (int r = 0; r < rank; ++r) before += ld_cluster(&s.mine[2], r);
  cluster_sync();
  cluster_sums<2>(v2, s);  // v2 = [mass above t, all ties]
  // ties to keep: enough of them to reach the target (at least one), in token-id order
  int need = tv > 0.f ? max(1, (int)ceilf((target - v2[0]) / tv)) : 0;
  need = min(need, (int)v2[1]);
  float scale = 1.f / (v2[0] + (float)need * tv);  // renormalise to the kept mass
  int seen = (int)before;
  for (int i0 = wlo; i0 < whi; i0 += 32) {
    int i = i0 + lane;
    float v = i < whi ? p[i] : 0.f;
    bool tie = i < whi && v == tv;
    unsigned b = __ballot_sync(0xffffffffu, tie);
    int rank_in = seen + __popc(b & ((1u << lane) - 1u));
    seen += __popc(b);
    if (i < whi) p[i] = (v > tv || (tie && rank_in < need)) ? v * scale : 0.f;
  }
  cluster_sync();  // p is complete across the cluster
}

extern "C" {

__global__ void __launch_bounds__(SAMPLE_THREADS)
sample_f32(const float* logits, i64 ld, float* probs, i64 ldp, int Q, const int* pos, int r0, int V,
           float inv_temp, int top_k, float top_p, i64* out_ids, const u64* rng) {
  __shared__ Scratch s;
  pdl_wait();
  int r = blockIdx.y;
  int slot = (pos ? *pos + r0 + r : r) % Q;
  float* p = probs + (i64)slot * ldp;
  row_probs(logits + (i64)r * ld, p, V, inv_temp, top_k, top_p, s);
  if (out_ids == nullptr) return;
  int lo, hi;
  row_slice(V, lo, hi);
  float u = uniform01(rng[0], rng[1] + (u64)r);
  int tok = pick_index([&](int i) { return p[i]; }, lo, hi, u, s);
  if (cluster_rank() == 0 && threadIdx.x == 0) out_ids[r] = tok;
}

// sample_rows_f32: the batched step's sampler (minitorch/cuda/batch.py): row r of logits with its own settings
//   (inv_temp[r], top_k[r], top_p[r]) and generator (rng[2r], rng[2r + 1]); a row with inv_temp 0 is greedy and is
//   left alone (the argmax kernels wrote out_ids[r]). Probabilities go to probs row r, the draw by inverse CDF with
//   u = uniform(rng[2r], rng[2r + 1]): what sample_f32 draws for a one-sequence decode step with that seed and
//   counter. Grid (C, rows), clusters (C, 1, 1).
__global__ void __launch_bounds__(SAMPLE_THREADS)
sample_rows_f32(const float* logits, i64 ld, float* probs, i64 ldp, int V, const float* inv_temp, const int* top_k,
                const float* top_p, i64* out_ids, const u64* rng) {
  __shared__ Scratch s;
  pdl_wait();
  const int r = blockIdx.y;
  const float it = inv_temp[r];
  if (it == 0.f) return;  // uniform over the row's cluster
  float* p = probs + (i64)r * ldp;
  row_probs(logits + (i64)r * ld, p, V, it, top_k[r], top_p[r], s);
  int lo, hi;
  row_slice(V, lo, hi);
  float u = uniform01(rng[2 * r], rng[2 * r + 1]);
  int tok = pick_index([&](int i) { return p[i]; }, lo, hi, u, s);
  if (cluster_rank() == 0 && threadIdx.x == 0) out_ids[r] = tok;
}

__global__ void __launch_bounds__(SAMPLE_THREADS)
spec_accept(const float* p, i64 ldp, const i64* argmax, const float* q, i64 ldq, int qV, int Q, int* dpos,
            const i64* drafts, int g, int gq, int V, int* tpos, i64* ttok, i64* dtok, i64* out, u64* rng) {
  __shared__ Scratch s;
  __shared__ int res[2];
  pdl_wait();
  int lo, hi, rank = (int)cluster_rank();
  row_slice(V, lo, hi);
  int p0 = *tpos;
  i64 pending = ttok[0];
  int qbase = dpos ? *dpos - gq : 0;
  u64 seed = rng ? rng[0] : 0, ctr = rng ? rng[1] : 0;
  if (threadIdx.x == 0) {  // the acceptance tests: a few scalar reads, in order (every block the same)
    int n = 0;
    for (; n < g; ++n) {
      i64 d = drafts[n];
      if (p == nullptr) {
        if (d != argmax[n]) break;
        continue;
      }
      float pd = p[(i64)n * ldp + d];
      float qd = q && n < gq ? (d < qV ? q[(i64)((qbase + n) % Q) * ldq + d] : 0.f) : 1.f;
      if (!(uniform01(seed, ctr + n) * qd < pd)) break;
    }
    res[0] = n;
    res[1] = p == nullptr ? (int)argmax[n] : -1;
  }
  __syncthreads();
  int n = res[0];
  if (p != nullptr) {  // draw the correction (residual) or the bonus token with the whole cluster
    const float* pn = p + (i64)n * ldp;
    float u = uniform01(seed, ctr + g);
    int tok;
    if (n == g) {
      tok = pick_index([&](int i) { return pn[i]; }, lo, hi, u, s);
    } else {
      i64 d = drafts[n];
      const float* qn = q && n < gq ? q + (i64)((qbase + n) % Q) * ldq : nullptr;
      auto resid = [&](int i) { return fmaxf(pn[i] - (qn ? (i < qV ? qn[i] : 0.f) : (i == d ? 1.f : 0.f)), 0.f); };
      float mass = 0.f;
      for (int i = lo + threadIdx.x; i < hi; i += blockDim.x) mass += resid(i);
      mass = cluster_sum(mass, s);
      tok = mass > 0.f ? pick_index(resid, lo, hi, u, s) : pick_index([&](int i) { return pn[i]; }, lo, hi, u, s);
    }
    if (threadIdx.x == 0) res[1] = tok;
  }
  cluster_sync();  // every block has read the round's inputs before block 0 moves the positions
  if (rank == 0 && threadIdx.x == 0) {
    i64 next = res[1];
    out[0] = n;
    for (int i = 0; i < n; ++i) out[1 + i] = drafts[i];
    out[1 + n] = next;
    *tpos = p0 + n + 1;
    ttok[0] = next;
    if (dpos) {
      if (n >= gq) {  // the draft's own tokens all accepted: it feeds its last one, the accepted lookups, next
        *dpos = p0 + gq;
        for (int j = 0; j <= n - gq; ++j) dtok[j] = gq - 1 + j >= 0 ? drafts[gq - 1 + j] : pending;
        dtok[n - gq + 1] = next;
      } else {
        *dpos = p0 + n + 1;
        dtok[0] = next;
      }
    }
    if (rng) rng[1] = ctr + g + 1;
  }
}

__global__ void gather_drafts(i64* ttok, const i64* history, const int* dpos, int g) {
  pdl_wait();
  int j = threadIdx.x;
  if (j < g) ttok[1 + j] = history[*dpos - g + 1 + j];
}
}
