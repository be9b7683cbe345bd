# The CUDA back end's sources, for its library (kernels/cuda) and for the
# CPU emulation that compiles the same files (tests/emulation).
set(MPIFORMER_CUDA_KERNELS embedding layernorm rmsnorm rope swiglu moe_dispatch moe_router matmul attention ring_attention ring_attention_tiles gelu residual crossentropy adamw
    reduce device fill grad_compression)   # each NAME.cu
set(MPIFORMER_CUDA_DEVICE_HEADERS column_sums device_math elementwise norm_rows warp_mma)   # each NAME.cuh
set(MPIFORMER_CUDA_HOST_SOURCES context offload_copies)   # each NAME.cpp: host code of the op set
