"""Type stubs of the native module ``posenc._posenc`` (built from
``crates/posenc-py`` with PyO3)."""

from os import PathLike
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import numpy.typing as npt

__version__: str

class PosencError(ValueError):
    """An error reported by posenc: a bad argument, shape, dtype, device,
    name or file, with the same one-line message the ``posenc`` command
    prints."""

class Frequencies:
    """The frequencies of a RoPE at one sequence length."""

    @property
    def inv_freq(self) -> npt.NDArray[np.float64]:
        """The ``rotary_dim / 2`` inverse frequencies (transformers' float32
        values, exactly, as float64)."""
    @property
    def attention_factor(self) -> float:
        """The factor cos and sin are multiplied by (YaRN's ``0.1·ln s + 1``,
        LongRoPE's; 1 otherwise)."""
    @property
    def rotary_dim(self) -> int:
        """Rotated entries of each head vector."""
    @property
    def rope_type(self) -> str:
        """transformers' ``rope_type``."""
    @property
    def layout(self) -> str:
        """``"half-split"`` (transformers' ``rotate_half``) or ``"interleaved"``."""

class RopeConfig:
    """A model's RoPE, read from its ``config.json`` exactly as transformers
    reads it, with any scaling or training-free method on top."""

    @staticmethod
    def from_hf(src: Union[str, "PathLike[str]", Dict[str, Any]]) -> "RopeConfig":
        """Reads a Hugging Face ``config.json``: a path, a dict, or the JSON
        text (a string starting with ``{``). Raises ``PosencError`` naming the
        file and key for a config transformers would refuse."""
    @staticmethod
    def plain(
        theta: float,
        rotary_dim: int,
        layout: str = "half-split",
        head_dim: Optional[int] = None,
        max_position_embeddings: Optional[int] = None,
    ) -> "RopeConfig":
        """Plain RoPE with base ``theta`` over ``rotary_dim`` entries;
        ``max_position_embeddings`` is the trained length scaling factors
        are relative to."""
    def with_scaling(self, name: str) -> "RopeConfig":
        """A new config with ``name`` on the model's own RoPE: ``model``,
        ``none``, ``linear:F``, ``dynamic:F``, ``ntk:F``, ``yarn:F``, a method
        (``self-extend:G:W``, ``rerope:W``, ``leaky-rerope:W:K``,
        ``dca:CHUNK:LOCAL``, ``sinks:S:WINDOW``) or ``METHOD+SCALING``."""
    def frequencies(self, seq_len: Optional[int] = None) -> Frequencies:
        """The frequencies at ``seq_len`` (``None``: the load-time table), as
        transformers' ``ROPE_INIT_FUNCTIONS``."""
    def cos_sin(
        self,
        positions: Sequence[int],
        dtype: str = "float32",
        seq_len: Optional[int] = None,
        full: bool = True,
    ) -> Tuple[npt.NDArray[Any], npt.NDArray[Any]]:
        """``(cos, sin)`` at ``positions``, angles in float64, attention
        factor applied: ``(N, rotary_dim)`` in transformers' layout with
        ``full=True``, ``(N, rotary_dim/2)`` otherwise; ``dtype``
        ``"float32"`` or ``"float64"``."""
    def inspect(self, target_length: Optional[int] = None) -> Dict[str, Any]:
        """The dict ``posenc rope inspect --json`` prints."""
    @property
    def rope_type(self) -> str: ...
    @property
    def theta(self) -> float: ...
    @property
    def head_dim(self) -> int: ...
    @property
    def rotary_dim(self) -> int: ...
    @property
    def layout(self) -> str: ...
    @property
    def max_position_embeddings(self) -> Optional[int]: ...
    @property
    def trained_length(self) -> Optional[int]:
        """The trained length the scaling factors are relative to."""
    @property
    def scaling(self) -> Optional[str]:
        """The name given to ``with_scaling`` in canonical form."""
    @property
    def method(self) -> Optional[str]:
        """The training-free attention method of the scaling, if any."""
    def _tables(self, ids: npt.NDArray[np.int64], q_len: int) -> Tuple[npt.NDArray[np.float32], ...]: ...
    def _method_plan(self, q_len: int, k_len: int) -> Tuple[List[Tuple[npt.NDArray[Any], ...]], npt.NDArray[np.float32], float]: ...

def sinusoidal(
    length: int,
    dim: int,
    base: float = 10000.0,
    offset: int = 0,
    layout: str = "interleaved",
    spacing: str = "paper",
) -> npt.NDArray[np.float64]:
    """The sinusoidal encoding of Vaswani et al. (2017): ``(length, dim)``."""

def alibi_slopes(heads: int) -> npt.NDArray[np.float64]:
    """ALiBi's slopes for ``heads`` heads (Press et al. 2022)."""

def alibi_bias(
    heads: int,
    q_len: int,
    k_len: Optional[int] = None,
    causal: bool = True,
    q_offset: Optional[int] = None,
    k_offset: int = 0,
) -> npt.NDArray[np.float64]:
    """ALiBi's biases ``(heads, q_len, k_len)``."""

def t5_buckets(
    q_len: int,
    k_len: Optional[int] = None,
    num_buckets: int = 32,
    max_distance: int = 128,
    bidirectional: bool = True,
    q_offset: int = 0,
    k_offset: int = 0,
) -> npt.NDArray[np.int64]:
    """T5's relative position buckets ``(q_len, k_len)`` (Raffel et al. 2020)."""

def t5_bias(
    table: npt.NDArray[np.float64],
    q_len: int,
    k_len: Optional[int] = None,
    max_distance: int = 128,
    bidirectional: bool = True,
) -> npt.NDArray[np.float64]:
    """T5's bias ``(heads, q_len, k_len)`` from a ``(num_buckets, heads)`` table."""

def shaw_indices(
    q_len: int,
    k_len: Optional[int] = None,
    max_relative: int = 16,
    q_offset: int = 0,
    k_offset: int = 0,
) -> npt.NDArray[np.int64]:
    """Shaw et al.'s clipped relative indices ``clip(j − i, −K, K) + K``."""

def xpos_scales(
    positions: Sequence[int],
    head_dim: int,
    scale_base: float = 512.0,
    gamma: float = 0.4,
    key: bool = False,
) -> npt.NDArray[np.float64]:
    """xPos's per-pair scales ``(len(positions), head_dim/2)`` (Sun et al. 2023)."""

def fire_distances(
    q_len: int, k_len: Optional[int] = None, c: float = 0.1, threshold: float = 512.0
) -> npt.NDArray[np.float64]:
    """FIRE's normalised distances at its initial parameters (Li et al. 2024)."""

def cope_positions(
    q: npt.NDArray[np.float64], k: npt.NDArray[np.float64], npos_max: int = 64, causal: bool = True
) -> npt.NDArray[np.float64]:
    """CoPE's contextual positions ``(T_q, T_k)`` (Golovneva et al. 2024)."""

def simd_level() -> str:
    """The SIMD level posenc's kernels run at on this CPU."""

def _rope_f32(rope: RopeConfig, x: Any, out: Any, offset: int, ids: Any, key: bool, inverse: bool) -> None: ...
def _rope_bf16(rope: RopeConfig, x: Any, out: Any, offset: int, ids: Any, key: bool, inverse: bool) -> None: ...
def _attention_forward(
    q: Any, k: Any, v: Any, out: Any, lse: Any, causal: bool, scale: Optional[float],
    rope: Optional[RopeConfig], alibi: Any, offset: int, ids: Any,
) -> None: ...
def _attention_backward(
    q: Any, k: Any, v: Any, out: Any, lse: Any, dout: Any, dq: Any, dk: Any, dv: Any, causal: bool,
    scale: Optional[float], rope: Optional[RopeConfig], alibi: Any, offset: int, ids: Any,
) -> None: ...
def _method_forward(rope: RopeConfig, q: Any, k: Any, v: Any, out: Any) -> None: ...
def _alibi_slopes_f32(heads: int) -> npt.NDArray[np.float32]: ...
