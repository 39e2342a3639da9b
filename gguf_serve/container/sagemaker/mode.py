"""Whether this start is SageMaker's: the light check the launcher's entry point makes before anything else.

SageMaker starts the image with the argument `serve` alone (contract.SERVE_ARGV); the EC2 boot script always
passes `serve --spec ... --model-dir ...`, and a local `docker run <image>` has no model data and no spec in the
environment. So: exactly `serve`, and either the runtime spec in the environment (the stack puts it in the model's
Environment) or SageMaker's model folder. Standard library only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from gguf_serve.container.names import RUNTIME_SPEC_ENV
from gguf_serve.container.sagemaker.contract import MODEL_DIR, SERVE_ARGV


def sagemaker_mode(argv: Sequence[str], environ: Mapping[str, str], model_dir: str = MODEL_DIR) -> bool:
    return tuple(argv) == SERVE_ARGV and (RUNTIME_SPEC_ENV in environ or Path(model_dir).is_dir())
