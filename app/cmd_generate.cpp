// Samples text from a checkpoint on one rank, with a KV cache (one token
// costs one row through the model, not the whole window): generation is
// linear in the tokens. When the window (seq_len) is full, the newest half
// is fed again and decoding goes on from there, so every token sees at
// least seq_len / 2 tokens of context. Text to stdout, everything else to
// stderr.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <numeric>

#include "checkpoint.hpp"
#include "commands.hpp"
#include "core/durable_file.hpp"
#include "core/error.hpp"
#include "core/output_path.hpp"
#include "core/rng.hpp"
#include "model/gpt_decoder.hpp"
#include "tokenizer.hpp"
#include "train/checkpointing.hpp"

namespace mpiformer {
namespace {

// Index of the next token from `logits[0, V)`: argmax at temperature 0, else
// a draw from softmax(logits / temperature) over the top_k largest (all if 0).
int64_t sample(const float* logits, int64_t V, double temperature, int top_k, Rng& rng) {
  if (temperature <= 0) return std::max_element(logits, logits + V) - logits;
  std::vector<int64_t> idx(static_cast<size_t>(V));
  std::iota(idx.begin(), idx.end(), 0);
  const int64_t k = top_k > 0 ? std::min<int64_t>(top_k, V) : V;
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                    [&](int64_t a, int64_t b) { return logits[a] > logits[b]; });
  const double top = logits[idx[0]];
  std::vector<double> p(static_cast<size_t>(k));
  double z = 0;
  for (int64_t i = 0; i < k; ++i) z += (p[i] = std::exp((logits[idx[i]] - top) / temperature));
  double u = rng.uniform() * z;
  for (int64_t i = 0; i < k; ++i) {
    if ((u -= p[i]) <= 0) return idx[i];
  }
  return idx[k - 1];
}

}  // namespace

int run_generate(const GenerateArgs& args, int rank) {
  if (rank != 0) return 0;
  const std::string vocab_dir = args.vocab_dir.empty() ? default_gpt2_vocab_dir() : args.vocab_dir;
  if (!args.logits.empty()) {
    refuse_input_as_output(args.logits, "--logits",
                           {{"the checkpoint", args.checkpoint},
                            {"a tokenizer file", vocab_dir + "/encoder.json"},
                            {"a tokenizer file", vocab_dir + "/vocab.bpe"},
                            {"the tokenizer model", args.tokenizer_model}});
    // Its folder before any work: a mistake in the command is exit 2 now,
    // not an error after the whole generation.
    require_writable_folder(args.logits, "--logits");
  }
  CheckpointReader reader(args.checkpoint);
  const CheckpointMeta& m = reader.meta();
  const GptConfig cfg = model_config(m);
  const bool sentencepiece = m.tokenizer.rfind("sentencepiece:", 0) == 0;
  if (m.tokenizer != "byte" && m.tokenizer != "gpt2" && !sentencepiece) {
    throw InputError(args.checkpoint, "attribute tokenizer",
                     "'" + m.tokenizer + "': generate knows the byte, gpt2 and sentencepiece tokenizers");
  }
  if (!sentencepiece && !args.tokenizer_model.empty()) {
    throw InputError(args.checkpoint, "--tokenizer-model",
                     "given, but the data was tokenized by " + m.tokenizer +
                         ", not SentencePiece: leave it out (prep refuses the same)");
  }
  if (sentencepiece && args.tokenizer_model.empty()) {
    throw InputError(args.checkpoint, "--tokenizer-model",
                     "missing: the data was tokenized by " + m.tokenizer +
                         " (give the SentencePiece .model file)");
  }
  const auto tok = make_tokenizer(m.tokenizer, vocab_dir, args.tokenizer_model);
  GptDecoder decoder(cfg);
  restore_stage(reader, cfg, decoder.table(), StageState{decoder.params(), nullptr, nullptr});

  std::vector<uint32_t> ids = tok->encode(args.prompt);
  if (ids.empty()) {
    if (tok->end_of_text() < 0) throw InputError("--prompt", "", "empty (give some text to continue)");
    ids.push_back(static_cast<uint32_t>(tok->end_of_text()));  // GPT-2: a new document
  }
  std::fprintf(stderr, "generate: %s, step %lld, %lld prompt tokens, %d new, temperature %g, top-k %d\n",
               args.checkpoint.c_str(), static_cast<long long>(m.step),
               static_cast<long long>(ids.size()), args.tokens, args.temperature, args.top_k);
  std::fputs(args.prompt.c_str(), stdout);
  const int64_t T = cfg.seq_len;
  // Feeds the last `n` tokens from position 0; the logits after the last.
  const auto refill = [&](int64_t n) {
    decoder.clear();
    const float* logits = nullptr;
    for (auto it = ids.end() - n; it != ids.end(); ++it) {
      logits = decoder.push(static_cast<int32_t>(*it));
    }
    return logits;
  };
  const float* logits = refill(std::min<int64_t>(static_cast<int64_t>(ids.size()), T));
  Rng rng(args.seed, "generate");
  // --logits: what each new token was drawn from, vocab_size floats a row;
  // the file appears only whole.
  std::unique_ptr<DurableWriter> dump;
  if (!args.logits.empty()) dump = std::make_unique<DurableWriter>(args.logits);
  for (int i = 0; i < args.tokens; ++i) {
    if (dump) dump->write(logits, sizeof(float) * static_cast<size_t>(cfg.vocab_size));
    const int64_t next = sample(logits, cfg.vocab_size, args.temperature, args.top_k, rng);
    ids.push_back(static_cast<uint32_t>(next));
    logits = decoder.length() < T ? decoder.push(static_cast<int32_t>(next)) : refill(T / 2 + 1);
    const std::string piece = tok->decode({static_cast<uint32_t>(next)});
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
  }
  std::fputc('\n', stdout);
  if (dump) dump->commit();
  return 0;
}

}  // namespace mpiformer
