"""Fused-kernel plugins: a block's pointwise glue, projections or epilogues as Triton kernels. The per-family block
forwards they install live with the families (`workbench.models.fused`); `blocks` is their shared public helper."""
