#include <mpi.h>

#include "commands.hpp"
#include "core/error.hpp"
#include "deck.hpp"
#include "parallel/input_agreement.hpp"
#include "train/stop_request.hpp"
#include "train/trainer.hpp"

namespace mpiformer {

int run_train(const TrainArgs& args, int rank, int world) {
  Deck deck;
  // The deck may be missing on one node only: agree before going on.
  agree_on_input_errors(MPI_COMM_WORLD, [&] { deck = load_deck(args.deck, args.overrides); });
  // Before anything slow, so an early SIGTERM is not fatal either.
  install_stop_handlers();
  Trainer trainer(std::move(deck), rank, world);
  try {
    if (trainer.run().stopped_to_requeue) return kExitRequeue;
  } catch (const InputError& e) {
    // Past set-up an input error is one rank's (a shard damaged mid-run):
    // the others are inside collectives, so it must abort the job.
    throw SystemError(e.what());
  }
  return 0;
}

}  // namespace mpiformer
