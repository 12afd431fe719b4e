"""A torchrun worker for test_context_parallel: the 2-rank band decode against one process's decodes, in float.

Run by the test as `torchrun --nproc-per-node 2 -m tests.accelerations.parallel.parallel_decode_worker OUT SEED`; rank 0
writes OUT (JSON). Not a test module itself (no `test_` prefix)."""

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from workbench import Session
from workbench.accelerations.parallel.parallel_decode import band_tiling
from workbench.distributed import exit_worker, finish_worker, init_worker

LATENTS = (1, 16, 2, 11, 7)  # (B, C, T, H, W): odd height and width, two latent frames (5 video frames)
OVERLAP = 3


def mark(stage: str) -> None:
    """A line on stderr per stage, so that a worker that dies shows in the test's message how far it got."""
    print(f"parallel_decode_worker rank {dist.get_rank()}: {stage}", file=sys.stderr, flush=True)


def main(out: Path, seed: int) -> None:
    init_worker("cpu", timeout_s=120)
    try:
        mark("started")
        session = Session.open("tiny-wan", device="cpu", seed=0)
        vae = session.model.pipeline.vae
        z = torch.randn(*LATENTS, generator=torch.Generator().manual_seed(seed))  # the same on every rank
        with torch.inference_mode():
            untiled = vae.decode(z).sample
        config = {"relayout": "reference", "parallel_decode": "bands", "decode_overlap": OVERLAP}
        session.accelerate({"context_parallel": config})
        handle = next(h for h in session._handles if h.spec.name == "context_parallel")
        handle.begin_request(0, 1)
        with torch.inference_mode():
            parallel = vae.decode(z).sample
            parallel_tuple = vae.decode(z, return_dict=False)[0]
        report = handle.report()
        mark("decoded in bands")
        session.accelerate({})
        restored = "_decode" not in vae.__dict__ and not vae.use_tiling
        tiling = band_tiling(vae, LATENTS[3], LATENTS[4], dist.get_world_size(), OVERLAP)
        with torch.inference_mode():
            after = vae.decode(z).sample
            vae.enable_tiling(**tiling.to_dict())
            tiled = vae.decode(z).sample  # diffusers' own tiled decode, in this one process
        vae.use_tiling = False
        others = [torch.empty_like(parallel) for _ in range(dist.get_world_size())]
        dist.all_gather(others, parallel.contiguous())
        reports = [None] * dist.get_world_size()
        dist.all_gather_object(reports, report)
        mark("gathered")
        if dist.get_rank() == 0:
            record = {
                "bitwise_equal_one_process_tiled": bool(torch.equal(parallel, tiled)),
                "return_dict_false_equal": bool(torch.equal(parallel, parallel_tuple)),
                "ranks_bitwise_equal": all(torch.equal(o, others[0]) for o in others),
                "max_abs_vs_untiled": float((parallel - untiled).abs().max()),
                "shape": list(parallel.shape),
                "untiled_shape": list(untiled.shape),
                "uninstall_restored": bool(restored and torch.equal(after, untiled)),
                "tiling": tiling.to_dict(),
                "reports": reports,
            }
            temporary = out.with_suffix(".tmp")
            temporary.write_text(json.dumps(record))
            temporary.rename(out)
            mark("wrote the record")
        dist.barrier()  # no rank tears its gloo connections down while another still uses them
        mark("done")
    finally:
        finish_worker()


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]))
    exit_worker(0)
