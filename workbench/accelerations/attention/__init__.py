"""Attention plugins: which kernel computes a block's attention (dense backends, sparse routing, the policy that
picks a qualified sparse setting). `sparse_routing` and `sparse_kernels` are their shared public helpers."""
