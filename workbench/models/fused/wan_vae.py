"""The Wan VAE decode (diffusers 0.42.x `AutoencoderKLWan`, Wan2.1 / Wan2.2-A14B configuration) with its causal
convolutions fed from padded buffers, optionally in channels_last_3d and with each norm + SiLU as one kernel.

diffusers decodes one latent frame at a time through the whole decoder and carries, per causal 3x3x3 convolution, the
last two input frames to the next chunk (`feat_cache`). Every such convolution then copies its input twice
(`torch.cat` of the cached frames with the new ones, then `F.pad` for the zero border and the missing frames) and
clones the new cache; its norm + SiLU before it are six passes over the activation (an fp32 copy, the normalisation,
a cast, `* scale`, `* gamma`, `+ 0.0`) and one more for SiLU. `WanDecode` replaces `vae._decode` (an instance
attribute; `decode`, its hooks and slicing stay diffusers') by the same maths with three levers:

- `conv_cache="buffer"`: each causal convolution owns a zero-bordered buffer (B, C, 2 + T, H + 2, W + 2) whose first
  two frames hold the cached frames; the norm + SiLU (or the chunk's input) is written straight into its interior and
  the convolution reads the whole buffer with no padding, so it sees the same tensor `F.pad` would have made. Before
  the next chunk the last two frames are copied to the front (two frames, not the activation). `"stock"`: diffusers'
  cat + pad. Bit-equal to diffusers either way (same values into the same convolution call).
- `channels_last=True`: the decoder's convolution weights and buffers in channels_last_3d (Conv2d: channels_last), so
  cuDNN runs its NDHWC kernels without transposing, and the spatial upsample's frame fold is a view. Other
  convolution algorithms and reduction orders (and norms reduced along the inner dimension): not bit-equal
  (`reduction`).
- `norm="triton"`: each residual block's and the head's `WanRMS_norm` + SiLU as one `rms_norm_silu` kernel writing
  into the convolution buffer (its sum of squares in another order: `reduction`, an element torch's or an ulp or two away, see
  kernels/rms_norm_silu.py). `"torch"`: the module's own norm, SiLU written into the buffer with `silu.out` on CUDA
  (one elementwise kernel whatever the strides); on a CPU into a temporary then copied, because torch's CPU SiLU rounds
  differently in its vectorised and scalar loops and the buffer's strides would pick other loops for some elements.

Besides the levers and for every option: the spatial upsample runs nearest-exact on the activation's own dtype
(diffusers upcasts to fp32 and back: the same values, a gather), the time upsample interleaves its two halves into
one preallocated tensor (same values as diffusers' reshape + stack), and the frames are concatenated once at the end.

Scope: `patch_size=None` and `is_residual=False` (Wan2.1's VAE, used by Wan2.1 and Wan2.2-A14B); the Wan2.2-TI2V
VAE is refused by `check`. A tiled decode (`enable_tiling` with a frame above the tile) and grad mode run diffusers'
own `_decode`, counted under the receipt's fallbacks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from diffusers import AutoencoderKLWan
from diffusers.models.autoencoders.autoencoder_kl_wan import WanResample, WanResidualBlock, WanRMS_norm
from diffusers.models.autoencoders.vae import DecoderOutput

from workbench.kernels.rms_norm_silu import rms_norm_silu
from workbench.models.fused.vae_decode import ReplacedDecode, decoder_reason

CACHED_FRAMES = 2  # diffusers' CACHE_T: the frames a causal 3x3x3 convolution carries to the next chunk


def check(vae: Any) -> str | None:
    """Why `vae` cannot take this decode path (another class, configuration or a replaced piece), or None."""
    if not isinstance(vae, AutoencoderKLWan):
        return f"the VAE is {type(vae).__name__}, not diffusers' AutoencoderKLWan"
    if vae.config.patch_size is not None or vae.config.is_residual:
        return "the VAE is the Wan2.2-TI2V one (patch_size / is_residual); only the Wan2.1 VAE is implemented"
    reason = decoder_reason(vae)
    if reason is not None:
        return reason
    decoder = vae.decoder
    for name, module in decoder.named_modules():
        if isinstance(module, WanResidualBlock) and not (
            isinstance(module.dropout, torch.nn.Dropout) and module.dropout.p == 0.0
        ):
            return f"decoder block {name} has a dropout of p={module.dropout.p}; this path has none"
        if isinstance(module, WanRMS_norm) and not module.channel_first:
            return f"decoder norm {name} is not channel-first"
        if isinstance(module, WanResample) and module.mode not in ("upsample2d", "upsample3d"):
            return f"decoder module {name} resamples with mode {module.mode!r}"
    activations = [
        decoder.nonlinearity,
        *(b.nonlinearity for b in decoder.modules() if isinstance(b, WanResidualBlock)),
    ]
    if not all(isinstance(a, torch.nn.SiLU) for a in activations):
        return "a decoder activation is not SiLU"
    return None


class _Stream:
    """One causal convolution's padded input across chunks: (B, C, 2 + T, H + 2ph, W + 2pw), zero border, the first
    two frames the last two of the stream so far (zeros before its start)."""

    def __init__(self, conv: torch.nn.Conv3d, memory_format: torch.memory_format):
        self.conv = conv
        self.format = memory_format
        self.buffer: torch.Tensor | None = None
        pw, _, ph, _, pt, _ = conv._padding
        if pt != CACHED_FRAMES:
            raise RuntimeError(f"a causal convolution pads {pt} frames; this path carries {CACHED_FRAMES}")
        self.ph, self.pw = ph, pw

    def interior(self, like: torch.Tensor) -> torch.Tensor:
        """The view of this chunk's frames (like's shape) inside the buffer, after moving the cached frames in front."""
        b, c, t, h, w = like.shape
        shape = (b, c, CACHED_FRAMES + t, h + 2 * self.ph, w + 2 * self.pw)
        old = self.buffer
        if old is None or old.shape != shape or old.dtype != like.dtype or old.device != like.device:
            self.buffer = torch.empty(shape, dtype=like.dtype, device=like.device, memory_format=self.format).zero_()
            if old is not None:
                self.buffer[:, :, :CACHED_FRAMES].copy_(old[:, :, -CACHED_FRAMES:])
        else:
            for k in range(CACHED_FRAMES):  # in order: with t == 1 frame 1 moves to 0 before frame 2 moves to 1
                old[:, :, k].copy_(old[:, :, old.shape[2] - CACHED_FRAMES + k])
        return self.buffer[:, :, CACHED_FRAMES:, self.ph : self.ph + h, self.pw : self.pw + w]

    def run(self) -> torch.Tensor:
        conv = self.conv
        return F.conv3d(self.buffer, conv.weight, conv.bias, conv.stride, 0, conv.dilation, conv.groups)


@dataclass
class _Chunks:
    """What one decode carries from chunk to chunk: per causal convolution its stream (buffer) or cache (stock), and
    the time upsamplers that have seen their first chunk."""

    streams: dict[int, _Stream] = field(default_factory=dict)
    caches: dict[int, torch.Tensor] = field(default_factory=dict)
    started: set[int] = field(default_factory=set)


def install(vae: Any, options: dict[str, Any], receipt: Any) -> Any:
    """Replace `vae._decode` with this path (`Family.vae_decode.install`); returns the function that removes it."""
    return WanDecode(vae, options, receipt).remove


class WanDecode(ReplacedDecode):
    """Replaces `vae._decode` until `remove()`; `options`: conv_cache, channels_last, norm (module docstring)."""

    def __init__(self, vae: Any, options: dict[str, Any], receipt: Any):
        reason = check(vae)
        if reason is not None:
            raise RuntimeError(f"fast Wan VAE decode: {reason}")
        super().__init__(vae, options, receipt)

    def _norm_kernel(self, norm: torch.nn.Module, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        return rms_norm_silu(x, norm.gamma, norm.bias, norm.scale, out=out)

    def _decode(self, z: torch.Tensor, return_dict: bool = True) -> Any:
        vae = self.vae
        ratio = vae.spatial_compression_ratio
        tiled = vae.use_tiling and (
            z.shape[-1] > vae.tile_sample_min_width // ratio or z.shape[-2] > vae.tile_sample_min_height // ratio
        )
        if self.runs_stock("tiled decode" if tiled else None):
            return type(vae)._decode(vae, z, return_dict=return_dict)
        x = vae.post_quant_conv(z)
        chunks = _Chunks()
        frames = [self._chunk(x[:, :, i : i + 1], chunks) for i in range(x.shape[2])]
        out = torch.clamp(torch.cat(frames, 2).contiguous(), min=-1.0, max=1.0)
        self.receipt.counters["decodes"] += 1
        self.receipt.counters["latent_frames"] += x.shape[2]
        return DecoderOutput(sample=out) if return_dict else (out,)

    def _chunk(self, x: torch.Tensor, chunks: _Chunks) -> torch.Tensor:  # (B, z, 1, h, w) -> (B, 3, 1 or 4, H, W)
        decoder = self.decoder
        x = self._conv(decoder.conv_in, x, None, chunks)
        mid = decoder.mid_block
        x = self._resnet(mid.resnets[0], x, chunks)
        for attention, resnet in zip(mid.attentions, mid.resnets[1:], strict=True):
            x = attention(x) if attention is not None else x
            x = self._resnet(resnet, x, chunks)
        for block in decoder.up_blocks:
            for resnet in block.resnets:
                x = self._resnet(resnet, x, chunks)
            if block.upsamplers is not None:
                x = self._upsample(block.upsamplers[0], x, chunks)
        return self._conv(decoder.conv_out, x, decoder.norm_out, chunks)

    def _resnet(self, block: torch.nn.Module, x: torch.Tensor, chunks: _Chunks) -> torch.Tensor:
        shortcut = block.conv_shortcut(x)
        x = self._conv(block.conv1, x, block.norm1, chunks)
        return self._conv(block.conv2, x, block.norm2, chunks) + shortcut

    def _conv(self, conv: Any, x: torch.Tensor, norm: Any, chunks: _Chunks) -> torch.Tensor:
        """The causal convolution of `silu(norm(x))` (of `x` when `norm` is None), carrying its cache."""
        key = id(conv)
        if self.buffered:
            stream = chunks.streams.get(key)
            if stream is None:
                stream = chunks.streams[key] = _Stream(conv, self.format)
            self.write_activation(stream.interior(x), x, norm)
            self.receipt.counters["buffered_convs"] += 1
            return stream.run()
        x = self.activation(x, norm)
        if self.channels_last:
            x = x.contiguous(memory_format=self.format)
        cache = chunks.caches.get(key)
        joined = x if cache is None else torch.cat([cache, x], 2)
        chunks.caches[key] = joined[:, :, -CACHED_FRAMES:].clone()
        pw, _, ph, _, pt, _ = conv._padding
        padded = F.pad(joined, (pw, pw, ph, ph, pt - joined.shape[2] + x.shape[2], 0))
        return F.conv3d(padded, conv.weight, conv.bias, conv.stride, 0, conv.dilation, conv.groups)

    def _upsample(self, resample: torch.nn.Module, x: torch.Tensor, chunks: _Chunks) -> torch.Tensor:
        b, c, t, h, w = x.shape
        if resample.mode == "upsample3d":
            if id(resample) not in chunks.started:  # diffusers' "Rep": the first chunk is not upsampled in time
                chunks.started.add(id(resample))
            else:
                doubled = self._conv(resample.time_conv, x, None, chunks)  # (B, 2C, T, H, W): halves are frames
                x = torch.empty((b, c, 2 * t, h, w), dtype=x.dtype, device=x.device, memory_format=self.format)
                x[:, :, 0::2].copy_(doubled[:, :c])
                x[:, :, 1::2].copy_(doubled[:, c:])
                t *= 2
        frames = x.permute(0, 2, 1, 3, 4).reshape(b * t, c, h, w)  # a view in channels_last_3d
        upsample, conv = resample.resample
        frames = F.interpolate(
            frames,
            scale_factor=upsample.scale_factor,
            mode=upsample.mode,
            align_corners=upsample.align_corners,
            recompute_scale_factor=upsample.recompute_scale_factor,
        )
        frames = conv(frames)
        return frames.view(b, t, *frames.shape[1:]).permute(0, 2, 1, 3, 4)
