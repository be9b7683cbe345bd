#include "plan/rank_memory.hpp"

#include <algorithm>

#include "common/attention_storage.hpp"
#include "common/op_constants.hpp"
#include "core/precision_plan.hpp"
#include "model/gradient_buckets.hpp"
#include "model/parameter_table.hpp"
#include "model/shard_plan.hpp"
#include "model/stage_layout.hpp"
#include "checkpoint.hpp"
#include "offload_files.hpp"
#include "model/stage_options.hpp"
#include "parallel/pipeline_schedule.hpp"
#include "plan/stage_tables.hpp"

namespace mpiformer {

namespace {

// What a save's checksum gathers of one tensor on its root (checkpointing's
// gather_tensor): the whole logical tensor, and a second copy put in order
// unless the parts arrive as whole rows in order: column or head slices
// never do, row slices not when replicas also cut them (dp > 1: the parts
// come tensor rank fastest).
double save_gather_bytes(const ParameterSpec& spec, int64_t dp) {
  const bool reordered = spec.split == Split::kCols || spec.split == Split::kHeads ||
                         (spec.split == Split::kRows && dp > 1);
  return static_cast<double>(spec.logical_numel()) * 4 * (reordered ? 2 : 1);
}

}  // namespace

StageOptions stage_options_of(const Deck& deck, const SlotKinds& slots) {
  StageOptions o = stage_options(deck.train.micro_batch, slots, deck.train.recompute,
                                 static_cast<int>(deck.parallel.zero),
                                 deck.parallel.sequence_parallel,
                                 splits_backward(deck.parallel.schedule));
  // Offloaded masters live with the moments (train/adamw_state.hpp).
  if (masters_offloaded(deck.train.offload, precision_plan(deck.train.precision).weight_copy))
    o.external_master = true;
  o.document_mask = deck.data.document_mask;
  o.cp = deck.parallel.cp;
  // 16-bit gradients: each block's micro-batch gradients in a float window
  // (zero_shards.hpp), at every ZeRO level.
  // The vocabulary's too (windows_vocab_grads).
  if (deck.train.grad_dtype == GradDtype::kBf16 && deck.parallel.zero >= 1)
    o.window_grads = o.window_vocab_grads = true;
  return o;
}

StageRange stage_range_of(const Deck& deck, int stage_index, int64_t tp_rank, int64_t ep_rank) {
  StageRange r = partition_stage(deck.model, stage_index, deck.parallel.pp, deck.parallel.tp,
                                 tp_rank, deck.parallel.virtual_stages);
  r.ep = deck.parallel.ep;
  r.ep_rank = ep_rank;
  return r;
}

std::vector<Action> stage_schedule(const Deck& deck, int stage_index) {
  return pipeline_schedule(deck.parallel.schedule, static_cast<int>(deck.parallel.pp), stage_index,
                           static_cast<int>(deck.grad_accum()),
                           static_cast<int>(deck.parallel.virtual_stages));
}

int stage_grad_send_buffers(const Deck& deck, int stage_index) {
  return gradient_send_buffers(deck.parallel.schedule, static_cast<int>(deck.parallel.pp),
                               stage_index, static_cast<int>(deck.grad_accum()),
                               static_cast<int>(deck.parallel.virtual_stages));
}

RankMemory rank_memory(const Deck& deck, const BackendChoice& choice, int stage_index,
                       const SlotKinds& slots) {
  const GptConfig& cfg = deck.model;
  // Tensor rank 0: every rank stores as much, and it holds the most real
  // vocabulary rows (what the save's gathers and ZeRO's parts follow).
  const StageRange range = stage_range_of(deck, stage_index, 0);
  const PrecisionPlan types = precision_plan(choice.precision);
  const double act = static_cast<double>(element_bytes(types.activations));
  const double acc = static_cast<double>(element_bytes(types.master));
  const int zero = static_cast<int>(deck.parallel.zero);
  RankMemory m;
  m.slots = slots.count;
  bool host_gradients = false;  // ZeRO's shard gradients offloaded (below)
  // What attention keeps: the GPU's fused kernels each row's statistics,
  // the host the probabilities (each op set's kAttention).
  const AttentionStorage attention = choice.device == Device::kCuda
                                         ? AttentionStorage::kRowStatistics
                                         : AttentionStorage::kProbabilities;
  // The stage's table and ZeRO's cuts of it, shared by the layouts of a
  // search that have this stage.
  const std::shared_ptr<const StageTables> tables =
      stage_tables(cfg, range, deck.replicas(), deck.parallel.ep);
  const ParameterTable& table = tables->table;
  m.stage = stage_footprint(cfg, range, table, tables->layout,
                            stage_options_of(deck, slots),
                            static_cast<size_t>(act), static_cast<size_t>(acc), attention);
  if (zero == 0) {
    // AdamW's two moments, each the size of the stage's master weights.
    m.optimizer = 2 * static_cast<double>(table.total_storage()) * acc;
    const bool compressed = deck.train.grad_compression != GradCompression::kNone && deck.replicas() > 1;
    // On the host, MPI's non-blocking all-reduce keeps a temporary of its
    // bucket: kReductionsInFlight buckets at most (grad_reducer.hpp); the
    // compressed exchange blocks, in buffers of its own (below).
    if (choice.device == Device::kCpu) {
      double largest = 0;
      if (deck.replicas() > 1 && !compressed) {
        for (const GradientBucket& b : gradient_buckets(table, deck.parallel.bucket_mb * (1 << 20)))
          largest = std::max(largest, static_cast<double>(b.end - b.begin));
      }
      m.comm = static_cast<double>(kReductionsInFlight) * largest * acc;
      // Held one at a time, after the buckets: MPI's temporary of the tied
      // embedding's blocking all-reduce (pp > 1, its stages), and a save's
      // gather of a tensor-parallel slice for its checksum (the whole
      // tensor, then put in order; whole tensors need none at zero 0).
      if (const ParameterSpec* tied = table.tied_embedding(); deck.parallel.pp > 1 && tied != nullptr)
        m.comm = std::max(m.comm, static_cast<double>(tied->storage) * acc);
      for (const auto& spec : table.specs())
        if (!spec.whole()) m.comm = std::max(m.comm, save_gather_bytes(spec, deck.replicas()));
    }
    // [train] grad_compression: error feedback's residuals and the wire
    // buffers (train/compressed_allreduce.hpp).
    if (compressed) {
      m.comm += compression_buffers(deck.train.grad_compression,
                                    gradient_buckets(table, deck.parallel.bucket_mb * (1 << 20)),
                                    table.total_storage(), static_cast<int>(deck.replicas()),
                                    static_cast<int>(deck.replicas() / deck.parallel.ep))
                    .bytes();
    }
  } else {
    // The largest shard of the group (parts end at rows, so they differ a little).
    const ShardPlan& plan = tables->shards();
    const double shard = static_cast<double>(plan.max_shard_size());
    m.shard = shard;
    // Where the stage holds a buffer whole, the shard's share is its owned
    // rows, counted there (train/zero_shards.hpp): the masters in fp32 at
    // zero 1-2, the 16-bit copy at zero 1-2, the reduced gradients at
    // zero 1. Else the shard keeps its own: float masters, the 16-bit copy
    // it gathers from (zero 3), the reduced gradients (zero 2-3).
    const bool masters_are_weights = !types.weight_copy && zero < 3;
    m.shard_master = (masters_are_weights ? 0 : shard * acc) +
                     (types.weight_copy && zero >= 3 ? shard * act : 0);
    // 16-bit gradients ([train] grad_dtype, zero_shards.hpp): at zero 1 the
    // blocks' 16-bit sums over the step, reduced in place (offloaded, also
    // a float shard and 16-bit receive buffers); at zero 2-3 the float
    // shard, 16-bit receive buffers and two of a window's rounded
    // gradients.
    const bool grad16 = deck.train.grad_dtype == GradDtype::kBf16;  // zero >= 1 here
    const bool in_place16 = grad16 && zero == 1 && deck.train.offload == Offload::kNone;
    // From zero 2 (zero 1 with 16-bit gradients) the vocabulary's
    // gradients go through the windows (StageLayout::windows_vocab): the
    // receive buffers hold its pieces' parts too, zero 1's 16-bit sums
    // the whole vocabulary (StageLayout::sums_size).
    const bool vocab = tables->layout.windows_vocab(windows_vocab_grads(zero, grad16));
    const double window_part = static_cast<double>(plan.max_window_part(vocab));
    double largest_block = 0;
    for (const ShardUnit& u : plan.units()) {
      if (u.block < 0) continue;
      const auto [first, last] = plan.block_units(u.block);
      largest_block = std::max(largest_block, static_cast<double>(plan.units()[last - 1].end -
                                                                  plan.units()[first].begin));
    }
    m.shard_gradients = (zero >= 2 || grad16) && !in_place16 ? shard * acc : 0;
    if (grad16 && zero == 1)
      m.shard_gradients += static_cast<double>(tables->layout.sums_size(vocab)) * act;
    m.optimizer = 2 * shard * acc;
    if (grad16) {
      m.comm = in_place16 ? 0 : 2 * window_part * act;
      if (zero >= 2) m.comm += 2 * largest_block * act;
    } else if (zero >= 2) {
      m.comm = 2 * window_part * acc;
    }
    // Offloaded at zero 2-3 on a GPU, the shard's gradients go to host
    // memory (zero_shards.hpp): the device keeps the parts of the units
    // outside the blocks (the largest of the group's, unit by unit); the
    // host the shard and two staging buffers of a block's parts.
    if (zero >= 2 && deck.train.offload != Offload::kNone && choice.device == Device::kCuda &&
        types.master == Element::kF32 && !grad16) {
      double resident = 0;
      for (const ShardUnit& u : plan.units())
        if (u.block < 0) resident += static_cast<double>(*std::max_element(u.counts.begin(), u.counts.end()));
      m.shard_gradients = resident * acc;
      m.offload_host += (shard + 2 * static_cast<double>(plan.max_block_part())) * acc;
      host_gradients = true;
    }
    // On the host, MPI's non-blocking reduce-scatter keeps a temporary of
    // its whole input (kInFlight units at most), and a save gathers each
    // tensor whole on one rank for its checksum (checkpointing.cpp; on a
    // GPU run both are host memory, not the device's).
    if (choice.device == Device::kCpu) {
      // Units go in reverse buffer order, at most kInFlight at once: the
      // most any kInFlight consecutive ones hold. At zero >= 2 the blocks
      // go through their windows one at a time (all of a block's units at
      // once: its experts' apart under expert parallelism), apart from
      // the rest.
      // (16-bit gradients: every level's blocks go through their windows,
      // and their temporaries are 16-bit.)
      const bool windows = zero >= 2 || grad16;
      // (A windowed vocabulary goes through the windows as a block does,
      // piece by piece: none larger than a window.)
      std::vector<double> sizes;
      double largest_window = largest_block;
      for (const ShardUnit& u : plan.units()) {
        const double size = static_cast<double>(u.end - u.begin);
        if (vocab && tables->layout.is_vocab(u.begin)) {
          const int64_t use = u.begin == tables->layout.vocab_in.begin ? StageLayout::kVocabIn
                                                                       : StageLayout::kVocabOut;
          largest_window = std::max(largest_window,
                                    static_cast<double>(tables->layout.piece(use).size()));
        } else if (!windows || u.block < 0) {
          sizes.push_back(size);
        }
      }
      double in_flight = windows ? static_cast<double>(kInFlight) * largest_window * (grad16 ? act : acc) : 0;
      for (size_t i = 0; i < sizes.size(); ++i) {
        double sum = 0;
        for (size_t j = i; j < std::min(sizes.size(), i + kInFlight); ++j) sum += sizes[j];
        in_flight = std::max(in_flight, sum * acc);
      }
      double gather = 0;
      for (const auto& spec : table.specs())
        gather = std::max(gather, save_gather_bytes(spec, deck.replicas()));
      // A save runs between steps, when no reduce-scatter is in flight:
      // the larger of the two is what is held at once.
      m.comm += std::max(in_flight, gather);
    }
  }
  // [train] offload moves the moments out (adamw_state.hpp), with the
  // float masters in mixed precision (the 16-bit copy stays). On the host,
  // "host" keeps them in host memory all the same; "nvme" keeps a ring of
  // three blocks of each part there. A GPU keeps nothing of them: its
  // update runs on the host, with page-locked buffers of two blocks of
  // gradients and two of the 16-bit copy (fp32: of the masters); under
  // "host" at zero 0 with data parallelism, also a page-locked copy of the
  // whole gradients, filled during backward (adamw_state.hpp).
  if (deck.train.offload != Offload::kNone) {
    const bool held = masters_offloaded(deck.train.offload, types.weight_copy);
    const double elements = m.optimizer / (2 * acc);
    const double masters = held ? elements * acc : 0;
    if (zero > 0) m.shard_master -= masters;  // zero 0: the stage has none (stage_options_of)
    const double state = m.optimizer + masters;
    const double block = std::min(elements, static_cast<double>(offload_block_elements(deck.train)));
    const double ring = deck.train.offload == Offload::kNvme ? 3 * (held ? 3 : 2) * block * 4 : 0;
    m.optimizer = 0;
    if (choice.device == Device::kCpu) {
      if (deck.train.offload == Offload::kHost) m.optimizer = state;
      m.offload_buffers = ring;
    } else {
      const bool prefetch = deck.train.offload == Offload::kHost && zero == 0 && deck.replicas() > 1;
      // (The gradients' page-locked blocks go where the gradients are
      // in host memory already.)
      m.offload_host += (deck.train.offload == Offload::kHost ? state : ring) +
                        block * ((host_gradients ? 0 : 2 * acc) + 2 * (held ? act : acc)) +
                        (prefetch ? elements * acc : 0);
    }
    if (deck.train.offload == Offload::kNvme) m.offload_disk = state;
  }
  // The input-gradient send buffers, each held while a send to the
  // previous stage is in flight (TrainingStage's): on every stage that
  // sends gradients, the first too when interleaved (its later chunks send).
  if (const int buffers = stage_grad_send_buffers(deck, stage_index); buffers > 0) {
    const double rows = static_cast<double>(deck.train.micro_batch * cfg.seq_len / deck.parallel.cp) /
                        (deck.parallel.sequence_parallel ? static_cast<double>(deck.parallel.tp) : 1.0);
    m.comm += static_cast<double>(buffers) * rows * static_cast<double>(cfg.n_embd) * act;
  }
  // [checkpoint] async: the snapshot a save writes from, allocated at the
  // first background save and kept for the next: this rank's share of its stage's weights and two
  // moments in fp32 (the ranks of a stage split its tensors' rows). Host
  // memory: the rank's own on the host back end, beside the device's on a
  // GPU.
  if (deck.checkpoint.async) {
    m.checkpoint_snapshot = 3.0 * 4.0 * static_cast<double>(table.total_storage()) /
                            static_cast<double>(deck.replicas());
  }
  // Every save (the deck's; a stop's too) writes and reads back through a
  // staging buffer and a piece (io/checkpoint.hpp), as long as the longest
  // run of floats the rank saves: at most a whole tensor of its stage.
  if (deck.checkpoint.every > 0 || deck.checkpoint.at_end) {
    int64_t longest = 0;
    for (const ParameterSpec& s : table.specs()) longest = std::max(longest, s.logical_numel());
    m.checkpoint_io = checkpoint_io_bytes(longest);
  }
  m.saves_in_total = choice.device == Device::kCpu;
  // The device context's workspace (cuBLASLt's, the column sums').
  if (choice.device == Device::kCuda) m.workspace = static_cast<double>(kDeviceWorkspaceBytes);
  // The host's fp16 products are widened to float (gemm_narrow.cpp): its
  // three scratch buffers grow to the largest first operand, second
  // operand and 16-bit output of any product, and stay.
  if (choice.device == Device::kCpu && choice.precision == Precision::kFp16) {
    const double BT = static_cast<double>(deck.train.micro_batch * cfg.seq_len / deck.parallel.cp);
    const double C = static_cast<double>(cfg.n_embd), tp = static_cast<double>(deck.parallel.tp);
    const double Cm = static_cast<double>(cfg.ffn_in()) / tp, Cq = static_cast<double>(cfg.qkv_dim_per_rank(deck.parallel.tp));
    const double V = range.has_head ? static_cast<double>(cfg.padded_vocab(deck.parallel.tp)) / tp : 0;
    const double widest = std::max({V, Cm, Cq, C});  // an activation's row
    const double first = BT * widest;                 // activations (or their gradients)
    const double second = std::max({V * C, Cm * C, Cq * C, BT * std::max(C, Cm)});  // weights or activations
    m.workspace = 4 * (2 * first + second);
  }
  // Host 16-bit attention rounds the probabilities (in backward, the score
  // gradients) for its products into one kept buffer of [B, NH/tp, T, T]
  // (attention.hpp), and a 16-bit tensor-group sum (or sequence
  // parallelism's reduce-scatter) is widened into a kept float buffer of
  // the largest, [B, T, C], one for the blocking sums and one for the
  // started one (mpi_communicator.cpp). The
  // cross-entropy's per-thread float row (V floats a thread, under 2 MB at
  // 8 threads and GPT-2's vocabulary) is left out.
  if (choice.device == Device::kCpu && element_bytes(types.activations) == 2) {
    const double B = static_cast<double>(deck.train.micro_batch);
    const double T = static_cast<double>(cfg.seq_len / deck.parallel.cp), tp = static_cast<double>(deck.parallel.tp);
    // (The ring keeps no probabilities: context_attention_bytes below.)
    if (range.num_layers() > 0 && deck.parallel.cp == 1)
      m.workspace += 2 * B * static_cast<double>(cfg.n_head) / tp * T * T;
    if (deck.parallel.tp > 1) m.comm += 2 * 4 * B * T * static_cast<double>(cfg.n_embd);
  }
  // Context parallelism's ring (train/context_attention.hpp): its blocks,
  // their gradients' sums, the rows' accumulators, and a 16-bit stage's
  // float copies.
  if (range.num_layers() > 0)
    m.comm += context_attention_bytes(cfg, deck.parallel.tp, deck.train.micro_batch, deck.parallel.cp,
                                      static_cast<size_t>(act), static_cast<size_t>(acc), choice.device);
  return m;
}

double context_attention_bytes(const GptConfig& cfg, int64_t tp, int64_t micro_batch, int64_t cp,
                               size_t act_bytes, size_t acc_bytes, Device device) {
  if (cp <= 1) return 0;
  const double rows = static_cast<double>(micro_batch) * static_cast<double>(cfg.seq_len / cp);
  const double K = static_cast<double>(cfg.kv_dim_per_rank(tp));
  const double NH = static_cast<double>(cfg.n_head / tp), Ca = static_cast<double>(cfg.n_embd / tp);
  const double qkv = static_cast<double>(cfg.qkv_dim_per_rank(tp));
  const double acc = static_cast<double>(acc_bytes), act = static_cast<double>(act_bytes);
  // Two key/value blocks in Act, two of their gradients' sums in Acc (and
  // each row's document start, 8 bytes). On the host, each (sequence, kv
  // head) task's score tiles, and a 16-bit block widened.
  const double n = static_cast<double>(cfg.seq_len / (2 * cp));
  double bytes = 2 * rows * 2 * K * (act + acc) + 3 * rows * NH * acc + 8 * rows;
  if (device == Device::kCpu) {
    bytes += ring_scratch_elements(static_cast<double>(micro_batch),
                                   static_cast<double>(cfg.kv_heads_per_rank(tp)), n, n) * acc;
    if (act_bytes != acc_bytes) bytes += static_cast<double>(micro_batch) * n * 2 * K * acc;
  }
  if (act_bytes != acc_bytes) bytes += 2 * rows * (qkv + Ca) * acc;
  return bytes;
}

int64_t offload_block_elements(const TrainConfig& train) {
  const auto align = OffloadFiles::kAlignBytes;
  const auto bytes = static_cast<int64_t>(train.offload_block_mb * (1 << 20));
  return std::max<int64_t>(1, bytes / align) * OffloadFiles::kAlignElements;
}

}  // namespace mpiformer
