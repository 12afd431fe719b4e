"""Triton kernels, each beside its pure-torch reference (imported as `workbench.kernels`)."""
