"""Quantization plugins: lower-precision weights and GEMMs (a named trade of quality for speed)."""
