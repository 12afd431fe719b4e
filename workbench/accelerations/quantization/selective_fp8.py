"""Selective FP8: row-wise dynamic FP8 activations and weights for chosen denoiser Linear layers (contract:
approximate), through torchao or the workbench's fused path.

`include` / `exclude` are `fnmatch` globs against each denoiser's `named_modules()` paths (e.g.
"blocks.*.ffn.net.0.proj"); only `nn.Linear` layers are eligible. `groups=N` adds the N largest layer groups
(`layer_groups`: a block Linear's path with its indices as "*", e.g. "blocks.*.ffn.net.*.proj", ranked by the weights
the group holds, which is its GEMMs' share of the FLOPs per token): the knob a calibration searches, from the largest
group alone to eight. The ranking is by size, not by a measured gain: it needs no GPU, and the calibration's record
shows what each step bought. torchao's
`Float8DynamicActivationFloat8WeightConfig(granularity=PerRow())` needs CUDA with compute capability
>= 8.9, bf16 weights, and in/out features that are multiples of 16 (torchao skips other layers silently;
this plugin refuses them instead). Without those the plugin refuses with a RuntimeError unless
`allow_fallback=True`; then the layers it cannot quantize stay dense and every call of one is counted in
`receipt.fallbacks` under its reason. `fp8_gemms` counts calls of quantized Linears (forward pre-hooks),
so a receipt with only fallbacks is not executed and the result stays exact.

`path="fused"`: the same row-wise recipe without torchao's eager quantization, which costs about six torch passes
per activation (on the 33.1B MiniMax-H3 forward about as much as the FP8 GEMMs save). Each weight is quantized once at install by `kernels/fp8_rowwise.quantize_rows` (kept by the
handle, not the module: the module's parameters are untouched); each call quantizes its activation rows in one
kernel and runs `torch._scaled_mm` with both row scales (`fp8_linear`), through an instance-level forward on the
Linear that uninstall deletes. Same hardware and layer rules; another plugin's forward on the Linear is refused.
`python -m benchmarks run forward-h3` measures it on H3's six Linears per block (its block_sparse+norms+fp8 arm).

torchao has no unquantize: each original weight Parameter is kept and put back on uninstall, along with
the instance attributes torchao adds (`extra_repr`), so the model's fingerprint is restored exactly. The
quantized copies are extra memory while installed; this plugin is about compute, not weight memory.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import Any

import torch

from workbench.accelerations.base import Handle, Knob, Spec, option

NAME = "selective_fp8"
Layer = tuple[str, torch.nn.Linear, "str | None"]  # module path, the Linear, why it stays dense (None: quantized)
MIN_CAPABILITY = (8, 9)


def _torchao():
    try:
        from torchao.quantization import Float8DynamicActivationFloat8WeightConfig, PerRow, quantize_
    except ImportError as error:
        raise RuntimeError(
            f"{NAME}: needs torchao (pip install 'vflash-workbench[fp8]', i.e. torchao==0.18.0): {error}"
        ) from None
    return quantize_, Float8DynamicActivationFloat8WeightConfig, PerRow


def _patterns(options: dict[str, Any], name: str) -> list[str]:
    patterns = options[name]
    bad = [p for p in patterns if not isinstance(p, str) or not p]
    if bad:
        raise ValueError(f"{NAME}.{name}: expected non-empty module-path glob strings, got {bad!r}")
    return list(patterns)


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


def layer_groups(denoisers: list[torch.nn.Module]) -> list[tuple[str, int]]:
    """The nn.Linear layers inside the denoisers' numbered blocks, grouped by path with each numeric component as "*"
    ("blocks.3.attn1.to_q" -> "blocks.*.attn1.to_q"), as (glob, weights in the group), largest first (ties by
    glob). A block's Linears run on every token of their stream, so a group's weight count is its GEMMs'
    multiply-adds per token; layers outside the blocks (timestep embedders, run once per sample; the output
    projection) are left out."""
    sizes: dict[str, int] = {}
    for denoiser in denoisers:
        for path, module in denoiser.named_modules():
            group = group_of(path)
            if isinstance(module, torch.nn.Linear) and "*" in group:
                sizes[group] = sizes.get(group, 0) + module.weight.numel()
    return sorted(sizes.items(), key=lambda item: (-item[1], item[0]))


def machine_problem(device: torch.device) -> str | None:
    """Why this machine cannot run torchao's row-wise FP8 GEMM, or None."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return f"no CUDA device (session runs on {device}; needs compute capability >= 8.9)"
    capability = torch.cuda.get_device_capability(device)
    if capability < MIN_CAPABILITY:
        return f"CUDA compute capability {capability[0]}.{capability[1]} < 8.9"
    return None


def _layer_problem(module: torch.nn.Linear) -> str | None:
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
    ):
        super().__init__(spec, options, proof=("fp8_gemms",))
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
    """The Linear on FP8 operands: its weight quantized now (row-wise), each input when called."""
    from workbench.kernels.fp8_rowwise import fp8_linear, quantize_rows

    weight_q, weight_scale = quantize_rows(module.weight.detach())
    bias = module.bias

    def forward(x: torch.Tensor) -> torch.Tensor:
        return fp8_linear(x, weight_q, weight_scale, bias)

    return forward


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


def _prepare(model: Any, options: dict[str, Any], device: torch.device):
    include = [] if options["include"] is None else _patterns(options, "include")
    exclude = _patterns(options, "exclude")
    if not include and not options["groups"]:
        raise ValueError(
            f"{NAME}.include: give at least one module-path glob, e.g. 'blocks.*.ffn.net.0.proj', or groups >= 1"
        )
    denoisers = model.denoisers()
    groups = {group for group, _ in layer_groups(denoisers)[: options["groups"]]}
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
        problem = machine or _layer_problem(module)
        if problem is None and options["path"] == "fused" and ("forward" in module.__dict__ or module._forward_hooks):
            raise RuntimeError(f"{NAME}: {path} already has an instance forward or hooks (another plugin?)")
        if problem is not None:
            problems.append(f"{path}: {problem}")
        plan.append((path, module, problem))
    if problems and not options["allow_fallback"]:
        shown = "; ".join(problems[:3]) + (f"; ... ({len(problems)} layers)" if len(problems) > 3 else "")
        raise RuntimeError(
            f"{NAME}: torchao row-wise FP8 cannot run here: {shown}. Needs CUDA compute capability >= 8.9, "
            "bf16 weights and features that are multiples of 16; allow_fallback=True keeps such layers dense "
            "and counts them as fallbacks"
        )
    return lambda: _Installed(SPEC, options, denoisers, plan, device)


SPEC = Spec(
    name=NAME,
    contract="approximate",
    summary="row-wise dynamic FP8 (activations and weights) for the Linear layers a glob selects (torchao or fused)",
    prepare_fn=_prepare,
    config=SelectiveFP8Config,
    knob=Knob("groups", 1, 8, integer=True),
    touches=("attention.projections", "linear.weights"),
    order=30,
    capabilities=(89, 90, 100),  # FP8 (e4m3) tensor cores: Ada, Hopper, Blackwell
)
SPECS = (SPEC,)
