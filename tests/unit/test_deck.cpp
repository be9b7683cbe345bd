// Input decks: a valid deck with overrides resolves; each class of mistake is
// an InputError naming the file (or the override) and the key.
#include "core/error.hpp"
#include "deck.hpp"
#include "reference.hpp"
#include "temp_dir.hpp"

namespace mpiformer::test {
namespace {

const char* kDeck = R"([model]
n_layer = 2
n_head = 2
n_embd = 16
seq_len = 8
[data]
train = "t.h5"
[train]
steps = 10
global_batch = 8
micro_batch = 2
lr = 1e-3
)";

std::string error_of(const std::string& path, const std::vector<std::string>& sets = {}) {
  try {
    load_deck(path, sets);
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Deck, ResolvesDefaultsAndOverrides) {
  TempDir dir;
  const auto path = dir.write("d.toml", kDeck);
  const Deck d = load_deck(path, {"train.lr=2e-3", "data.val=v.h5", "train.micro_batch=4"});
  EXPECT_EQ(d.model.n_layer, 2);
  EXPECT_DOUBLE_EQ(d.train.lr, 2e-3);
  EXPECT_DOUBLE_EQ(d.train.min_lr, 2e-4);  // lr / 10 by default
  EXPECT_EQ(d.data.val, "v.h5");
  EXPECT_EQ(d.grad_accum(), 2);
  // The resolved text is itself a valid deck that resolves the same way.
  const auto again = load_deck(dir.write("r.toml", d.to_toml()), {});
  EXPECT_EQ(again.to_toml(), d.to_toml());
}

TEST(Deck, MistakesNameFileAndKey) {
  TempDir dir;
  const auto path = dir.write("d.toml", kDeck);
  auto has = [](const std::string& msg, const std::string& part) {
    return msg.find(part) != std::string::npos;
  };
  EXPECT_TRUE(has(error_of(dir.file("none.toml")), "none.toml"));
  EXPECT_TRUE(has(error_of(dir.write("bad.toml", "[model\nx=1")), "not valid TOML"));
  auto e = error_of(dir.write("u.toml", std::string(kDeck) + "warmup = 3\n"));
  EXPECT_TRUE(has(e, "u.toml") && has(e, "[train] warmup") && has(e, "unknown key")) << e;
  e = error_of(dir.write("s.toml", std::string(kDeck) + "[optim]\nx = 1\n"));
  EXPECT_TRUE(has(e, "optim") && has(e, "unknown section")) << e;
  e = error_of(path, {"train.steps=\"ten\""});
  EXPECT_TRUE(has(e, "[train] steps") && has(e, "expected an integer, got string")) << e;
  e = error_of(path, {"train.micro_batch=0"});
  EXPECT_TRUE(has(e, "--set train.micro_batch=0") && has(e, "[train] micro_batch")) << e;
  e = error_of(path, {"train.micro_batch=3"});
  EXPECT_TRUE(has(e, "[train] global_batch") && has(e, "multiple")) << e;
  e = error_of(path, {"model.n_head=3"});
  EXPECT_TRUE(has(e, "[model] n_embd")) << e;
  e = error_of(path, {"parallel.pp=3"});
  EXPECT_TRUE(has(e, "[parallel] pp")) << e;
  e = error_of(path, {"train.min_lr=1"});
  EXPECT_TRUE(has(e, "[train] min_lr")) << e;
  e = error_of(path, {"nodot=1"});
  EXPECT_TRUE(has(e, "section.key=value")) << e;
  e = error_of(path, {"train.precision=\"fp16\""});
  EXPECT_TRUE(has(e, "[train] precision") && has(e, "\"fp32\" or \"bf16\"")) << e;
  e = error_of(path, {"run.device=\"tpu\""});
  EXPECT_TRUE(has(e, "[run] device") && has(e, "\"cuda\"")) << e;
  e = error_of(path, {"train.precision=\"bf16\"", "run.device=\"cpu\""});
  EXPECT_TRUE(has(e, "[train] precision") && has(e, "GPU back end only")) << e;
  e = error_of(dir.write("m.toml", "[model]\nn_layer = 2\n"));
  EXPECT_TRUE(has(e, "m.toml") && has(e, "missing")) << e;
}

}  // namespace
}  // namespace mpiformer::test
