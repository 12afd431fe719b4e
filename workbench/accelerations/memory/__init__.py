"""Memory plugins: where weights live between calls (offload and prefetch)."""
