// What `mpiformer plan --explain` prints beside the predicted timeline:
// the model state's bytes per parameter at each ZeRO stage (the number
// users compare with other systems' papers), and the assumptions behind
// the predicted step time that nothing on the machine measured, so a
// layout that promises much more than published runs says how sure it is.
#pragma once
#include <string>
#include <vector>

#include "deck.hpp"
#include "machine_file.hpp"
#include "plan/step_prediction.hpp"

namespace mpiformer {

// Device bytes of weights, gradients and AdamW state per parameter of the
// fullest stage, for this deck's layout at zero 0, 1, 2 and 3 (the rest
// of the deck as given).
std::vector<double> state_bytes_per_parameter(const Deck& deck, Device device);

// The lines --explain prints for `p` (the deck's layout is p's).
std::vector<std::string> explain_lines(const Deck& deck, const MachineSpec& machine,
                                       const Prediction& p);

}  // namespace mpiformer
