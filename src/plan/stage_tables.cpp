#include "plan/stage_tables.hpp"

#include <string>

#include "core/bounded_memo.hpp"

namespace mpiformer {

StageTables::StageTables(const GptConfig& cfg, const StageRange& range, int64_t replicas, int64_t ep)
    : table(cfg, range), layout(table, range), replicas_(replicas), ep_(ep) {
  if (ep >= 1 && replicas % ep == 0)
    shards_.emplace(table, layout, static_cast<int>(replicas), 0, static_cast<int>(ep));
}

const ShardPlan& StageTables::shards() const {
  if (!shards_) ShardPlan(table, layout, static_cast<int>(replicas_), 0, static_cast<int>(ep_));  // throws
  return *shards_;
}

double StageTables::bytes() const {
  double b = static_cast<double>(table.specs().size() * sizeof(ParameterSpec));
  if (shards_)
    for (const ShardUnit& u : shards_->units())
      b += static_cast<double>((u.cuts.size() + u.counts.size()) * sizeof(int64_t));
  return b;
}

namespace {

// Every field of both: a field added to either without its place here
// would let two different stages share tables, so their sizes are held.
static_assert(sizeof(GptConfig) == 136, "GptConfig changed: key every field in stage_key");
static_assert(sizeof(StageRange) == 88, "StageRange changed: key every field in stage_key");

// The fields' bytes, one after another (formatting them as text took a
// tenth of a 65,536-rank search).
template <class... T>
std::string bytes_of(const T&... fields) {
  std::string key;
  key.reserve((sizeof(T) + ...));
  (key.append(reinterpret_cast<const char*>(&fields), sizeof(T)), ...);
  return key;
}

std::string stage_key(const GptConfig& c, const StageRange& r, int64_t replicas, int64_t ep) {
  return bytes_of(c.n_layer, c.n_head, c.n_embd, c.seq_len, c.vocab_size, c.family, c.n_kv_head,
                  c.ffn_hidden, c.rope_theta, c.norm_eps, c.tie_embeddings, c.experts, c.top_k,
                  c.moe_every, c.capacity_factor, c.aux_loss, c.router_z_loss, r.first_layer,
                  r.last_layer, r.has_embedding, r.has_head, r.tp, r.tp_rank, r.chunks,
                  r.chunk_stride, r.first_short, r.last_short, r.ep, r.ep_rank, replicas, ep);
}

}  // namespace

std::shared_ptr<const StageTables> stage_tables(const GptConfig& cfg, const StageRange& range,
                                                int64_t replicas, int64_t ep) {
  // A search meets its stages in runs (layouts are enumerated by tensor,
  // pipeline and context width first): a few hundred kept is plenty. The
  // cuts grow with the replicas (two numbers a replica a unit: 80 MB for
  // a 128-block stage at 65,536), so what is kept is bounded in bytes too.
  static BoundedMemo<std::string, StageTables> known(256, 256.0 * (1 << 20));
  return known.get(
      stage_key(cfg, range, replicas, ep),
      [&] { return std::make_shared<const StageTables>(cfg, range, replicas, ep); },
      [](const StageTables& t) { return t.bytes(); });
}

}  // namespace mpiformer
