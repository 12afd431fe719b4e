"""Context parallelism: one request's denoiser split over a torch.distributed group (contract: reduction).

Every rank holds the whole pipeline and runs the same request with the same seed. diffusers' own context
parallelism does the work: its `ContextParallelConfig` mesh ("ring", "ulysses"), the denoiser's `_cp_plan`
hooks (the token sequence is split at the first block and gathered after `proj_out`) and the templated
Ulysses / ring attention of `diffusers.models.attention_dispatch`. Text encoding and the scheduler run
replicated on every rank; so does the VAE decode unless `parallel_decode` says otherwise.

`parallel_decode` (Wan VAE only):
- "off" (default): every rank decodes the whole video with the stock untiled decode, so the decode adds
  nothing to the contract (the request stays `reduction`, bit-equal to one GPU where the denoiser is).
- "bands": diffusers' tiled decode with one horizontal band per rank (`decode_overlap` latent rows of overlap,
  blended as diffusers blends); each rank decodes its band, the bands are broadcast, every rank blends
  (`workbench.accelerations.parallel.parallel_decode`). The decode is then bit-equal to ONE process's
  `vae.tiled_decode` with the same bands (`parallel_decode.band_tiling`), and `approximate` against the stock
  untiled decode: a tile's mid-block attention sees only its band, and the cut is zero-padded. The report's
  contract says `approximate` whenever it is on. No exact split exists to offer instead: that mid-block
  attention spans the whole frame, so no halo of rows makes a band's decode equal the untiled one.

Why not `model.enable_parallelism(...)`: in diffusers 0.42.1 it computes the device as
`rank % torch.accelerator.device_count()`, a division by zero on a CPU-only torch, so it cannot run on gloo.
This plugin performs the same context-parallel steps itself (mesh, `ParallelConfig.setup`, each attention
processor's `_parallel_config`, `apply_context_parallel`) on CUDA and CPU alike, and undoes them on uninstall.

`relayout` chooses how Ulysses self-attention moves its heads around the all-to-all:
- "direct" (default): the workbench path. `workbench.kernels.relayout.pack_qkv` writes q, k and v
  destination-major into one buffer (one Triton pass per operand, no stacked intermediate), ONE all-to-all
  exchanges it, and what arrives is read as q/k/v views (no unpack copy when the batch is 1, as Wan's
  separate CFG passes are); after attention `split_result` and `merge_heads` (Triton) surround the return
  all-to-all.
- "reference": the same path with the materialising torch chains (`*_reference` beside the kernels).
- "diffusers": diffusers' stock `TemplatedUlyssesAttention` (three all-to-alls for q, k, v); the only choice
  for ring, which exchanges key/value by all-gather and has no all-to-all to relayout.
The three relayouts hand attention the same values; outputs are bit-equal between them on gloo/CPU (tested).
On a GPU the direct/reference paths give SDPA strided q/k/v views, which could steer it to another kernel:
the benchmark checks equality there rather than assuming it.

Contract `reduction`, not `bitwise`: per head, Ulysses attention gets exactly the inputs one process would
give it, but every linear layer and norm runs on T/W tokens per rank, and a GEMM library may pick another
kernel (another reduction split) for another row count; ring merges partial softmaxes by log-sum-exp in
fp32, another reduction order. Measured results say how close (tests on gloo, benchmarks on GPUs).

diffusers splits each tensor its `_cp_plan` names evenly over the ranks. Where the request makes a count that does
not divide (MiniMax-H3 packs text, video and audio rows into one sequence, so the prompt's token count moves it),
forward pre-hooks on the plan's modules refuse it with a ValueError naming the module, the tensor, the count and the
ranks, before diffusers' bare assertion; nothing is padded (padding rows would join the joint attention).

The attention seam is process-wide: for the life of the plugin, `attention_dispatch.TemplatedUlyssesAttention`,
`TemplatedRingAttention` and `_all_to_all_single` are replaced by counting wrappers (restored on uninstall),
so one install per process; a second is refused. Inference only: the workbench relayouts have no backward.

Receipt: `cp_attention_calls` (attention calls that took the parallel path; the proof), `all_to_all_calls`,
`ring_calls`, `direct_relayout_calls` / `reference_relayout_calls` (pack, split and merge ops), `fallbacks`
(a call the workbench path cannot take, e.g. q/k/v of different shapes, runs diffusers' Ulysses and says so);
notes: rank, world size, degrees and the relayout that ran. With parallel_decode: `parallel_decodes`,
`decode_tiles` (tiles this rank decoded), `decode_tiles_received`; notes `decode_tiles_per_rank`, `decode_tiling`.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from diffusers.hooks.context_parallel import apply_context_parallel, remove_context_parallel
from diffusers.models import attention_dispatch as ad
from diffusers.models._modeling_parallel import ContextParallelConfig as DiffusersContextParallelConfig
from diffusers.models._modeling_parallel import ContextParallelInput, ParallelConfig
from diffusers.models.attention import AttentionModuleMixin
from diffusers.models.attention_processor import Attention
from torch.distributed.device_mesh import init_device_mesh

from workbench.accelerations.base import Handle, Spec, drop_restored_forwards, option
from workbench.accelerations.parallel.parallel_decode import ParallelDecode, check_vae
from workbench.kernels import relayout as kernels
from workbench.kernels._runtime import cpu_without_interpreter

RELAYOUTS = ("direct", "reference", "diffusers")
DECODES = ("off", "bands")
DECODE_CONTRACT = (
    "bands: bit-equal to one process's diffusers tiled_decode with the same bands; approximate vs the untiled decode"
)
HOW_TO_START = (
    "start the processes with `workbench generate --gpus N ...`, `workbench.distributed.run_arms(...)` from a "
    "notebook, or torchrun and `workbench.distributed.init_worker()`"
)
_SEAM = ("TemplatedUlyssesAttention", "TemplatedRingAttention", "_all_to_all_single")
# Counted inside the blocks' attention, so through Receipt.count (compile-safe).
_COUNTERS = (
    "cp_attention_calls",
    "all_to_all_calls",
    "ring_calls",
    "direct_relayout_calls",
    "reference_relayout_calls",
)
_SHAPES_DIFFER = "q/k/v shapes differ: diffusers' Ulysses relayout ran"
_owner: list[_Installed] = []  # the one install holding the attention_dispatch seam in this process
_configs: dict[tuple, tuple[Any, ParallelConfig]] = {}  # (device, degrees, group) -> set-up config (groups once)


class _Installed(Handle):
    def __init__(
        self,
        spec: Spec,
        options: dict[str, Any],
        denoisers: list[torch.nn.Module],
        device: torch.device,
        vae: Any = None,
    ):
        super().__init__(spec, options, proof=("cp_attention_calls",))
        self.receipt.traceable(device, counters=_COUNTERS, fallbacks=(_SHAPES_DIFFER,))
        if _owner:
            raise RuntimeError("context_parallel: already installed on another model in this process; uninstall it")
        self.denoisers = denoisers
        self.mode = options["relayout"]
        self.processors: list[Any] = []
        self.applied: list[torch.nn.Module] = []
        self.split_checks: list[torch.utils.hooks.RemovableHandle] = []
        self.originals: dict[str, Any] = {}
        self.decode: ParallelDecode | None = None
        try:
            _check_processors(denoisers, ring=options["ring_degree"] > 1)
            _check_same_weights(denoisers, device)
            self.config = _parallel_config(options, device)
            for denoiser in denoisers:
                self._apply(denoiser)
            self._patch()
            if options["parallel_decode"] == "bands":
                self.decode = ParallelDecode(vae, options["decode_overlap"], self.receipt)
        except BaseException:
            self._remove()
            raise

    def _apply(self, denoiser: torch.nn.Module) -> None:
        if denoiser._parallel_config is not None:
            raise RuntimeError(f"context_parallel: {type(denoiser).__name__} already has a parallel config")
        for processor in _processors(denoiser):
            processor._parallel_config = self.config
            self.processors.append(processor)
        denoiser._parallel_config = self.config
        self.applied.append(denoiser)
        apply_context_parallel(denoiser, self.config.context_parallel_config, denoiser._cp_plan)
        cp = self.config.context_parallel_config
        self.split_checks += _split_checks(denoiser, cp.ulysses_degree * cp.ring_degree)

    def _patch(self) -> None:
        self.originals = {name: getattr(ad, name) for name in _SEAM}
        ad.TemplatedUlyssesAttention = _UlyssesSeam(self, self.originals["TemplatedUlyssesAttention"])
        ad.TemplatedRingAttention = _RingSeam(self, self.originals["TemplatedRingAttention"])
        ad._all_to_all_single = self._counted_all_to_all(self.originals["_all_to_all_single"])
        _owner.append(self)

    def _counted_all_to_all(self, original: Any) -> Any:
        receipt = self.receipt

        def all_to_all(x: torch.Tensor, group: Any) -> torch.Tensor:
            receipt.count("all_to_all_calls")
            return original(x, group)

        return all_to_all

    def begin_request(self, request_id: int, steps: int) -> None:
        super().begin_request(request_id, steps)
        cp = self.config.context_parallel_config
        self.receipt.notes.update(
            rank=dist.get_rank(),
            world_size=dist.get_world_size(),
            ulysses_degree=cp.ulysses_degree,
            ring_degree=cp.ring_degree,
            relayout=self.mode if cp.ulysses_degree > 1 else "none (ring: all-gather, no all-to-all)",
        )

    def report(self) -> dict[str, Any]:
        report = super().report()
        if self.decode is not None:
            report["contract"] = "approximate"
            report.setdefault("notes", {})["decode_contract"] = DECODE_CONTRACT
        return report

    def _remove(self) -> None:
        if self.decode is not None:
            self.decode.remove()
            self.decode = None
        if self.originals:
            for name, value in self.originals.items():
                setattr(ad, name, value)
            self.originals = {}
        if self in _owner:
            _owner.remove(self)
        for check in self.split_checks:
            check.remove()
        self.split_checks = []
        for denoiser in self.applied:
            remove_context_parallel(denoiser, denoiser._cp_plan)
            denoiser._parallel_config = None
            drop_restored_forwards(denoiser)
        for processor in self.processors:
            processor._parallel_config = None
        self.applied, self.processors = [], []


def _split_checks(denoiser: torch.nn.Module, ranks: int) -> list[torch.utils.hooks.RemovableHandle]:
    """Forward pre-hooks on the modules whose inputs or outputs diffusers' `_cp_plan` splits: a split dimension that
    is not a multiple of `ranks` is a ValueError naming the module, the tensor and the count, instead of diffusers'
    bare assertion mid-request. The hooks see the whole inputs (torch runs them before diffusers' wrapped `forward`
    splits anything); a split output's shape comes from the module's own forward, run once per input shape."""
    modules = dict(denoiser.named_modules())
    handles = []
    for path, plan in denoiser._cp_plan.items():
        if not isinstance(plan, dict) or path not in modules:  # an output to gather, or a pattern of modules
            continue
        splits = {key: spec for key, spec in plan.items() if isinstance(spec, ContextParallelInput)}
        inputs = {key: spec for key, spec in splits.items() if isinstance(key, str) and not spec.split_output}
        outputs = {key: spec for key, spec in splits.items() if isinstance(key, int) and spec.split_output}
        if inputs or outputs:
            hook = _split_check(f"{type(denoiser).__name__}.{path}", inputs, outputs, ranks)
            handles.append(modules[path].register_forward_pre_hook(hook, with_kwargs=True))
    return handles


def _split_check(
    where: str, inputs: dict[str, ContextParallelInput], outputs: dict[int, ContextParallelInput], ranks: int
) -> Any:
    shapes: dict[Any, list[Any]] = {}  # the outputs' shapes per input shapes
    names: list[str] = []  # the forward's parameters after self, in positional order (read at the first call)

    def check(module: torch.nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
        names[:] = names or list(inspect.signature(type(module).forward).parameters)[1:]
        found = {**dict(zip(names, args, strict=False)), **kwargs}
        sizes = [(name, found[name].shape, spec) for name, spec in inputs.items()
                 if isinstance(found.get(name), torch.Tensor)]  # fmt: skip
        if outputs:
            key = tuple((name, tuple(v.shape)) for name, v in found.items() if isinstance(v, torch.Tensor))
            if key not in shapes:
                with torch.no_grad():  # the class's forward: diffusers' splitting wrapper is the instance's
                    out = type(module).forward(module, *args, **kwargs)
                shapes[key] = [getattr(o, "shape", None) for o in (out if isinstance(out, tuple) else (out,))]
            sizes += [(f"output {i}", shapes[key][i], spec) for i, spec in outputs.items()
                      if i < len(shapes[key]) and shapes[key][i] is not None]  # fmt: skip
        for label, shape, spec in sizes:
            if len(shape) == (spec.expected_dims or len(shape)) and shape[spec.split_dim] % ranks:
                raise ValueError(
                    f"context_parallel: {where}'s {label} has {shape[spec.split_dim]} rows along dim "
                    f"{spec.split_dim}, not a multiple of the {ranks} ranks it is split over; the request's shape "
                    "sets the count (frames, height, width and, where text and audio rows join the sequence as on "
                    f"MiniMax-H3, the prompt's token count and the duration): give a shape whose count divides by "
                    f"{ranks}"
                )

    return check


class _UlyssesSeam:
    """Stands in for `TemplatedUlyssesAttention` (diffusers calls only its `apply`)."""

    def __init__(self, handle: _Installed, original: Any):
        self.handle, self.original = handle, original

    def apply(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *rest: Any) -> Any:
        receipt = self.handle.receipt
        receipt.count("cp_attention_calls")
        mode = self.handle.mode
        if mode == "diffusers":
            return self.original.apply(query, key, value, *rest)
        if not query.shape == key.shape == value.shape:
            receipt.count_fallback(_SHAPES_DIFFER)
            return self.original.apply(query, key, value, *rest)
        if torch.is_grad_enabled() and any(x.requires_grad for x in (query, key, value)):
            raise RuntimeError(
                f"context_parallel.relayout={mode!r} is inference only (no backward); use relayout='diffusers'"
            )
        return _WorkbenchUlysses.apply(self.handle, mode, query, key, value, *rest)


class _RingSeam:
    """Stands in for `TemplatedRingAttention`: counts, then runs diffusers' ring unchanged."""

    def __init__(self, handle: _Installed, original: Any):
        self.handle, self.original = handle, original

    def apply(self, *args: Any) -> Any:
        self.handle.receipt.count("cp_attention_calls")
        self.handle.receipt.count("ring_calls")
        return self.original.apply(*args)


class _WorkbenchUlysses(torch.autograd.Function):
    """diffusers' Ulysses forward with the workbench relayouts: one all-to-all carries q, k and v."""

    @staticmethod
    def forward(
        ctx: Any,
        handle: _Installed,
        mode: str,
        query: torch.Tensor,  # (B, T_local, H, D)
        key: torch.Tensor,
        value: torch.Tensor,
        attn_mask: torch.Tensor | None,
        dropout_p: float,
        is_causal: bool,
        scale: float | None,
        enable_gqa: bool,
        return_lse: bool,
        forward_op: Any,
        backward_op: Any,
        _parallel_config: ParallelConfig | None = None,
    ) -> Any:
        cp = _parallel_config.context_parallel_config
        world, group = cp.ulysses_degree, cp._ulysses_mesh.get_group()
        if mode == "direct":
            pack, split, merge = kernels.pack_qkv, kernels.split_result, kernels.merge_heads
        else:
            pack, split, merge = (
                kernels.pack_qkv_reference,
                kernels.split_result_reference,
                kernels.merge_heads_reference,
            )
        counter = f"{mode}_relayout_calls"
        b, t_local, h, d = query.shape
        hw = h // world

        packed = pack(query, key, value, world)  # (W_dst, B, T_local, 3, H/W, D)
        received = ad._all_to_all_single(packed, group)  # (W_src, B, T_local, 3, H/W, D): source = sequence chunk
        if b == 1:
            full = received.view(1, world * t_local, 3, hw, d)  # a view: no unpack copy
        else:
            full = received.permute(1, 0, 2, 3, 4, 5).reshape(b, world * t_local, 3, hw, d)
        query, key, value = full.unbind(2)  # (B, T_full, H/W, D) strided views
        if attn_mask is not None and attn_mask.shape[-1] == t_local:  # as diffusers: gather a local mask
            masks = [torch.empty_like(attn_mask) for _ in range(world)]
            dist.all_gather(masks, attn_mask, group=group)
            attn_mask = torch.cat(masks, dim=-1)

        out = forward_op(
            ctx, query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, return_lse,
            _save_ctx=False, _parallel_config=_parallel_config,
        )  # fmt: skip
        lse = None
        if return_lse:
            out, lse, *_ = out
        out = merge(ad._all_to_all_single(split(out, world), group), world)  # (B, T_local, H, D)
        handle.receipt.count(counter, 3)
        if return_lse:  # (B, T_full, H/W): diffusers' own small relayout
            lse = lse.reshape(b, world, t_local, hw).permute(1, 3, 0, 2).contiguous()
            lse = ad._all_to_all_single(lse, group).flatten(0, 1).permute(1, 2, 0).contiguous()
            return out, lse
        return out

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> Any:
        raise RuntimeError(
            "context_parallel: the workbench Ulysses relayout is inference only; use relayout='diffusers'"
        )


def _attention_modules(denoiser: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    return [(n, m) for n, m in denoiser.named_modules() if isinstance(m, Attention | AttentionModuleMixin)]


def _processors(denoiser: torch.nn.Module) -> list[Any]:
    return [m.processor for _, m in _attention_modules(denoiser) if hasattr(m.processor, "_parallel_config")]


def _check_processors(denoisers: list[torch.nn.Module], ring: bool) -> None:
    """Every attention processor must be diffusers' own (a wrapped one would attend to its local shard only),
    and its backend must support context parallelism (and return the log-sum-exp, for ring)."""
    for denoiser in denoisers:
        for name, module in _attention_modules(denoiser):
            processor = module.processor
            if not hasattr(processor, "_parallel_config") or not type(processor).__module__.startswith("diffusers."):
                raise RuntimeError(
                    f"context_parallel: {name}'s processor {type(processor).__name__} is not diffusers' own (another "
                    "acceleration replaced it); it would attend to this rank's shard only"
                )
            backend = getattr(processor, "_attention_backend", None)
            backend = ad.AttentionBackendName(backend) if backend else ad._AttentionBackendRegistry._active_backend
            if not ad._AttentionBackendRegistry._is_context_parallel_available(backend):
                raise RuntimeError(f"context_parallel: attention backend {backend.value!r} has no context parallelism")
            if ring and backend == ad.AttentionBackendName.NATIVE:
                raise RuntimeError(
                    "context_parallel: ring needs an attention backend that returns the log-sum-exp; 'native' does "
                    "not. Install attention_backend with backend='cudnn' (CUDA) alongside"
                )


def _check_same_weights(denoisers: list[torch.nn.Module], device: torch.device) -> None:
    """Every rank must hold the same weights (the same seed or checkpoint); one sum per tensor, compared exactly."""
    sums = torch.stack([p.detach().float().sum() for d in denoisers for p in d.parameters()]).to(device)
    gathered = [torch.empty_like(sums) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, sums)
    differ = [rank for rank, other in enumerate(gathered) if not torch.equal(other, gathered[0])]
    if differ:
        raise RuntimeError(f"context_parallel: ranks {differ} hold other weights than rank 0; load the same model")


def _parallel_config(options: dict[str, Any], device: torch.device) -> ParallelConfig:
    """A set-up config per device, degrees and process group: building the mesh creates process groups, which
    every rank must do together, so it is done once and reused by later installs."""
    world = dist.distributed_c10d._get_default_group()
    key = (str(device), options["ring_degree"], options["ulysses_degree"], id(world))
    if key not in _configs:
        cp = DiffusersContextParallelConfig(
            ring_degree=options["ring_degree"], ulysses_degree=options["ulysses_degree"]
        )
        config = ParallelConfig(context_parallel_config=cp)
        mesh = init_device_mesh(device.type, cp.mesh_shape, mesh_dim_names=cp.mesh_dim_names)
        config.setup(dist.get_rank(), dist.get_world_size(), device, mesh=mesh)
        _configs[key] = (world, config)
    return _configs[key][1]


def _check_options(options: dict[str, Any]) -> None:
    ulysses, ring, relayout = options["ulysses_degree"], options["ring_degree"], options["relayout"]
    if ulysses == 1 and ring == 1:
        raise ValueError(
            "context_parallel: ulysses_degree=1 and ring_degree=1 split nothing; set one of them to the process count"
        )
    if ulysses > 1 and ring > 1:
        raise ValueError(
            f"context_parallel: ulysses_degree={ulysses} with ring_degree={ring} (unified attention) is not supported "
            "here; set one of them to 1"
        )
    if ring > 1 and relayout != "diffusers":
        raise ValueError(
            f"context_parallel.relayout={relayout!r} applies to Ulysses only (ring exchanges key/value by all-gather); "
            "with ring_degree > 1 set relayout='diffusers'"
        )


@dataclass(frozen=True)
class ContextParallelConfig:
    """context_parallel's options (turned into diffusers' `ContextParallelConfig` mesh at install)."""

    ulysses_degree: int = option(2, minimum=1, help="processes that split heads by all-to-all (Ulysses)")
    ring_degree: int = option(1, minimum=1, help="processes that pass key/value around a ring")
    relayout: str = option("direct", allowed=RELAYOUTS, help="how Ulysses packs heads around its all-to-all")
    parallel_decode: str = option(
        "off",
        allowed=DECODES,
        help="'bands': the Wan VAE decode split into one tiled band per rank (approximate vs untiled decode)",
    )
    decode_overlap: int = option(4, minimum=1, help="latent rows each decode band overlaps the next (x8 pixels)")


def _prepare(model: Any, options: dict[str, Any], device: torch.device):
    _check_options(options)
    vae = None
    if options["parallel_decode"] != "off":
        vae = getattr(model.pipeline, "vae", None)
        check_vae(vae)
    if options["relayout"] == "direct" and cpu_without_interpreter(device):
        raise RuntimeError(
            "context_parallel.relayout='direct' on CPU needs the Triton interpreter: set TRITON_INTERPRET=1 "
            "before starting, or choose relayout='reference' or 'diffusers'"
        )
    degree = options["ulysses_degree"] * options["ring_degree"]
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(f"context_parallel: needs an initialised torch.distributed process group; {HOW_TO_START}")
    if dist.get_world_size() != degree:
        raise RuntimeError(
            f"context_parallel: ulysses_degree * ring_degree = {degree} but the process group has "
            f"{dist.get_world_size()} processes; they must be equal"
        )
    backend = str(dist.get_backend())
    wanted = "nccl" if device.type == "cuda" else "gloo"
    if wanted not in backend:
        raise RuntimeError(f"context_parallel: a {device.type} session needs a {wanted} process group, not {backend}")
    if device.type == "cuda" and (device.index or 0) != torch.cuda.current_device():
        raise RuntimeError(
            f"context_parallel: this session runs on {device} but the current CUDA device is "
            f"{torch.cuda.current_device()}; call torch.cuda.set_device(local_rank) before opening the session"
        )
    if _owner:
        raise RuntimeError("context_parallel: already installed on another model in this process; uninstall it")
    denoisers = model.denoisers()
    for denoiser in denoisers:
        if getattr(denoiser, "_cp_plan", None) is None:
            raise RuntimeError(f"context_parallel: {type(denoiser).__name__} has no diffusers `_cp_plan`")
        heads = denoiser.config.num_attention_heads
        if heads % options["ulysses_degree"]:
            raise RuntimeError(
                f"context_parallel: {type(denoiser).__name__} has {heads} attention heads, not divisible by "
                f"ulysses_degree={options['ulysses_degree']}"
            )
    return lambda: _Installed(SPEC, options, denoisers, device, vae)


SPEC = Spec(
    name="context_parallel",
    contract="reduction",
    summary="one request over N processes/GPUs: diffusers' Ulysses or ring context parallelism, direct relayouts",
    prepare_fn=_prepare,
    config=ContextParallelConfig,
    touches=("denoiser.forward", "attention_processor.parallel_config"),
    touches_with=lambda options: ("vae.decode",) if options["parallel_decode"] == "bands" else (),
    order=85,  # after plugins that set the attention backend; before regional_compile (which refuses hooked blocks)
)
SPECS = (SPEC,)
