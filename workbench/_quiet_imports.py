"""Import diffusers and transformers without importing torchao: `import workbench` writes nothing to stderr.

diffusers and transformers register a torchao quantizer when their `quantizers` package is first imported
(diffusers through any model class, transformers through `PreTrainedModel`, which diffusers' loaders import),
and both quantizer modules import torchao at module level whenever torchao is installed. torchao 0.18 then
prints on import: its optional C extensions failing to load (`_C_mxfp8`, `_C_cutlass_90a` on a machine without
them), two `torch.utils._pytree` deprecation warnings, and diffusers' "Unable to import `torchao` Tensor
objects". The workbench never loads a torchao-quantized checkpoint through either library (it loads
safetensors itself); it uses torchao only in `selective_fp8`'s torchao path, which imports torchao itself
when that plugin is installed.

`defer_torchao()` imports both quantizer registries once while the library's "torchao available" check reads
False, then restores the check everywhere it was bound, so the libraries' runtime checks (diffusers' group
offloading asks whether a tensor is a torchao tensor) still see the truth. What it gives up: the libraries'
`TorchAoConfig` quantization at `from_pretrained` time, which the workbench does not use.
"""

from __future__ import annotations

import importlib
import sys


def defer_torchao() -> None:
    """Load diffusers' and transformers' quantizer registries without importing torchao (idempotent)."""
    if "diffusers.quantizers" not in sys.modules:
        from diffusers.utils import import_utils

        available = import_utils._torchao_available  # read by diffusers' is_torchao_available() at each call
        import_utils._torchao_available = False
        try:
            importlib.import_module("diffusers.quantizers")
        finally:
            import_utils._torchao_available = available
    if "transformers.quantizers" not in sys.modules:
        import transformers.utils

        real = transformers.utils.is_torchao_available  # modules bind it by `from ..utils import ...`

        def unavailable(*args: object, **kwargs: object) -> bool:
            return False

        transformers.utils.is_torchao_available = unavailable
        try:
            importlib.import_module("transformers.quantizers")
        finally:
            for module in list(sys.modules.values()):
                if getattr(module, "is_torchao_available", None) is unavailable:
                    module.is_torchao_available = real
