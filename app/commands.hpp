// The subcommands of the mpiformer executable. Each returns the process exit
// code and throws InputError for anything the user must fix.
#pragma once
#include <string>
#include <vector>

namespace mpiformer {

struct TrainArgs {
  std::string deck;
  std::vector<std::string> overrides;
};
int run_train(const TrainArgs& args, int rank, int world);

struct PrepArgs {
  std::string tokenizer = "byte";
  std::string vocab_dir;
  double val_fraction = 0.0;
  std::string output;
  std::vector<std::string> inputs;
};
int run_prep(const PrepArgs& args, int rank);
// Where `prep` writes the validation split for output path `out`.
std::string val_output_path(const std::string& out);

struct InspectArgs {
  std::string file;
  int tokens = 32;
};
int run_inspect(const InspectArgs& args, int rank);

}  // namespace mpiformer
