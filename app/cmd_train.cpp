#include "commands.hpp"
#include "deck.hpp"
#include "train/trainer.hpp"

namespace mpiformer {

int run_train(const TrainArgs& args, int rank, int world) {
  Trainer trainer(load_deck(args.deck, args.overrides), rank, world);
  trainer.run();
  return 0;
}

}  // namespace mpiformer
