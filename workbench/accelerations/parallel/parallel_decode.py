"""The Wan VAE decode over a process group: diffusers' own tiled decode, its tiles spread over the ranks.

Why tiles and not a split with halo rows that would equal the untiled decode: the Wan decoder's mid block
holds a `WanAttentionBlock`, single-head self-attention over every position of a frame, so every output
pixel depends on every latent pixel of its frame (and, through the causal feature cache, of every earlier
frame). No finite halo covers that; a height split is exact only if that attention is itself computed over
the whole frame (replicated or exchanged), which this module does not do.

What it does instead: diffusers' `AutoencoderKLWan.tiled_decode` (0.42.1) decodes overlapping spatial tiles
independently and blends them. Here each rank decodes the tiles it owns (the same code on the same tile
shapes as one process would run), the decoded tiles are broadcast from their owners, and every rank blends
them with the VAE's own `blend_v` / `blend_h` in diffusers' order. Contract: bit-equal to one process's
`vae.tiled_decode` with the same tiling (tested on gloo/CPU with torch.equal; on GPUs the benchmark checks it),
and `approximate` against the untiled decode (tiles see only their own part of a frame in the mid-block
attention, and their cut edges are zero-padded; blending hides the seams; the benchmark measures how close).

`band_tiling` chooses the tiles for N ranks: N horizontal bands over the full width, stride ceil(H/N) latent
rows and `overlap` more rows per tile (diffusers' tiles start every stride rows, so the first band carries the
overlap and the last is the shortest: rank 0 decodes (ceil(H/N) + overlap) / H of the frame).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.distributed as dist
from diffusers import AutoencoderKLWan
from diffusers.models.autoencoders.vae import DecoderOutput

DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


@dataclass(frozen=True)
class Tiling:
    """diffusers' tile settings in sample pixels (the arguments of `AutoencoderKLWan.enable_tiling`)."""

    tile_sample_min_height: int
    tile_sample_min_width: int
    tile_sample_stride_height: int
    tile_sample_stride_width: int

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


def check_vae(vae: Any) -> None:
    """The parallel decode mirrors diffusers' Wan tiled decode without patchification (Wan2.1 / Wan2.2-A14B)."""
    if not isinstance(vae, AutoencoderKLWan):
        raise RuntimeError(
            f"context_parallel.parallel_decode: needs diffusers' AutoencoderKLWan, this pipeline's VAE is "
            f"{type(vae).__name__}; use parallel_decode='off'"
        )
    if vae.config.patch_size is not None:
        raise RuntimeError(
            f"context_parallel.parallel_decode: the VAE has patch_size={vae.config.patch_size} (Wan2.2-TI2V); only "
            "patch_size=None is implemented and tested; use parallel_decode='off'"
        )
    if "_decode" in vae.__dict__:
        raise RuntimeError("context_parallel.parallel_decode: the VAE's _decode is already replaced by something else")


def band_tiling(vae: Any, latent_height: int, latent_width: int, bands: int, overlap: int) -> Tiling:
    """`bands` horizontal tiles over the whole width, each `overlap` latent rows taller than the stride.

    Raises RuntimeError if the latent frame is too short for that many bands with that overlap (diffusers would
    then decode it untiled, or with another number of tiles)."""
    ratio = vae.spatial_compression_ratio
    stride = math.ceil(latent_height / bands)
    tiles = len(range(0, latent_height, stride))
    if bands < 2 or overlap < 1 or stride + overlap >= latent_height or tiles != bands:
        raise RuntimeError(
            f"context_parallel.parallel_decode: a latent frame of {latent_height} rows cannot be cut into {bands} "
            f"bands with decode_overlap={overlap} rows (needs ceil(H/bands) + overlap < H); lower decode_overlap "
            "or use parallel_decode='off'"
        )
    width = latent_width * ratio
    return Tiling(ratio * (stride + overlap), width, ratio * stride, width)


def owners(tiles: int, world: int) -> list[int]:
    """Row-major tile index -> rank: contiguous runs, as even as the count allows."""
    return [t * world // tiles for t in range(tiles)]


def tiled_decode(
    vae: Any, z: torch.Tensor, tiling: Tiling, receipt: Any = None
) -> torch.Tensor:  # z: (B, C, T, H, W) latents -> (B, 3, T_out, H*8, W*8) clamped to [-1, 1]
    """diffusers 0.42.1 `AutoencoderKLWan.tiled_decode` with `tiling`, each tile decoded by one rank.

    Every rank of the default process group must call it with the same `z`; every rank returns the whole blended video."""
    rank, world = dist.get_rank(), dist.get_world_size()
    _, _, num_frames, height, width = z.shape
    ratio = vae.spatial_compression_ratio
    sample_height, sample_width = height * ratio, width * ratio
    tile_latent_min_height = tiling.tile_sample_min_height // ratio
    tile_latent_min_width = tiling.tile_sample_min_width // ratio
    tile_latent_stride_height = tiling.tile_sample_stride_height // ratio
    tile_latent_stride_width = tiling.tile_sample_stride_width // ratio
    stride_height, stride_width = tiling.tile_sample_stride_height, tiling.tile_sample_stride_width
    blend_height = tiling.tile_sample_min_height - stride_height
    blend_width = tiling.tile_sample_min_width - stride_width

    starts = [
        (i, j) for i in range(0, height, tile_latent_stride_height) for j in range(0, width, tile_latent_stride_width)
    ]
    owner = owners(len(starts), world)
    decoded: list[torch.Tensor | None] = []
    for (i, j), who in zip(starts, owner, strict=True):
        if who != rank:
            decoded.append(None)
            continue
        vae.clear_cache()  # as diffusers: each tile its own causal feature cache, frames in order
        time = []
        for k in range(num_frames):
            vae._conv_idx = [0]
            tile = z[:, :, k : k + 1, i : i + tile_latent_min_height, j : j + tile_latent_min_width]
            tile = vae.post_quant_conv(tile)
            time.append(vae.decoder(tile, feat_cache=vae._feat_map, feat_idx=vae._conv_idx, first_chunk=(k == 0)))
        decoded.append(torch.cat(time, dim=2).contiguous())
    vae.clear_cache()

    # every rank learns every tile's shape and dtype (one small all-reduce), then each tile is broadcast by its owner
    meta = torch.zeros(len(starts), 6, dtype=torch.int64, device=z.device)
    for t, tile in enumerate(decoded):
        if tile is not None:
            meta[t, :5] = torch.tensor(tile.shape)
            meta[t, 5] = DTYPES.index(tile.dtype)
    dist.all_reduce(meta)
    for t, who in enumerate(owner):
        if decoded[t] is None:
            shape, dtype = meta[t, :5].tolist(), DTYPES[int(meta[t, 5])]
            decoded[t] = torch.empty(shape, dtype=dtype, device=z.device)
        dist.broadcast(decoded[t], src=who)
    if receipt is not None:
        receipt.counters["parallel_decodes"] += 1
        receipt.counters["decode_tiles"] += owner.count(rank)
        receipt.counters["decode_tiles_received"] += len(owner) - owner.count(rank)
        receipt.notes["decode_tiles_per_rank"] = [owner.count(r) for r in range(world)]
        receipt.notes["decode_tiling"] = tiling.to_dict()

    columns = len(range(0, width, tile_latent_stride_width))
    rows = [decoded[r * columns : (r + 1) * columns] for r in range(len(decoded) // columns)]
    result_rows = []
    for i, row in enumerate(rows):  # diffusers' blend, in its order (blend_v writes into the lower tile in place)
        result_row = []
        for j, tile in enumerate(row):
            if i > 0:
                tile = vae.blend_v(rows[i - 1][j], tile, blend_height)
            if j > 0:
                tile = vae.blend_h(row[j - 1], tile, blend_width)
            result_row.append(tile[:, :, :, :stride_height, :stride_width])
        result_rows.append(torch.cat(result_row, dim=-1))
    dec = torch.cat(result_rows, dim=3)[:, :, :, :sample_height, :sample_width]
    return torch.clamp(dec, min=-1.0, max=1.0)


class ParallelDecode:
    """Replaces `vae._decode` (an instance attribute; `decode` and its hooks stay diffusers') until `remove()`."""

    def __init__(self, vae: Any, overlap: int, receipt: Any):
        check_vae(vae)
        self.vae, self.overlap, self.receipt = vae, overlap, receipt
        vae.__dict__["_decode"] = self._decode

    def _decode(self, z: torch.Tensor, return_dict: bool = True) -> Any:
        world = dist.get_world_size()
        tiling = band_tiling(self.vae, z.shape[-2], z.shape[-1], world, self.overlap)
        dec = tiled_decode(self.vae, z, tiling, self.receipt)
        return DecoderOutput(sample=dec) if return_dict else (dec,)

    def remove(self) -> None:
        if self.vae.__dict__.get("_decode") == self._decode:
            del self.vae.__dict__["_decode"]
