"""posenc: positional encodings for transformers, from Python.

The same Rust library the ``posenc`` command runs, with no formula written a
second time in Python:

- ``RopeConfig``: a model's RoPE from its ``config.json`` (every Hugging Face
  ``rope_type``), any scaling or training-free method by name
  (``"yarn:2"``, ``"self-extend:4:1024+yarn:2"``), its inverse frequencies,
  attention factor and cos/sin tables as numpy arrays.
- every other family's numbers: ``sinusoidal``, ``alibi_slopes``,
  ``alibi_bias``, ``t5_buckets``, ``t5_bias``, ``shaw_indices``,
  ``xpos_scales``, ``fire_distances``, ``cope_positions``.
- ``posenc.torch`` (when PyTorch is installed): ``apply_rope`` and
  ``attention`` as autograd functions on posenc's fused CPU kernels, without
  copying contiguous CPU tensors, and a pure-PyTorch path on other devices.
- ``Model``: pretrained decoders (GGUF, safetensors) and their probes
  (``perplexity``, ``passkey``, ``generate``), and ``finetune``.

Every error is a ``PosencError`` (a ``ValueError``) with the words the
``posenc`` command prints.
"""

from __future__ import annotations

from . import _posenc
from ._posenc import (
    Frequencies,
    PosencError,
    RopeConfig,
    alibi_bias,
    alibi_slopes,
    cope_positions,
    fire_distances,
    shaw_indices,
    simd_level,
    sinusoidal,
    t5_bias,
    t5_buckets,
    xpos_scales,
)

__version__ = _posenc.__version__

__all__ = [
    "Frequencies",
    "PosencError",
    "RopeConfig",
    "alibi_bias",
    "alibi_slopes",
    "cope_positions",
    "fire_distances",
    "shaw_indices",
    "simd_level",
    "sinusoidal",
    "t5_bias",
    "t5_buckets",
    "xpos_scales",
]

# The pretrained models, where the native module has them.
if hasattr(_posenc, "Model"):
    from ._posenc import Model  # noqa: F401

    __all__.append("Model")
if hasattr(_posenc, "finetune"):
    from ._posenc import finetune  # noqa: F401

    __all__.append("finetune")

try:  # pure-Python conveniences around the models (progress bars), if any
    from ._model import *  # noqa: F401,F403
    from . import _model as _model_module

    __all__.extend(getattr(_model_module, "__all__", []))
except ImportError:  # pragma: no cover - the module is optional
    pass
