#include "plan/stage_tables.hpp"

#include <map>
#include <mutex>
#include <string>

#include "core/format.hpp"

namespace mpiformer {

StageTables::StageTables(const GptConfig& cfg, const StageRange& range, int64_t replicas, int64_t ep)
    : table(cfg, range),
      layout(table, range),
      shards(table, layout, static_cast<int>(replicas), 0, static_cast<int>(ep)) {}

namespace {

// Every field of both: a field added to either without its place here
// would let two different stages share tables, so their sizes are held.
static_assert(sizeof(GptConfig) == 136, "GptConfig changed: key every field in stage_key");
static_assert(sizeof(StageRange) == 72, "StageRange changed: key every field in stage_key");

std::string stage_key(const GptConfig& c, const StageRange& r, int64_t replicas, int64_t ep) {
  return strprintf("%lld %lld %lld %lld %lld %d %lld %lld %a %a %d %lld %lld %lld %a %a %a | "
                   "%lld %lld %d %d %lld %lld %lld %lld %lld %lld | %lld %lld",
                   static_cast<long long>(c.n_layer), static_cast<long long>(c.n_head),
                   static_cast<long long>(c.n_embd), static_cast<long long>(c.seq_len),
                   static_cast<long long>(c.vocab_size), static_cast<int>(c.family),
                   static_cast<long long>(c.n_kv_head), static_cast<long long>(c.ffn_hidden),
                   c.rope_theta, c.norm_eps, c.tie_embeddings ? 1 : 0,
                   static_cast<long long>(c.experts), static_cast<long long>(c.top_k),
                   static_cast<long long>(c.moe_every), c.capacity_factor, c.aux_loss,
                   c.router_z_loss, static_cast<long long>(r.first_layer),
                   static_cast<long long>(r.last_layer), r.has_embedding ? 1 : 0, r.has_head ? 1 : 0,
                   static_cast<long long>(r.tp), static_cast<long long>(r.tp_rank),
                   static_cast<long long>(r.chunks), static_cast<long long>(r.chunk_stride),
                   static_cast<long long>(r.ep), static_cast<long long>(r.ep_rank),
                   static_cast<long long>(replicas), static_cast<long long>(ep));
}

}  // namespace

std::shared_ptr<const StageTables> stage_tables(const GptConfig& cfg, const StageRange& range,
                                                int64_t replicas, int64_t ep) {
  // A search meets its stages in runs (layouts are enumerated by tensor,
  // pipeline and context width first): a few hundred kept is plenty. The
  // cuts grow with the replicas (two numbers a replica a unit: 80 MB for
  // a 128-block stage at 65,536), so what is kept is bounded in bytes too.
  constexpr size_t kKept = 256;
  constexpr double kKeptBytes = 256.0 * (1 << 20);
  static std::mutex lock;
  static std::map<std::string, std::shared_ptr<const StageTables>> known;
  static double held = 0;
  const std::string key = stage_key(cfg, range, replicas, ep);
  {
    const std::lock_guard<std::mutex> hold(lock);
    if (auto it = known.find(key); it != known.end()) return it->second;
  }
  auto built = std::make_shared<const StageTables>(cfg, range, replicas, ep);
  double bytes = static_cast<double>(built->table.specs().size() * sizeof(ParameterSpec));
  for (const ShardUnit& u : built->shards.units())
    bytes += static_cast<double>((u.cuts.size() + u.counts.size()) * sizeof(int64_t));
  const std::lock_guard<std::mutex> hold(lock);
  if (known.size() >= kKept || held + bytes > kKeptBytes) {
    known.clear();
    held = 0;
  }
  if (bytes <= kKeptBytes && known.emplace(key, built).second) held += bytes;
  return built;
}

}  // namespace mpiformer
