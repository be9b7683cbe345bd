// Input decks: a valid deck with overrides resolves; each class of mistake is
// an InputError naming the file (or the override) and the key.
#include <cctype>
#include <cstdlib>
#include <fstream>
#include <map>

#include "core/error.hpp"
#include "deck.hpp"
#include "train/backend_factory.hpp"
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

TEST(Deck, ABlendsSourcesResolveAndWriteBack) {
  TempDir dir;
  std::string text = kDeck;
  const std::string plain = "[data]\ntrain = \"t.h5\"\n";
  text.replace(text.find(plain), plain.size(),
               "[[data.source]]\npath = \"web/*.h5\"\nweight = 0.7\n"
               "[[data.source]]\nname = \"books\"\npath = \"b.h5\"\nweight = 3\nval = \"bv.h5\"\n");
  const Deck d = load_deck(dir.write("d.toml", text), {});
  ASSERT_EQ(d.data.sources.size(), 2u);
  EXPECT_EQ(d.data.sources[0].name, "web");  // a glob's folder
  EXPECT_DOUBLE_EQ(d.data.sources[0].weight, 0.7);
  EXPECT_EQ(d.data.sources[1].name, "books");
  EXPECT_EQ(d.data.sources[1].val, "bv.h5");
  EXPECT_TRUE(d.data.train.empty());
  // The resolved text holds the tables and resolves to the same deck.
  const Deck again = load_deck(dir.write("r.toml", d.to_toml()), {});
  ASSERT_EQ(again.data.sources.size(), 2u);
  EXPECT_EQ(again.data.sources[0].path, "web/*.h5");
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
  // fp16's loss scale where its gradients can be neither all zero nor all
  // infinite, NaN outside every range.
  for (const char* scale : {"1e-300", "1e-45", "1e-30", "1e-7", "1e300", "nan", "inf"}) {
    e = error_of(path, {"train.precision=\"fp16\"", std::string("train.loss_scale=") + scale});
    EXPECT_TRUE(has(e, "[train] loss_scale") && has(e, "[2^-8, 2^24]")) << scale << ": " << e;
  }
  e = error_of(path, {"train.precision=\"fp16\"", "train.min_loss_scale=1e-30"});
  EXPECT_TRUE(has(e, "[train] min_loss_scale")) << e;
  e = error_of(path, {"nodot=1"});
  EXPECT_TRUE(has(e, "section.key=value")) << e;
  // Each factor within its key's limits, their product (the experts' tensors
  // in the parameter table) not: 1024 experts in each of 128 layers.
  e = error_of(path, {"model.n_layer=128", "model.experts=1024"});
  EXPECT_TRUE(has(e, "[model] experts, [model] n_layer, [model] moe_every") &&
              has(e, "131072 expert MLPs; at most 65536")) << e;
  EXPECT_EQ(error_of(path, {"model.n_layer=128", "model.experts=512"}), "(no error)");
  e = error_of(path, {"train.precision=\"fp8\""});
  EXPECT_TRUE(has(e, "[train] precision") && has(e, "\"fp32\", \"bf16\" or \"fp16\"")) << e;
  e = error_of(path, {"run.device=\"tpu\""});
  EXPECT_TRUE(has(e, "[run] device") && has(e, "\"cuda\"")) << e;
  // Every precision runs on the host.
  for (const char* p : {"\"fp32\"", "\"bf16\"", "\"fp16\""}) {
    const BackendChoice c = choose_backend(
        load_deck(path, {std::string("train.precision=") + p, "run.device=\"cpu\""}), NodePlace{});
    EXPECT_EQ(c.device, Device::kCpu) << p;
  }
  // Loss scaling: fp16 only, a positive scale or "dynamic", a window >= 1.
  const std::vector<std::string> fp16 = {"train.precision=\"fp16\""};
  auto with = [&](const std::string& s) {
    std::vector<std::string> o = fp16;
    o.push_back(s);
    return o;
  };
  e = error_of(path, with("train.loss_scale=0"));
  EXPECT_TRUE(has(e, "[train] loss_scale") && has(e, "[2^-8, 2^24]")) << e;
  e = error_of(path, with("train.loss_scale=-8"));
  EXPECT_TRUE(has(e, "[train] loss_scale") && has(e, "[2^-8, 2^24]")) << e;
  e = error_of(path, with("train.loss_scale=\"static\""));
  EXPECT_TRUE(has(e, "[train] loss_scale") && has(e, "\"dynamic\"")) << e;
  e = error_of(path, with("train.loss_scale_window=-5"));
  EXPECT_TRUE(has(e, "[train] loss_scale_window")) << e;
  e = error_of(path, with("train.loss_scale_window=0"));
  EXPECT_TRUE(has(e, "[train] loss_scale_window")) << e;
  e = error_of(path, with("train.min_loss_scale=0"));
  EXPECT_TRUE(has(e, "[train] min_loss_scale")) << e;
  e = error_of(path, {"train.loss_scale=1024"});
  EXPECT_TRUE(has(e, "[train] loss_scale") && has(e, "\"fp16\" only")) << e;
  e = error_of(path, {"train.precision=\"bf16\"", "train.loss_scale_window=100"});
  EXPECT_TRUE(has(e, "[train] loss_scale_window") && has(e, "\"fp16\" only")) << e;
  EXPECT_EQ(load_deck(path, with("train.loss_scale=1024")).train.loss_scale, 1024.0);
  EXPECT_EQ(load_deck(path, with("train.loss_scale=\"dynamic\"")).train.loss_scale, 0.0);
  e = error_of(dir.write("m.toml", "[model]\nn_layer = 2\n"));
  EXPECT_TRUE(has(e, "m.toml") && has(e, "missing")) << e;
}

// The README's table of keys against the schema: every key documented,
// nothing documented that is not a key, and every literal default the one
// the code uses (Deck's member initialisers).
TEST(Deck, ReadmeTableMatchesTheSchema) {
  std::ifstream in(std::string(MPIFORMER_SOURCE_DIR) + "/README.md");
  ASSERT_TRUE(in.good());
  auto strip = [](std::string s) {
    std::string out;
    for (char c : s)
      if (c != '`') out += c;
    while (!out.empty() && out.back() == ' ') out.pop_back();
    while (!out.empty() && out.front() == ' ') out.erase(out.begin());
    return out;
  };
  auto split = [](const std::string& s) {
    std::vector<std::string> parts;
    for (size_t a = 0, b; a <= s.size(); a = b + 2) {
      b = s.find(", ", a);
      if (b == std::string::npos) b = s.size();
      parts.push_back(s.substr(a, b - a));
    }
    return parts;
  };
  std::map<std::string, std::string> documented;  // "[section] key" -> default cell
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("| `[", 0) != 0) continue;
    std::vector<std::string> cells;
    for (size_t a = 1, b; (b = line.find(" |", a)) != std::string::npos; a = b + 2)
      cells.push_back(strip(line.substr(a, b - a)));
    ASSERT_GE(cells.size(), 3u) << line;
    const std::string section = cells[0].substr(0, cells[0].find(']') + 1);
    const auto names = split(cells[0].substr(section.size() + 1));
    auto defaults = split(cells[2]);
    if (defaults.size() != names.size()) defaults.assign(names.size(), cells[2]);
    for (size_t i = 0; i < names.size(); ++i) documented[section + " " + names[i]] = defaults[i];
  }
  auto literal = [](std::string s) {
    if (const auto p = s.find(" ("); p != std::string::npos) s = s.substr(0, p);  // "0 (off)"
    if (s.size() >= 2 && s.front() == '"' && s.back() == '"') s = s.substr(1, s.size() - 2);
    return s;
  };
  auto same = [](const std::string& a, const std::string& b) {
    char* end_a = nullptr;
    char* end_b = nullptr;
    const double x = std::strtod(a.c_str(), &end_a), y = std::strtod(b.c_str(), &end_b);
    if (!a.empty() && !b.empty() && *end_a == 0 && *end_b == 0) return x == y;
    return a == b;
  };
  for (const DeckKey& k : deck_keys()) {
    const std::string key = "[" + k.section + "] " + k.name;
    ASSERT_TRUE(documented.count(key)) << key << " is missing from README.md's table";
    const std::string cell = documented[key];
    documented.erase(key);
    if (k.required) {
      EXPECT_EQ(cell, "required") << key;
    } else if (!k.default_value.empty()) {
      // A literal in the README must be the code's value; words ("measured",
      // "BLAS default") describe a zero that means "decide at run time".
      const std::string want = literal(k.default_value), got = literal(cell);
      const bool is_literal = got == "true" || got == "false" || cell.front() == '"' ||
                              std::isdigit(static_cast<unsigned char>(got.front()));
      if (is_literal || !same(want, "0")) {
        EXPECT_TRUE(same(got, want)) << key << ": README says " << cell << ", the code " << want;
      }
    } else {
      EXPECT_NE(cell, "required") << key;
    }
  }
  for (const auto& [key, cell] : documented) ADD_FAILURE() << key << " is documented but not a key";
}

}  // namespace
}  // namespace mpiformer::test
