#include <mpi.h>

#include <filesystem>

#include "commands.hpp"
#include "core/error.hpp"
#include "core/mpi_check.hpp"
#include "deck.hpp"
#include "parallel/input_agreement.hpp"
#include "train/stop_request.hpp"
#include "train/trainer.hpp"

namespace mpiformer {

int run_train(const TrainArgs& args, int rank, int world) {
  // Rank 0 reads the deck and every rank parses its bytes: a deck edited
  // between node launches, or another file of that name on some node, can
  // not give ranks different models.
  std::string text, cwd = std::filesystem::current_path().string();
  agree_on_input_errors(MPI_COMM_WORLD, [&] {
    if (rank == 0) text = read_deck_text(args.deck);
  });
  broadcast_string(MPI_COMM_WORLD, text, 0);
  // Relative paths mean what they mean in rank 0's working directory. Where
  // any rank's differs, every rank makes them absolute: collective file
  // opens (the checkpoint's) need the same name on every rank.
  const std::string mine = cwd;
  broadcast_string(MPI_COMM_WORLD, cwd, 0);
  int differs = cwd != mine ? 1 : 0;
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &differs, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD));
  Deck deck;
  agree_on_input_errors(MPI_COMM_WORLD, [&] {
    deck = parse_deck(text, args.deck, args.overrides);
    if (differs != 0) rebase_relative_paths(deck, cwd);
    resolve_model_init(deck);
  });
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
