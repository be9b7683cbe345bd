#include "parallel/process_grid.hpp"

#include "core/error.hpp"
#include "core/mpi_check.hpp"

namespace mpiformer {

ProcessGrid::ProcessGrid(int data_dp, int pp, int tp, MPI_Comm world, int kv_share, int ep, int cp)
    : dp_(data_dp * cp), pp_(pp), tp_(tp), ep_(ep), cp_(cp) {
  MPIFORMER_CHECK(cp >= 1, "cp " + std::to_string(cp) + " is not a rank count");
  const int dp = dp_;
  int size = 0;
  MPI_CHECK(MPI_Comm_rank(world, &world_rank_));
  MPI_CHECK(MPI_Comm_size(world, &size));
  MPIFORMER_CHECK(dp * pp * tp == size,
                  "grid " + std::to_string(dp) + " x " + std::to_string(pp) + " x " +
                      std::to_string(tp) + " does not match " + std::to_string(size) + " ranks");
  place_ = grid_place(world_rank_, dp, tp);
  const int stage = place_.stage, d = place_.dp_rank, t = place_.tp_rank;
  MPI_Comm dup = MPI_COMM_NULL, dpc = MPI_COMM_NULL, ppc = MPI_COMM_NULL, tpc = MPI_COMM_NULL,
           stc = MPI_COMM_NULL, tied = MPI_COMM_NULL, kv = MPI_COMM_NULL, epc = MPI_COMM_NULL,
           edc = MPI_COMM_NULL, hsc = MPI_COMM_NULL, cpc = MPI_COMM_NULL;
  MPIFORMER_CHECK(ep >= 1 && dp % ep == 0,
                  "ep " + std::to_string(ep) + " does not divide dp " + std::to_string(dp));
  MPIFORMER_CHECK(kv_share >= 1 && tp % kv_share == 0,
                  "kv_share " + std::to_string(kv_share) + " does not divide tp " + std::to_string(tp));
  MPI_CHECK(MPI_Comm_dup(world, &dup));
  MPI_CHECK(MPI_Comm_split(world, stage * tp + t, d, &dpc));
  MPI_CHECK(MPI_Comm_split(world, d * tp + t, stage, &ppc));
  MPI_CHECK(MPI_Comm_split(world, stage * dp + d, t, &tpc));
  MPI_CHECK(MPI_Comm_split(world, stage, d * tp + t, &stc));
  const bool holds_wte = pp > 1 && (stage == 0 || stage == pp - 1);
  MPI_CHECK(MPI_Comm_split(world, holds_wte ? d * tp + t : MPI_UNDEFINED, stage, &tied));
  MPI_CHECK(MPI_Comm_split(world, kv_share > 1 ? (stage * dp + d) * tp + t / kv_share : MPI_UNDEFINED,
                           t, &kv));
  // Expert parallelism: replicas [g ep, (g + 1) ep) of the stage and slice
  // share out the experts; replicas ep apart hold the same ones.
  MPI_CHECK(MPI_Comm_split(world, (stage * tp + t) * (dp / ep) + d / ep, d % ep, &epc));
  MPI_CHECK(MPI_Comm_split(world, (stage * tp + t) * ep + d % ep, d / ep, &edc));
  MPI_CHECK(MPI_Comm_split(world, stage * ep + d % ep, (d / ep) * tp + t, &hsc));
  MPI_CHECK(MPI_Comm_split(world, (stage * data_dp + d / cp) * tp + t, d % cp, &cpc));
  cp_comm_ = std::make_unique<MpiCommunicator>(cpc);
  world_comm_ = std::make_unique<MpiCommunicator>(dup);
  ep_comm_ = std::make_unique<MpiCommunicator>(epc);
  expert_dp_comm_ = std::make_unique<MpiCommunicator>(edc);
  holders_comm_ = std::make_unique<MpiCommunicator>(hsc);
  dp_comm_ = std::make_unique<MpiCommunicator>(dpc);
  pp_comm_ = std::make_unique<MpiCommunicator>(ppc);
  tp_comm_ = std::make_unique<MpiCommunicator>(tpc);
  stage_comm_ = std::make_unique<MpiCommunicator>(stc);
  tied_comm_ = std::make_unique<MpiCommunicator>(tied);
  kv_comm_ = std::make_unique<MpiCommunicator>(kv);
}

}  // namespace mpiformer
