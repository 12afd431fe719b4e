"""The Jupyter UI over the public API (imported as `workbench.widgets`)."""
