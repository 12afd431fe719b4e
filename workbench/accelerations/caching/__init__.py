"""Caching plugins: reuse work across denoising steps, either exactly (invariant tensors: text K/V, AdaLN tables)
or approximately (feature caches that skip blocks or the whole stack). `diffusers_hooks` is their shared public
helper for the caches built on diffusers' hooks."""
