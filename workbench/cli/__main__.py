"""`python -m workbench.cli ...`: the `workbench` command, as `generate --gpus N` starts it on each rank under
torchrun (`workbench.distributed.launch`); a rank leaves without the interpreter's teardown."""

import sys

from workbench.cli import main

if __name__ == "__main__":
    from workbench import distributed

    code = main()
    if distributed.is_worker():  # a torchrun rank: leave without the interpreter's teardown
        distributed.exit_worker(code or 0)
    sys.exit(code)
