"""Selective FP8: row-wise dynamic FP8 activations and weights for chosen denoiser Linear layers (contract:
approximate), through torchao or the workbench's fused path.

`include` / `exclude` are `fnmatch` globs against each denoiser's `named_modules()` paths (e.g.
"blocks.*.ffn.net.0.proj"); only `nn.Linear` layers are eligible. `groups=N` adds the N largest layer groups
(`layer_groups`: a block Linear's path with its indices as "*", e.g. "blocks.*.ffn.net.*.proj", ranked by the weights
the group holds, which is its GEMMs' share of the FLOPs per token): the knob a calibration searches, from the largest
group alone to eight. `order="measured"` ranks the groups by measured gain instead (`rank_by_gain`,
`gemm_saving`): the seconds its layers' FP8 GEMMs save per forward on this device, each shape timed once per process
against bf16 through the plugin's own path at MEASURED_ROWS activation rows (every group at that count: layers that
see fewer rows, such as cross-attention keys and values on the text or LTX-2's audio stream, rank as if they saw the
video's); groups whose FP8 GEMMs are slower rank last; the ranking goes into the receipt's notes (`group_order`, ms
saved per forward). It needs the FP8 GPU the plugin runs on (else RuntimeError). torchao's
`Float8DynamicActivationFloat8WeightConfig(granularity=PerRow())` needs CUDA with compute capability >= 8.9, bf16
weights on the session's device, and in/out features that are multiples of 16 (torchao skips other layers silently;
this plugin refuses them instead). Without those the plugin refuses with a RuntimeError unless
`allow_fallback=True`; then the layers it cannot quantize stay dense and every call of one is counted in
`receipt.fallbacks` under its reason. `fp8_gemms` counts calls of quantized Linears (forward pre-hooks),
so a receipt with only fallbacks is not executed and the result stays exact.

`path="fused"`: the same row-wise recipe without torchao's eager quantization, which makes several torch passes per
activation (on a large forward it can cost what the FP8 GEMMs save). Each weight is quantized once at install by
`kernels/fp8_rowwise.quantize_rows` (kept by the handle, not the module: the module's parameters are untouched);
each call quantizes its activation rows in one kernel and runs `torch._scaled_mm` with both row scales
(`fp8_linear`), through an instance-level forward on the Linear that uninstall deletes. Same hardware and layer
rules; another plugin's forward on the Linear is refused. That forward is marked `base.own_copy` (it never reads
`.weight`), so a plugin that moves the layer's weights (block_ring, fp8_ring, group_offload) refuses to install over
it.
`python -m benchmarks run forward-h3` measures it on H3's six Linears per block (its block_sparse+norms+fp8 arm).

torchao has no unquantize: each original weight Parameter is kept and put back on uninstall, along with
the instance attributes torchao adds (`extra_repr`), so the model's fingerprint is restored exactly. The
quantized copies are extra memory while installed; this plugin is about compute, not weight memory.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from workbench.accelerations.base import Handle, Knob, Spec, option, own_copy
from workbench.kernels._runtime import fp8_problem

NAME = "selective_fp8"
Layer = tuple[str, torch.nn.Linear, "str | None"]  # module path, the Linear, why it stays dense (None: quantized)


def _torchao():
    try:
        from torchao.quantization import Float8DynamicActivationFloat8WeightConfig, PerRow, quantize_
    except ImportError as error:
        raise RuntimeError(
            f"{NAME}: needs torchao (pip install 'vflash-workbench[fp8]', i.e. torchao==0.18.0): {error}"
        ) from None
    return quantize_, Float8DynamicActivationFloat8WeightConfig, PerRow


def _selection(options: dict[str, Any]) -> None:
    for name in ("include", "exclude"):
        if "" in (options[name] or []):
            raise ValueError(f"{NAME}.{name}: an empty glob; allowed: non-empty module-path globs")
    if not options["include"] and not options["groups"]:
        raise ValueError(
            f"{NAME}.include: give at least one module-path glob, e.g. 'blocks.*.ffn.net.0.proj', or groups >= 1"
        )


def _select(
    denoisers: list[torch.nn.Module], include: list[str], exclude: list[str], groups: set[str]
) -> list[tuple[int, str]]:
    """(denoiser index, module path) of every nn.Linear matched by an include glob or in one of `groups`, and not
    matched by exclude."""
    chosen = []
    for index, denoiser in enumerate(denoisers):
        for path, module in denoiser.named_modules():
            if not isinstance(module, torch.nn.Linear):
                continue
            wanted = group_of(path) in groups or any(fnmatch.fnmatchcase(path, p) for p in include)
            if wanted and not any(fnmatch.fnmatchcase(path, p) for p in exclude):
                chosen.append((index, path))
    return chosen


def group_of(path: str) -> str:
    """A module path with each numeric component as "*": its layer group ("blocks.3.ffn.net.0.proj" ->
    "blocks.*.ffn.net.*.proj"). Groups are matched by equality, not as globs (fnmatch's "*" also spans dots)."""
    return ".".join("*" if part.isdigit() else part for part in path.split("."))


def group_shapes(denoisers: list[torch.nn.Module]) -> dict[str, list[tuple[int, int]]]:
    """The nn.Linear layers inside the denoisers' numbered blocks, grouped by path with each numeric component as "*"
    ("blocks.3.attn1.to_q" -> "blocks.*.attn1.to_q"): glob -> (in_features, out_features) of each layer. Layers
    outside the blocks (timestep embedders, run once per sample; the output projection) are left out."""
    shapes: dict[str, list[tuple[int, int]]] = {}
    for denoiser in denoisers:
        for path, module in denoiser.named_modules():
            group = group_of(path)
            if isinstance(module, torch.nn.Linear) and "*" in group:
                shapes.setdefault(group, []).append((module.in_features, module.out_features))
    return shapes


def layer_groups(denoisers: list[torch.nn.Module]) -> list[tuple[str, int]]:
    """`group_shapes` as (glob, weights in the group), largest first (ties by glob). A block's Linears run on every
    token of their stream, so a group's weight count is its GEMMs' multiply-adds per token."""
    sizes = {group: sum(k * n for k, n in shapes) for group, shapes in group_shapes(denoisers).items()}
    return sorted(sizes.items(), key=lambda item: (-item[1], item[0]))


def rank_by_gain(
    shapes: dict[str, list[tuple[int, int]]], saved_s: Callable[[int, int], float]
) -> list[tuple[str, float]]:
    """(glob, seconds saved per forward) for each group of `shapes`, most saved first (ties by glob), where
    `saved_s(in, out)` is one layer's bf16 GEMM time less its FP8 path's (negative where FP8 is slower)."""
    gains = {group: sum(saved_s(k, n) for k, n in layers) for group, layers in shapes.items()}
    return sorted(gains.items(), key=lambda item: (-item[1], item[0]))


MEASURED_ROWS = 32760  # activation rows of the timed GEMMs: Wan2.1's 480x832x81 video tokens
_SAVED: dict[tuple[str, str, int, int, int], float] = {}  # (device, path, rows, in, out) -> seconds saved per call


def gemm_saving(device: torch.device, path: str, rows: int) -> Callable[[int, int], float]:
    """`saved_s(in, out)` for `rank_by_gain`: the median time of a bf16 nn.Linear(in, out) (random weights, no bias)
    on `rows` random rows less that of the same Linear through this plugin's `path` ("torchao" or "fused"), timed on
    `device` with `workbench.evidence.timing.time_call` (queued clock). Each shape is timed once per process and
    kept (`_SAVED`), so re-installs (a calibration's knob steps) rank the same."""
    from workbench.evidence.timing import time_call

    def saved_s(k: int, n: int) -> float:
        key = (str(device), path, rows, k, n)
        if key not in _SAVED:
            torch.manual_seed(0)
            dense = torch.nn.Linear(k, n, bias=False).to(device, torch.bfloat16)
            x = torch.randn(rows, k, device=device, dtype=torch.bfloat16)
            dense_s = time_call(lambda: dense(x), device, repeats=5, warmup=2).device_s
            if path == "fused":
                quantized = _fused_forward(dense)
            else:
                quantize_, config_cls, per_row = _torchao()
                quantized = torch.nn.Sequential(dense)
                quantize_(quantized, config_cls(granularity=per_row(), set_inductor_config=False))
            _SAVED[key] = dense_s - time_call(lambda: quantized(x), device, repeats=5, warmup=2).device_s
        return _SAVED[key]

    return saved_s


def machine_problem(device: torch.device) -> str | None:
    """Why this machine cannot run torchao's row-wise FP8 GEMM, or None."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return f"no CUDA device (session runs on {device}; needs compute capability >= 8.9)"
    return fp8_problem(device)


def _layer_problem(module: torch.nn.Linear, device: torch.device) -> str | None:
    if module.weight.device.type != device.type:  # a block ring or the session's memory plan holds it on the host
        return f"weight on {module.weight.device.type}, not {device.type} (streamed or offloaded)"
    if module.weight.dtype != torch.bfloat16:
        return f"weight dtype {module.weight.dtype} is not torch.bfloat16"
    if module.in_features % 16 or module.out_features % 16:
        return "in/out features not multiples of 16"
    return None


class _Installed(Handle):
    def __init__(
        self,
        spec: Spec,
        options: dict[str, Any],
        denoisers: list[torch.nn.Module],
        plan: list[Layer],
        device: torch.device,
        order: list[list[Any]] | None = None,
    ):
        super().__init__(spec, options, proof=("fp8_gemms",))
        self.order = order  # order="measured": [glob, ms saved per forward], most first
        problems = {problem for _, _, problem in plan if problem is not None}
        self.receipt.traceable(device, counters=("fp8_gemms",), fallbacks=problems)  # counted inside the blocks
        self.kept: list[tuple[torch.nn.Linear, torch.nn.Parameter, set[str]]] = []
        self.fused: list[torch.nn.Linear] = []
        self.hooks = []
        targets = {id(module) for _, module, problem in plan if problem is None}
        try:
            if options["path"] == "fused":
                for _, module, problem in plan:
                    if problem is None:
                        module.forward = _fused_forward(module)
                        self.fused.append(module)
            elif targets:
                quantize_, config_cls, per_row = _torchao()
                for _, module, problem in plan:
                    if problem is None:  # torchao replaces the Parameter and adds an extra_repr attribute
                        self.kept.append((module, module.weight, set(module.__dict__)))
                config = config_cls(granularity=per_row(), set_inductor_config=False)
                for denoiser in denoisers:
                    quantize_(denoiser, config, filter_fn=lambda module, fqn: id(module) in targets)
                for path, module, problem in plan:
                    if problem is None and not _is_quantized(module):
                        raise RuntimeError(f"{NAME}: torchao left {path} unquantized")
            for _, module, problem in plan:
                self.hooks.append(module.register_forward_pre_hook(self._counter(problem)))
        except Exception:
            self._remove()
            raise

    def begin_request(self, request_id: int, steps: int) -> None:
        super().begin_request(request_id, steps)
        if self.order is not None:
            self.receipt.notes["group_order"] = self.order

    def _counter(self, problem: str | None):
        def bump(*_: Any) -> None:
            if problem is None:
                self.receipt.count("fp8_gemms")
            else:
                self.receipt.count_fallback(problem)

        return bump

    def _remove(self) -> None:
        for hook in self.hooks:
            hook.remove()
        self.hooks = []
        for module in self.fused:
            del module.forward
        self.fused = []
        for module, weight, attributes in self.kept:
            module._parameters["weight"] = weight
            for name in set(module.__dict__) - attributes:
                del module.__dict__[name]
        self.kept = []


def _fused_forward(module: torch.nn.Linear):
    """The Linear on FP8 operands: its weight quantized now (row-wise), each input when called; marked
    `own_copy`."""
    from workbench.kernels.fp8_rowwise import fp8_linear, quantize_rows

    weight_q, weight_scale = quantize_rows(module.weight.detach())
    bias = module.bias

    def forward(x: torch.Tensor) -> torch.Tensor:
        return fp8_linear(x, weight_q, weight_scale, bias)

    return own_copy(forward, NAME)


def _is_quantized(module: torch.nn.Linear) -> bool:
    return type(module.weight) not in (torch.Tensor, torch.nn.Parameter)


@dataclass(frozen=True)
class SelectiveFP8Config:
    """selective_fp8's options: `include` globs and/or the `groups` largest layer groups (which layers to quantize
    is the trade, so neither has a default that selects any)."""

    include: list[str] | None = option(None, help="fnmatch globs of module paths, e.g. blocks.*.ffn.net.0.proj")
    groups: int = option(0, minimum=0, help="also the N largest Linear groups (blocks.*.<path>, by weight count)")
    exclude: list[str] = option([], help="globs removed from the selection")
    allow_fallback: bool = option(False, help="keep layers this machine cannot quantize dense, counted")
    path: str = option(
        "torchao",
        allowed=("torchao", "fused"),
        help="torchao's quantized Linears, or the workbench's fused row-wise quantization + torch._scaled_mm",
    )
    order: str = option(
        "size",
        allowed=("size", "measured"),
        help="how groups=N ranks the groups: by weight count, or by the time their FP8 GEMMs save here (measured)",
    )


def _prepare(model: Any, options: dict[str, Any], device: torch.device):
    include, exclude = options["include"] or [], options["exclude"]
    denoisers = model.denoisers()
    if options["order"] == "measured" and options["groups"]:
        if (problem := machine_problem(device)) is not None:
            raise RuntimeError(f"{NAME}.order='measured': times FP8 GEMMs on the session's GPU; {problem}")
        ranking = rank_by_gain(group_shapes(denoisers), gemm_saving(device, options["path"], MEASURED_ROWS))
    else:
        ranking = layer_groups(denoisers)
    groups = {group for group, _ in ranking[: options["groups"]]}
    chosen = _select(denoisers, include, exclude, groups)
    if not chosen:
        raise ValueError(
            f"{NAME}.include: {include} (groups {sorted(groups)}, exclude {exclude}) matches no nn.Linear in the "
            "denoiser(s); patterns are fnmatch globs against named_modules() paths"
        )
    if options["path"] == "torchao":
        _torchao()
    machine = machine_problem(device)
    plan: list[Layer] = []
    problems = []
    for index, path in chosen:
        module = denoisers[index].get_submodule(path)
        problem = machine or _layer_problem(module, device)
        if problem is None and options["path"] == "fused" and ("forward" in module.__dict__ or module._forward_hooks):
            raise RuntimeError(f"{NAME}: {path} already has an instance forward or hooks (another plugin?)")
        if problem is not None:
            problems.append(f"{path}: {problem}")
        plan.append((path, module, problem))
    if problems and not options["allow_fallback"]:
        shown = "; ".join(problems[:3]) + (f"; ... ({len(problems)} layers)" if len(problems) > 3 else "")
        raise RuntimeError(
            f"{NAME}: row-wise FP8 cannot run here: {shown}. Needs CUDA compute capability >= 8.9, bf16 weights "
            "on the session's device and features that are multiples of 16; allow_fallback=True keeps such layers "
            "dense and counts them as fallbacks"
        )
    order = [[group, round(1e3 * gain, 4)] for group, gain in ranking] if options["order"] == "measured" else None
    return lambda: _Installed(SPEC, options, denoisers, plan, device, order)


SPEC = Spec(
    name=NAME,
    contract="approximate",
    summary="row-wise dynamic FP8 (activations and weights) for the Linear layers a glob selects (torchao or fused)",
    prepare_fn=_prepare,
    config=SelectiveFP8Config,
    joint=_selection,
    knob=Knob("groups", 1, 8, integer=True),
    touches=("attention.projections", "linear.weights"),
    order=30,
    capabilities=(89, 90, 100),  # FP8 (e4m3) tensor cores: Ada, Hopper, Blackwell
)
SPECS = (SPEC,)
