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
  // Set-up's input errors are every rank's (agreed on): they propagate and
  // every rank exits with the message once.
  Trainer trainer(std::move(deck), rank, world);
  try {
    if (trainer.run().stopped_to_requeue) return kExitRequeue;
  } catch (const AgreedInputError&) {
    throw;  // every rank stops here with it: exit 2, the message once
  } catch (const std::exception& e) {
    // Past set-up any failure is one rank's (even an input error: a shard
    // damaged mid-run) while the others are inside collectives: end the
    // job from here, with the trainer (streams, communicators) untouched.
    return fail(e, rank, world);
  }
  return 0;
}

}  // namespace mpiformer
