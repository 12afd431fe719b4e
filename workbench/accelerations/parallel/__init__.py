"""Multi-GPU plugins: context parallelism of the denoiser and the parallel VAE decode (`parallel_decode`)."""
