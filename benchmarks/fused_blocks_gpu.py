"""fused_block_ops on the GPU: is each fused block `torch.equal` to the stock diffusers block, and what does one
block forward cost each way (issue 6).

Arms, each with random weights (diffusers' own initialisation, modulation tables random) and random inputs, bf16:
- `wan-1.3b`: one `WanTransformerBlock` at Wan2.1-1.3B's width (1536, 12 heads, FFN 8960), 32,760 tokens
  (81 x 480 x 832), 512 text tokens, float32 rotary tables (as the workbench's bf16 sessions hold them); variants
  `rope=auto` (the rotary kernel in attn1) and `rope=off`. `wan-1.3b-f64-tables`: the same with the float64
  tables `WanRotaryPosEmbed` builds, `rope=auto` only.
- `ltx2`: block 0 of a one-layer `LTX2VideoTransformer3DModel` at LTX-2's widths (video 32 x 128, audio 32 x 64),
  121 x 512 x 768 (6,144 video tokens), 126 audio tokens, 1,024 text tokens; its inputs are captured from one
  model forward (so rotary tables and modulation tensors are the model's own).
- `h3`: block 0 of a one-layer `MiniMaxH3Transformer3DModel` at MiniMax-H3's widths (5376, 56 x 128, FFN 14336),
  a 124 x 768 x 1344-sized packed sequence (37,296 video, 207 audio, 256 text rows), inputs captured likewise.

Per arm: `equal` (torch.equal of every output, per variant), the number of differing elements, the receipt of
the checked call (kernels counted, fallbacks named), and the median of `repeats` timed forwards (CUDA events;
stock and variants interleaved round by round after `warmup` untimed rounds). An arm that fails records its
error and the others still run. `python -m benchmarks.fused_blocks_gpu` (about 1-2 minutes on an H200) writes
`$OUT/<date>-fused-blocks-gpu.json` (benchmarks/common.py envelope). `--smoke` runs tiny widths on the CPU under
`TRITON_INTERPRET=1`, to check the script itself; its timings mean nothing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch

from benchmarks.common import envelope, write
from workbench.accelerations.base import Receipt
from workbench.models.fused import h3 as _fused_h3
from workbench.models.fused import ltx2 as _fused_ltx2
from workbench.models.fused import wan as _fused_wan

DTYPE = torch.bfloat16
WAN_KEEP = ("scale_shift_table", "norm1", "norm2", "norm3")  # WanTransformer3DModel._keep_in_fp32_modules, in a block


def _cast(model: torch.nn.Module, keep: tuple[str, ...] = ()) -> torch.nn.Module:
    """As from_pretrained(torch_dtype=bf16): `_keep_in_fp32_modules` names stay float32; tables random."""
    with torch.no_grad():
        for name, tensor in model.named_parameters():
            if "scale_shift_table" in name:
                tensor.normal_(0.0, 0.5)
            tensor.data = tensor.data.to(torch.float32 if set(keep) & set(name.split(".")) else DTYPE)
    return model.eval()


def _captured(model: torch.nn.Module, block: torch.nn.Module, call: Callable[[], Any]) -> tuple[tuple, dict]:
    seen = []
    hook = block.register_forward_pre_hook(lambda m, a, k: seen.append((a, k)), with_kwargs=True)
    try:
        with torch.no_grad():
            call()
    finally:
        hook.remove()
    return seen[0]


def _wan(device: torch.device, smoke: bool, g: torch.Generator, tables: torch.dtype = torch.float32) -> dict[str, Any]:
    from diffusers.models.transformers.transformer_wan import WanRotaryPosEmbed, WanTransformerBlock

    dim, heads, ffn, grid, text = (32, 2, 64, (3, 6, 10), 7) if smoke else (1536, 12, 8960, (21, 60, 104), 512)
    with device:
        block = _cast(WanTransformerBlock(dim, ffn, heads, cross_attn_norm=True), WAN_KEEP)
        rope = WanRotaryPosEmbed(dim // heads, (1, 2, 2), 1024)
    frames, height, width = grid
    tokens = frames * (height // 2) * (width // 2)
    # WanRotaryPosEmbed builds float64 tables; the workbench's bf16 sessions hold them in float32 (`rope` is a
    # keep-in-fp32 module): both are arms
    rotary = tuple(f.to(tables) for f in rope(torch.empty(1, 16, frames, height, width, device=device)))
    args = (
        torch.randn(1, tokens, dim, device=device, generator=g).to(DTYPE),
        torch.randn(1, text, dim, device=device, generator=g).to(DTYPE),
        (torch.randn(1, 6, dim, device=device, generator=g) * 0.1).to(DTYPE),
        rotary,
    )
    modes = ("auto", "off") if tables == torch.float32 else ("auto",)
    variants = {
        f"rope={mode}": (lambda r, mode=mode: _fused_wan.forward_for(block, r, {"rope": mode})) for mode in modes
    }
    shape = {"tokens": tokens, "dim": dim, "heads": heads, "ffn": ffn, "text": text, "rotary_tables": str(tables)}
    return {"block": block, "args": args, "kwargs": {}, "variants": variants, "shape": shape}


def _ltx2(device: torch.device, smoke: bool, g: torch.Generator) -> dict[str, Any]:
    from diffusers import LTX2VideoTransformer3DModel

    if smoke:
        widths = {"num_attention_heads": 2, "attention_head_dim": 8, "cross_attention_dim": 16, "audio_num_attention_heads": 2,
                  "audio_attention_head_dim": 4, "audio_cross_attention_dim": 8, "caption_channels": 12, "in_channels": 4,
                  "out_channels": 4, "audio_in_channels": 4, "audio_out_channels": 4}  # fmt: skip
        latent, audio_frames, text = (2, 3, 4), 5, 7
    else:  # LTX-2's transformer widths (diffusers defaults), one layer
        widths = {}
        latent, audio_frames, text = (16, 16, 24), 126, 1024
    with device:
        model = _cast(LTX2VideoTransformer3DModel(num_layers=1, rope_type="split", **widths))
    config = model.config
    frames, height, width = latent
    tokens = frames * height * width

    def call() -> Any:
        return model(
            hidden_states=torch.randn(1, tokens, config.in_channels, device=device, generator=g).to(DTYPE),
            audio_hidden_states=torch.randn(1, audio_frames, config.audio_in_channels, device=device, generator=g).to(DTYPE),
            encoder_hidden_states=torch.randn(1, text, config.caption_channels, device=device, generator=g).to(DTYPE),
            audio_encoder_hidden_states=torch.randn(1, text, config.caption_channels, device=device, generator=g).to(DTYPE),
            timestep=torch.tensor([612.0], device=device),
            num_frames=frames, height=height, width=width, audio_num_frames=audio_frames, return_dict=False,
        )  # fmt: skip

    block = model.transformer_blocks[0]
    args, kwargs = _captured(model, block, call)
    variants = {"fused": lambda r: _fused_ltx2.forward_for(block, r, {})}
    shape = {
        "video_tokens": tokens,
        "audio_tokens": audio_frames,
        "text": text,
        "dim": block.norm1.dim[0],
        "audio_dim": block.audio_norm1.dim[0],
    }
    return {"block": block, "args": args, "kwargs": kwargs, "variants": variants, "shape": shape}


def _h3(device: torch.device, smoke: bool, g: torch.Generator) -> dict[str, Any]:
    from diffusers import MiniMaxH3Transformer3DModel

    if smoke:
        widths = {"num_attention_heads": 2, "attention_head_dim": 16, "hidden_size": 24, "ffn_dim": 40, "in_channels": 4,
                  "audio_in_channels": 4, "text_dim": 12, "freq_dim": 8, "time_embed_hidden_dim": 24, "time_embed_dim": 16,
                  "rope_freq_dim": 2}  # fmt: skip
        video, audio, text = 30, 5, 6
    else:  # MiniMax-H3's widths (diffusers defaults), one layer
        widths = {}
        video, audio, text = 37 * 24 * 42, 207, 256
    with device:
        model = MiniMaxH3Transformer3DModel(num_layers=1, num_refiner_layers=1, **widths)
    _cast(model, tuple(model._keep_in_fp32_modules))
    config = model.config
    total = video + audio + text
    order = torch.randperm(total, device=device, generator=g)
    video_indices, audio_indices, text_indices = order[:video], order[video : video + audio], order[video + audio :]
    tags = torch.empty(total, dtype=torch.long, device=device)
    tags[video_indices], tags[audio_indices], tags[text_indices] = 0, 2, 1
    patch = config.in_channels * 4

    def call() -> Any:
        return model(
            hidden_states=torch.randn(1, video, patch, device=device, generator=g),
            audio_hidden_states=torch.randn(1, audio, config.audio_in_channels, device=device, generator=g),
            encoder_hidden_states=torch.randn(1, text, config.text_dim, device=device, generator=g).to(DTYPE),
            timestep=torch.tensor([0.7, 0.0], device=device),
            timestep_indices=torch.randint(0, 2, (total,), device=device, generator=g),
            token_tags=tags,
            position_ids=torch.randint(0, 48, (total, 3), device=device, generator=g),
            video_indices=video_indices, audio_indices=audio_indices, text_indices=text_indices, return_dict=False,
        )  # fmt: skip

    block = model.transformer_blocks[0]
    args, kwargs = _captured(model, block, call)
    variants = {"fused": lambda r: _fused_h3.forward_for(block, r, {}, {})}
    shape = {"rows": total, "video": video, "audio": audio, "text": text, "hidden": config.hidden_size}
    return {"block": block, "args": args, "kwargs": kwargs, "variants": variants, "shape": shape}


ARMS = {
    "wan-1.3b": _wan,
    "wan-1.3b-f64-tables": lambda device, smoke, g: _wan(device, smoke, g, torch.float64),
    "ltx2": _ltx2,
    "h3": _h3,
}


def _outputs(value: Any) -> list[torch.Tensor]:
    return [value] if isinstance(value, torch.Tensor) else list(value)


def _time(fn: Callable[[], Any], device: torch.device) -> float:
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)
    begin = time.perf_counter()
    fn()
    return (time.perf_counter() - begin) * 1e3


def _measure(case: dict[str, Any], device: torch.device, warmup: int, repeats: int) -> dict[str, Any]:
    block, args, kwargs = case["block"], case["args"], case["kwargs"]
    forwards, result = {}, {"shape": case["shape"], "variants": {}}
    with torch.no_grad():
        want = _outputs(block(*args, **kwargs))
        for name, build in case["variants"].items():
            receipt = Receipt(("adaln_modulate_calls",))
            forward = build(receipt)
            got = _outputs(forward(*args, **kwargs))
            differing = [int((g != w).sum()) if g.shape == w.shape else -1 for g, w in zip(got, want, strict=True)]
            result["variants"][name] = {
                "equal": all(torch.equal(g, w) for g, w in zip(got, want, strict=True)),
                "differing_elements": differing,
                "max_abs_difference": [
                    float((g.float() - w.float()).abs().max()) for g, w in zip(got, want, strict=True)
                ],
                "receipt": receipt.to_dict(),
            }
            forwards[name] = forward
        timings: dict[str, list[float]] = {"stock": [], **{name: [] for name in forwards}}
        arms = {
            "stock": lambda: block(*args, **kwargs),
            **{n: (lambda f=f: f(*args, **kwargs)) for n, f in forwards.items()},
        }
        for round_index in range(warmup + repeats):
            for name, fn in arms.items():
                elapsed = _time(fn, device)
                if round_index >= warmup:
                    timings[name].append(elapsed)
    stock_ms = statistics.median(timings["stock"])
    result["stock_ms"] = stock_ms
    result["stock_ms_all"] = timings["stock"]
    for name in forwards:
        ms = statistics.median(timings[name])
        result["variants"][name].update(ms=ms, ms_all=timings[name], speedup=stock_ms / ms)
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny widths on the CPU under TRITON_INTERPRET=1")
    parser.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated subset of {list(ARMS)}")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=10)
    options = parser.parse_args(argv)
    if options.smoke:
        os.environ.setdefault("TRITON_INTERPRET", "1")
        device = torch.device("cpu")
    elif torch.cuda.is_available():
        device = torch.device("cuda")
    else:
        raise RuntimeError("fused_blocks_gpu: needs a CUDA device (or --smoke for a CPU check of the script)")
    names = [n.strip() for n in options.arms.split(",") if n.strip()]
    unknown = sorted(set(names) - set(ARMS))
    if unknown:
        raise ValueError(f"--arms: unknown {unknown}; allowed: {list(ARMS)}")
    arms, ratios, shapes = {}, {}, {}
    for name in names:
        started = time.perf_counter()
        try:
            g = torch.Generator(device).manual_seed(0)
            case = ARMS[name](device, options.smoke, g)
            shapes[name] = case["shape"]
            arms[name] = _measure(case, device, options.warmup, options.repeats)
            for variant, row in arms[name]["variants"].items():
                ratios[f"{name}/{variant}"] = row["speedup"]
            summary = {v: (row["equal"], round(row["speedup"], 3)) for v, row in arms[name]["variants"].items()}
            print(f"{name}: stock {arms[name]['stock_ms']:.3f} ms; (equal, speedup) {summary}", flush=True)
        except Exception as error:  # one arm's failure must not hide the others
            arms[name] = {"error": repr(error), "traceback": traceback.format_exc()[-4000:]}
            print(f"{name}: error {error!r}", flush=True)
        finally:
            arms.setdefault(name, {})["seconds"] = time.perf_counter() - started
            case = None
            if device.type == "cuda":
                torch.cuda.empty_cache()
    notes = (
        "one block forward, stock diffusers 0.42.1 vs fused_block_ops' forward, bf16, random weights; equal = "
        "torch.equal of every output; ms = median over repeats, CUDA events, arms interleaved per round"
        + ("; SMOKE RUN on CPU under the Triton interpreter: timings meaningless" if options.smoke else "")
    )
    record = envelope("fused-blocks-gpu" + ("-smoke" if options.smoke else ""), shapes, arms, ratios, notes)
    write(record, record["what"])
    return record


if __name__ == "__main__":
    main()
