# 2026-11-30 call 2, staging (carries `.fa1` only): the FlashAttention-4 bundle (flash-attn-4 4.0.0b36,
# nvidia-cutlass-dsl 4.8.1 + libs-base + libs-cu13, quack-kernels, apache-tvm-ffi, torch-c-dlpack-ext, unpacked and
# tar+xz'd: 71 MB) is over the 64 MiB a call carries, so it travels in two parts; this leaves part 1 outside the tree
mkdir -p ../fastage /tmp/fastage && cp .fa1/fa.part.00 ../fastage/ && cp .fa1/fa.part.00 /tmp/fastage/ && ls -la ../fastage /tmp/fastage
