// Blocking copies between host and device for the GPU tests (the product
// copies on its streams, through the op set).
#pragma once
#include <cstddef>

namespace mpiformer::cuda {

void copy_to_device(void* dst, const void* src, size_t bytes);
void copy_to_host(void* dst, const void* src, size_t bytes);

}  // namespace mpiformer::cuda
