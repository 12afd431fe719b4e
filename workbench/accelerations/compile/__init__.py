"""Compilation plugins: torch.compile of the repeated transformer blocks."""
