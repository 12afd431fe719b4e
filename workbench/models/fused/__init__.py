"""The families' transformer-block forwards with the workbench's pointwise kernels (diffusers 0.42.x forwards, op
for op, with the glue as Triton kernels). Each family names its entries in its `Family.fused`; the fused plugins
(`workbench.accelerations.fused`) install them. `guards` holds the per-call checks they share."""
