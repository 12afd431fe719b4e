"""LTX-2's video VAE decode (diffusers 0.42.x `AutoencoderKLLTX2Video`, the LTX-2 release's configuration) with its
convolutions fed from padded buffers, optionally in channels_last_3d and with each norm + SiLU as one kernel.

diffusers runs the whole clip through the decoder at once (no per-frame chunks, so no convolution cache carried
between chunks). Each of its causal 3x3x3 convolutions (`LTX2VideoCausalConv3d`) copies its input twice: a
`torch.cat` with the first frame repeated in front (causal) or the first and last frames on either side (not causal),
then, with the release's `reflect` spatial padding, `F.pad` inside `nn.Conv3d`. Before most of them a
`PerChannelRMSNorm` (x ** 2, mean, + eps, sqrt, divide: five passes in the activation's dtype) and a SiLU.
`LTX2Decode` replaces `vae._decode` (an instance attribute; `decode`, its hooks and slicing stay diffusers') by the
same maths with the plugin's three levers:

- `conv_cache="buffer"`: each convolution reads one buffer (B, C, front + T + back, H + 2ph, W + 2pw) into whose
  interior the norm + SiLU (or the block input) is written; the reflected border rows and columns and the repeated
  frames are then copied in from the interior (a few rows, not the activation), and the convolution runs on the
  buffer with no padding: the tensor `F.pad(torch.cat(...))` would have made, in the same convolution call (zeros
  padding: the buffer has the repeated frames only and the convolution pads, as diffusers' call does). Bit-equal.
  `"stock"`: diffusers' own convolution module (cat + pad). LTX-2's decoder has no cross-chunk cache, so the option
  only chooses how each convolution's padded input is made.
- `channels_last=True`: the decoder's convolution weights and activations in channels_last_3d, so cuDNN runs its
  NDHWC kernels without transposing; each upsampler's depth-to-space is one copy into a channels-last output to
  which the residual is added in place (diffusers' reshape + permute + repeat + add would return NCDHW). Other
  convolution algorithms and reduction orders: `reduction`.
- `norm="triton"`: each `PerChannelRMSNorm` + SiLU (residual blocks and the head) as one `pixel_norm_silu` kernel
  writing into the convolution buffer. Every op rounded to the dtype as torch's; the mean's sum in another order, so
  an element is torch's or the SiLU of a normed value an ulp or two away (`reduction`, see kernels/rms_norm_silu.py).

Scope: LTX-2's decoder without timestep conditioning or noise injection (the release's; `check` refuses the others),
zeros or reflect spatial padding. A tiled or framewise decode (`enable_tiling`, `use_framewise_decoding` with more
latent frames than a tile) and grad mode run diffusers' own `_decode`, counted under the receipt's fallbacks.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from diffusers import AutoencoderKLLTX2Video
from diffusers.models.autoencoders.autoencoder_kl_ltx2 import (
    LTX2VideoCausalConv3d,
    LTX2VideoResnetBlock3d,
    LTX2VideoUpsampler3d,
    PerChannelRMSNorm,
)
from diffusers.models.autoencoders.vae import DecoderOutput

from workbench.models.fused.vae_decode import ReplacedDecode, decoder_reason

PADDINGS = ("zeros", "reflect")


def check(vae: Any) -> str | None:
    """Why `vae` cannot take this decode path (another class, configuration or a replaced piece), or None."""
    if not isinstance(vae, AutoencoderKLLTX2Video):
        return f"the VAE is {type(vae).__name__}, not diffusers' AutoencoderKLLTX2Video"
    if vae.config.timestep_conditioning:
        return "the decoder is timestep-conditioned; only LTX-2's unconditioned decoder is implemented"
    reason = decoder_reason(vae)
    if reason is not None:
        return reason
    decoder = vae.decoder
    norms = [decoder.norm_out]
    for name, module in decoder.named_modules():
        if isinstance(module, LTX2VideoResnetBlock3d):
            if module.per_channel_scale1 is not None:
                return f"decoder block {name} injects noise; this path has none"
            if not (isinstance(module.dropout, torch.nn.Dropout) and module.dropout.p == 0.0):
                return f"decoder block {name} has a dropout of p={module.dropout.p}; this path has none"
            if not isinstance(module.nonlinearity, torch.nn.SiLU):
                return f"decoder block {name}'s activation is {type(module.nonlinearity).__name__}, not SiLU"
            norms += [module.norm1, module.norm2]
        if isinstance(module, LTX2VideoCausalConv3d) and module.conv.padding_mode not in PADDINGS:
            return f"decoder convolution {name} pads with {module.conv.padding_mode!r}; allowed: {list(PADDINGS)}"
    if not isinstance(decoder.conv_act, torch.nn.SiLU):
        return f"the decoder head's activation is {type(decoder.conv_act).__name__}, not SiLU"
    if not all(isinstance(n, PerChannelRMSNorm) and n.channel_dim == 1 for n in norms):
        return "a decoder norm is not a PerChannelRMSNorm over the channels"
    return None


def install(vae: Any, options: dict[str, Any], receipt: Any) -> Any:
    """Replace `vae._decode` with this path (`Family.vae_decode.install`); returns the function that removes it."""
    return LTX2Decode(vae, options, receipt).remove


class LTX2Decode(ReplacedDecode):
    """Replaces `vae._decode` until `remove()`; `options`: conv_cache, channels_last, norm (module docstring)."""

    def __init__(self, vae: Any, options: dict[str, Any], receipt: Any):
        reason = check(vae)
        if reason is not None:
            raise RuntimeError(f"fast LTX-2 VAE decode: {reason}")
        if options["norm"] == "triton":
            from workbench.kernels.rms_norm_silu import pixel_norm_silu

            self.pixel_norm_silu = pixel_norm_silu
        super().__init__(vae, options, receipt)

    def _norm_kernel(self, norm: torch.nn.Module, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        return self.pixel_norm_silu(x, norm.eps, out=out)

    def _decode(
        self, z: torch.Tensor, temb: torch.Tensor | None = None, causal: bool | None = None, return_dict: bool = True
    ) -> Any:
        vae = self.vae
        frames, height, width = z.shape[2:]
        tiling = None
        if vae.use_framewise_decoding and frames > vae.tile_sample_min_num_frames // vae.temporal_compression_ratio:
            tiling = "framewise decode"
        elif vae.use_tiling and (
            width > vae.tile_sample_min_width // vae.spatial_compression_ratio
            or height > vae.tile_sample_min_height // vae.spatial_compression_ratio
        ):
            tiling = "tiled decode"
        if self.runs_stock(tiling):
            return type(vae)._decode(vae, z, temb, causal=causal, return_dict=return_dict)
        decoder = self.decoder
        causal = causal or decoder.is_causal  # as the decoder's forward reads it
        x = self._conv(decoder.conv_in, z, None, causal)
        for resnet in decoder.mid_block.resnets:
            x = self._resnet(resnet, x, causal)
        for block in decoder.up_blocks:
            if block.conv_in is not None:
                x = self._resnet(block.conv_in, x, causal)
            for upsampler in block.upsamplers or ():
                x = self._upsample(upsampler, x, causal)
            for resnet in block.resnets:
                x = self._resnet(resnet, x, causal)
        x = self._conv(decoder.conv_out, x, decoder.norm_out, causal)
        p, pt = decoder.patch_size, decoder.patch_size_t
        b, _, t, h, w = x.shape  # unpatchify, as the decoder does
        x = (
            x.reshape(b, -1, pt, p, p, t, h, w)
            .permute(0, 1, 5, 2, 6, 4, 7, 3)
            .flatten(6, 7)
            .flatten(4, 5)
            .flatten(2, 3)
        )
        self.receipt.counters["decodes"] += 1
        self.receipt.counters["latent_frames"] += frames
        return DecoderOutput(sample=x) if return_dict else (x,)

    def _resnet(self, block: LTX2VideoResnetBlock3d, x: torch.Tensor, causal: bool) -> torch.Tensor:
        hidden = self._conv(block.conv1, x, block.norm1, causal)
        hidden = self._conv(block.conv2, hidden, block.norm2, causal)
        if block.norm3 is not None:
            x = block.norm3(x.movedim(1, -1)).movedim(-1, 1)
        if block.conv_shortcut is not None:
            x = block.conv_shortcut(x)
        return hidden + x

    def _conv(self, module: LTX2VideoCausalConv3d, x: torch.Tensor, norm: Any, causal: bool) -> torch.Tensor:
        """The causal (or frame-replicated) convolution of `silu(norm(x))` (of `x` when `norm` is None)."""
        conv = module.conv
        _, ph, pw = conv.padding
        reflect = conv.padding_mode == "reflect"
        b, c, t, h, w = x.shape
        if not self.buffered or (reflect and (h <= ph or w <= pw)):  # the latter: diffusers' F.pad says why not
            x = self.activation(x, norm)
            if self.channels_last:
                x = x.contiguous(memory_format=self.format)
            return module(x, causal=causal)
        kt = module.kernel_size[0]
        front, back = (kt - 1, 0) if causal else ((kt - 1) // 2, (kt - 1) // 2)
        sh, sw = (ph, pw) if reflect else (0, 0)  # the border the buffer carries (zeros: the convolution pads)
        shape = (b, c, front + t + back, h + 2 * sh, w + 2 * sw)
        buffer = torch.empty(shape, dtype=x.dtype, device=x.device, memory_format=self.format)
        self.write_activation(buffer[:, :, front : front + t, sh : sh + h, sw : sw + w], x, norm)
        frames = buffer[:, :, front : front + t]
        for k in range(1, sh + 1):  # reflect: row sh - k mirrors row sh + k, then the columns over the full height
            frames[:, :, :, sh - k, sw : sw + w].copy_(frames[:, :, :, sh + k, sw : sw + w])
            frames[:, :, :, sh + h - 1 + k, sw : sw + w].copy_(frames[:, :, :, sh + h - 1 - k, sw : sw + w])
        for k in range(1, sw + 1):
            frames[..., sw - k].copy_(frames[..., sw + k])
            frames[..., sw + w - 1 + k].copy_(frames[..., sw + w - 1 - k])
        for k in range(front):
            buffer[:, :, k].copy_(buffer[:, :, front])
        for k in range(back):
            buffer[:, :, front + t + k].copy_(buffer[:, :, front + t - 1])
        self.receipt.counters["buffered_convs"] += 1
        padding = 0 if reflect else conv.padding
        return F.conv3d(buffer, conv.weight, conv.bias, conv.stride, padding, conv.dilation, conv.groups)

    def _upsample(self, upsampler: LTX2VideoUpsampler3d, x: torch.Tensor, causal: bool) -> torch.Tensor:
        """Depth-to-space of the convolution's channels (s0 x s1 x s2 sub-positions), less the first s0 - 1 frames,
        plus (residual) the input's channels spread the same way and repeated to the output's channels."""
        b, c, t, h, w = x.shape
        s0, s1, s2 = upsampler.stride
        y = self._conv(upsampler.conv, x, None, causal)  # (B, C' s0 s1 s2, T, H, W)
        if not self.channels_last:  # diffusers' ops: the same values in the same layout
            y = y.reshape(b, -1, s0, s1, s2, t, h, w).permute(0, 1, 5, 2, 6, 3, 7, 4)
            y = y.flatten(6, 7).flatten(4, 5).flatten(2, 3)[:, :, s0 - 1 :]
            if not upsampler.residual:
                return y
            r = x.reshape(b, -1, s0, s1, s2, t, h, w).permute(0, 1, 5, 2, 6, 3, 7, 4)
            r = r.flatten(6, 7).flatten(4, 5).flatten(2, 3)
            r = r.repeat(1, (s0 * s1 * s2) // upsampler.upscale_factor, 1, 1, 1)[:, :, s0 - 1 :]
            return y + r
        channels = y.shape[1] // (s0 * s1 * s2)
        out = torch.empty(
            (b, channels, s0 * t, s1 * h, s2 * w), dtype=y.dtype, device=y.device, memory_format=self.format
        )
        spread = out.view(b, channels, t, s0, h, s1, w, s2)  # splitting dimensions: a view in any layout
        spread.copy_(y.view(b, channels, s0, s1, s2, t, h, w).permute(0, 1, 5, 2, 6, 3, 7, 4))
        if upsampler.residual:  # output channel k * (C / s0 s1 s2) + j takes input sub-channel j
            inner = c // (s0 * s1 * s2)
            r = x.view(b, inner, s0, s1, s2, t, h, w).permute(0, 1, 5, 2, 6, 3, 7, 4)
            spread.view(b, channels // inner, inner, t, s0, h, s1, w, s2).add_(r.unsqueeze(1))
        return out[:, :, s0 - 1 :]
