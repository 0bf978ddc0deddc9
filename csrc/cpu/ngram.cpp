// CPU kernels of the n-gram ops: one row per task, the per-row logic of core/ngram.h.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>

#include "core/ngram.h"
#include "op_args.h"

namespace specdec::cpu {
namespace {

void ngram_match(const at::Tensor& context, const at::Tensor& context_len, int64_t min_n,
                 int64_t max_n, bool earliest, const at::Tensor& draft,
                 const at::Tensor& draft_len) {
  const auto [B, S, K] = check_ngram_match(context, context_len, min_n, max_n, draft, draft_len);
  const at::Tensor ctx = context.contiguous(), lens = context_len.contiguous();
  // A row costs about S compares: give each task some 32k of them.
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(S, 1));
  AT_DISPATCH_INDEX_TYPES(ctx.scalar_type(), "ngram_match", [&] {
    const index_t* c = ctx.const_data_ptr<index_t>();
    const index_t* len = lens.const_data_ptr<index_t>();
    index_t* out = draft.mutable_data_ptr<index_t>();
    index_t* out_len = draft_len.mutable_data_ptr<index_t>();
    at::parallel_for(0, B, grain, [&](int64_t begin, int64_t end) {
      for (int64_t b = begin; b < end; ++b) {
        const index_t* row = c + b * S;
        const int64_t L = core::clamp_len(len[b], S);
        const core::NGramHit hit = core::best_hit_strided(row, L, min_n, max_n, earliest, 0, 1);
        const int64_t n = core::hit_draft_len(hit, L, K);
        for (int64_t j = 0; j < K; ++j) out[b * K + j] = core::hit_draft_token(row, hit, n, j);
        out_len[b] = static_cast<index_t>(n);
      }
    });
  });
}

void ngram_pool_insert(const at::Tensor& head, const at::Tensor& entries, const at::Tensor& cursor,
                       const at::Tensor& ngrams, int64_t g) {
  const auto d = check_ngram_pool_insert(head, entries, cursor, ngrams, g);
  const at::Tensor grams = ngrams.contiguous();
  const int64_t M = grams.size(1);
  AT_DISPATCH_INDEX_TYPES(head.scalar_type(), "ngram_pool_insert", [&] {
    index_t* h = head.mutable_data_ptr<index_t>();
    index_t* e = entries.mutable_data_ptr<index_t>();
    index_t* cur = cursor.mutable_data_ptr<index_t>();
    const index_t* x = grams.const_data_ptr<index_t>();
    at::parallel_for(0, d.B, 1, [&](int64_t begin, int64_t end) {
      for (int64_t b = begin; b < end; ++b) {
        const core::PoolRow<index_t> pool{h + b * d.V, e + b * d.C * (d.N + 1), d.V, d.C, d.N};
        // In order: later n-grams of the call are more recent.
        for (int64_t m = 0; m < M; ++m) pool.insert(x + (b * M + m) * d.N, g, cur + b);
      }
    });
  });
}

void ngram_pool_lookup(const at::Tensor& head, const at::Tensor& entries, const at::Tensor& last_ids,
                       const at::Tensor& candidates, const at::Tensor& count) {
  const auto d = check_ngram_pool_lookup(head, entries, last_ids, candidates, count);
  const at::Tensor ids = last_ids.contiguous();
  AT_DISPATCH_INDEX_TYPES(head.scalar_type(), "ngram_pool_lookup", [&] {
    const index_t* h = head.const_data_ptr<index_t>();
    const index_t* e = entries.const_data_ptr<index_t>();
    const index_t* key = ids.const_data_ptr<index_t>();
    index_t* out = candidates.mutable_data_ptr<index_t>();
    index_t* n = count.mutable_data_ptr<index_t>();
    at::parallel_for(0, d.B, 64, [&](int64_t begin, int64_t end) {
      for (int64_t b = begin; b < end; ++b) {
        n[b] = static_cast<index_t>(core::pool_lookup_row(h + b * d.V, e + b * d.C * (d.N + 1),
                                                          d.V, d.C, d.N, key[b], d.G,
                                                          out + b * d.G * (d.N - 1)));
      }
    });
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(specdec, CPU, m) {
  m.impl("ngram_match", &ngram_match);
  m.impl("ngram_pool_insert", &ngram_pool_insert);
  m.impl("ngram_pool_lookup", &ngram_pool_lookup);
}

}  // namespace specdec::cpu
