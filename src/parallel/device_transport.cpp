#include "parallel/device_transport.hpp"

#include "parallel/host_staged_communicator.hpp"
#include "parallel/local_device_communicator.hpp"
#ifdef MPIFORMER_HAVE_NCCL
#include "parallel/nccl_communicator.hpp"
#endif

namespace mpiformer {

std::unique_ptr<Communicator> device_transport(MpiCommunicator& group, void* stream,
                                               std::string* how) {
  auto say = [how](const char* words) {
    if (how != nullptr) *how = words;
  };
  if (group.size() == 1) {
    say("local, on the compute stream");
    return std::make_unique<LocalDeviceCommunicator>(stream);
  }
#ifdef MPIFORMER_HAVE_NCCL
  if (!group_shares_a_gpu(group)) {
    say("NCCL");
    return std::make_unique<NcclCommunicator>(group, stream);
  }
  say("MPI through host memory; ranks share a GPU");
#else
  say("MPI through host memory; built without NCCL");
#endif
  return std::make_unique<HostStagedCommunicator>(group, stream);
}

}  // namespace mpiformer
