"""The benchmark harness: `python -m benchmarks list | run SCENARIO ... [--smoke] [--out DIR] [--rounds N] | docs`.

- `scenarios/`: one small module per named scenario (what it measures, at which shape, against which baseline);
- `workbench.evidence.timing`: the one timing code (CUDA events with the synchronised and queued clocks, CUDA-graph
  replay, perf_counter on a CPU, A/B/A rounds with the paired-ratio CI95 of `workbench.evidence.stats`);
- `envelope.py`: the one results envelope, `results/<scenario>.json` (the latest per scenario; git keeps history);
- `docs.py`: docs/measurements.md, generated from the results files, with `results/gpu-tests/` (runs of the
  `gpu`-marked tests) and `results/probes/` (lab probes and records older than the harness) beside them.
"""
