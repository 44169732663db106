"""Type stubs of the native module ``posenc._posenc`` (built from
``crates/posenc-py`` with PyO3)."""

from os import PathLike
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union, final

import numpy as np
import numpy.typing as npt

__all__ = [
    "alibi_bias",
    "alibi_slopes",
    "cope_positions",
    "fire_distances",
    "shaw_indices",
    "sinusoidal",
    "t5_bias",
    "t5_buckets",
    "xpos_scales",
    "finetune",
    "Model",
    "_alibi_slopes_f32",
    "_attention_backward",
    "_attention_forward",
    "_kept_pool_bytes",
    "_KeptLogits",
    "_method_forward",
    "_rope_ptr",
    "simd_level",
    "PasskeyProbe",
    "Frequencies",
    "RopeConfig",
    "__version__",
    "PosencError",
]

__version__: str

class PosencError(ValueError):
    """An error reported by posenc: a bad argument, shape, dtype, device,
    name or file, with the same one-line message the ``posenc`` command
    prints."""

@final
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

@final
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

def _rope_ptr(
    rope: RopeConfig, bf16: bool, q: int, oq: int, q_shape: Tuple[int, int, int, int], k: int, ok: int,
    k_shape: Tuple[int, int, int, int], offset: int, ids: Any, inverse: bool,
) -> None: ...
# The inputs (q, k, v) of a fused attention call (float32 numpy arrays).
_Qkv = Tuple[Any, Any, Any]
# The attention of a fused call: (causal, scale, rope, alibi slopes, offset, position ids).
_Attention = Tuple[bool, Optional[float], Optional[RopeConfig], Any, int, Any]

@final
class _KeptLogits:
    """The logits a fused forward kept for its backward (opaque; its buffer
    returns to posenc's pool of idle ones when dropped)."""

    @property
    def nbytes(self) -> int:
        """Bytes held."""

def _kept_pool_bytes() -> Tuple[int, int]: ...
def _attention_forward(
    qkv: _Qkv, out: Any, lse: Any, attention: _Attention, keep_bytes: int = 0
) -> Optional[_KeptLogits]: ...
def _attention_backward(
    qkv: _Qkv, out: Any, lse: Any, dout: Any, grads: _Qkv, attention: _Attention, kept: Optional[_KeptLogits] = None
) -> None: ...
def _method_forward(rope: RopeConfig, qkv: _Qkv, out: Any, bthd: bool = False) -> None: ...
def _alibi_slopes_f32(heads: int) -> npt.NDArray[np.float32]: ...


# --- Model and finetune (crates/posenc-py/src/model.rs) -------------------

from typing import Callable

_ModelPath = Union[str, "PathLike[str]"]
_ModelText = Union[str, "PathLike[str]"]
_Progress = Callable[[int, int, str], object]

@final
class Model:
    """A pretrained decoder (GGUF file or Hugging Face checkpoint directory),
    loaded once and probed as the ``posenc`` command probes it.

    Every call that reads weights or runs the model releases the GIL, calls
    ``progress(done, total, what)`` (if given) at least once per layer,
    trial or step (first with ``done = 0`` and ``what`` a one-line
    description of the run), and stops within about a second on Ctrl-C
    (``KeyboardInterrupt``) or when ``progress`` raises (that exception is
    raised). Bad inputs raise ``PosencError`` with the command's one-line
    message.
    """

    @staticmethod
    def load(path: _ModelPath, tokenizer: Optional[_ModelPath] = None, products: str = "f32") -> "Model":
        """Open and load the model at ``path`` (a ``.gguf`` file, a checkpoint
        directory or its ``config.json``), with ``tokenizer`` (a
        ``tokenizer.json``) instead of its own, and the attention's
        ``products`` (``"f32"`` or ``"bf16"``) past 1,024 tokens."""

    def perplexity(
        self,
        text: Optional[_ModelText] = None,
        length: Optional[int] = None,
        scalings: Union[str, Sequence[str], None] = None,
        adapter: Optional[_ModelPath] = None,
        band: int = 1024,
        held_out: bool = False,
        per_position: bool = False,
        progress: Optional[_Progress] = None,
        max_memory: Union[int, str, None] = None,
    ) -> Dict[str, Any]:
        """The loss at every position of a window, per scaling: the dict
        ``posenc perplexity --json`` prints.

        ``text``: a ``str`` is the text itself, a path a UTF-8 file (read only
        as far as the window needs, unless ``held_out``); default: the
        built-in *Pride and Prejudice*. ``length``: the window (default twice
        the trained length). ``scalings``: one name (``"yarn:2"``,
        ``"self-extend:4:1024+yarn:2"``; commas allowed) or a list (``None``:
        ``"none"``). ``adapter``: a LoRA adapter directory (PEFT layout) merged for this
        call only (the loaded weights are restored after it). ``held_out``:
        score the text's last 10% of tokens (read in pieces: only the window's
        tokens are kept). ``per_position``: include ``"loss"``, the loss at
        every position. ``max_memory``: the memory the call may use, bytes or
        a size such as ``"900M"`` (default: the available memory and
        ``RLIMIT_AS``); a call whose estimate is over it raises
        ``PosencError`` before anything large is allocated, naming the
        largest ``length`` that fits."""

    def passkey(
        self,
        lengths: Sequence[int],
        depths: Sequence[float],
        trials: int = 1,
        scalings: Union[str, Sequence[str], None] = None,
        haystack: Optional[_ModelText] = None,
        seed: int = 0,
        progress: Optional[_Progress] = None,
        max_memory: Union[int, str, None] = None,
    ) -> Dict[str, Any]:
        """Passkey retrieval over prompt ``lengths`` × needle ``depths``
        (``trials`` keys per cell) for each scaling: the dict ``posenc passkey
        --json`` prints. ``haystack``: ``None`` (the landmark passkey
        prompt), a ``str`` (RULER's needle hidden in that text) or a path to
        such a text. ``max_memory``: as ``perplexity``'s, at the longest
        length."""

    def generate(
        self,
        prompt: _ModelText,
        max_new_tokens: int = 32,
        scaling: str = "none",
        temperature: float = 0.0,
        top_p: float = 1.0,
        seed: int = 0,
        max_memory: Union[int, str, None] = None,
    ) -> str:
        """The text generated after ``prompt`` (a ``str``, or a path to a
        UTF-8 file): at most ``max_new_tokens`` tokens with one ``scaling``,
        greedy at ``temperature`` 0, else sampled (nucleus ``top_p``,
        ``seed``); ``posenc generate --json``'s ``"text"``. ``max_memory``:
        as ``perplexity``'s, for the prompt and the new tokens."""

    @property
    def config(self) -> Dict[str, Any]:
        """The model's configuration (architecture, sizes, heads, RoPE type,
        trained length, special tokens)."""

    @property
    def trained_length(self) -> int:
        """The context length the model was trained at (``L``)."""

    @property
    def source(self) -> str:
        """One line on the model's files: format and tensor types."""

    @property
    def tokenizer(self) -> str:
        """The tokenizer's description."""

def finetune(
    model: Optional[_ModelPath],
    out: _ModelPath,
    *,
    length: Optional[int] = None,
    steps: Optional[int] = None,
    pose: Optional[int] = None,
    text: Optional[_ModelPath] = None,
    tokenizer: Optional[_ModelPath] = None,
    scaling: Optional[str] = None,
    lr: Optional[float] = None,
    warmup: Optional[int] = None,
    batch: Optional[int] = None,
    seed: Optional[int] = None,
    lora: int = 8,
    alpha: float = 8.0,
    dropout: float = 0.0,
    targets: str = "q_proj,v_proj",
    train: Optional[str] = None,
    schedule: str = "linear",
    weight_decay: float = 0.01,
    clip: float = 1.0,
    checkpoint_every: int = 0,
    checkpoint_layers: bool = False,
    merge: bool = False,
    resume: bool = False,
    progress: Optional[_Progress] = None,
    max_memory: Union[int, str, None] = None,
) -> Dict[str, Any]:
    """LoRA fine-tuning of the pretrained ``model`` at a new context
    ``length`` into the directory ``out``: what ``posenc finetune --model
    MODEL --out OUT --json`` does and prints (the options are its flags,
    ``_`` for ``-``; ``text`` and ``tokenizer`` are files; ``model`` may be
    ``None`` with ``resume=True``). ``out`` is checked before any work, and
    the memory plan (``max_memory``, as ``Model.perplexity``'s) before the
    text is tokenized or a weight read. The
    GIL is released; ``progress(done, total, what)`` is called at the start
    and about every 200 ms. Ctrl-C (or ``progress`` raising) stops after
    the step in progress with a checkpoint in ``out`` (continue it with
    ``resume=True``) and raises that exception."""

@final
class PasskeyProbe:
    """The prompts, keys and scoring of a ``posenc passkey`` grid for a model
    run elsewhere (``posenc.hf.passkey``): the grid and names checked as the
    command checks them, each length's filler calibrated on the tokenizer
    given as its ``tokenizer.json`` text, the keys drawn from ``seed``.
    Bad inputs raise ``PosencError`` with the command's one-line message."""

    def __new__(
        cls,
        tokenizer_json: str,
        lengths: Sequence[int],
        depths: Sequence[float],
        trials: int,
        methods: Sequence[str],
        haystack: Optional[str] = None,
        seed: int = 0,
    ) -> "PasskeyProbe": ...
    @staticmethod
    def check(lengths: Sequence[int], depths: Sequence[float], trials: int, methods: Sequence[str]) -> None:
        """Checks a grid as the constructor does, without a tokenizer
        (before a model is loaded); raises ``PosencError``."""
    @property
    def methods(self) -> List[str]:
        """The scaling and method names, as parsed."""
    @property
    def lengths(self) -> List[int]: ...
    @property
    def depths(self) -> List[float]: ...
    @property
    def trials(self) -> int: ...
    @property
    def format(self) -> str:
        """``"passkey (landmark)"`` or ``"needle (RULER niah_single)"``."""
    @property
    def max_new_tokens(self) -> int:
        """Tokens generated per trial (10)."""
    def reuses_cache(self, method: str) -> bool:
        """Whether the prompts of one length may share the KV cache of the
        one before under ``method`` (not dynamic NTK, not DCA)."""
    def prompt(self, length: int, depth: float, trial: int) -> Tuple[List[int], List[int], int]:
        """``(ids, answer_ids, key)`` of trial ``trial`` of the cell
        (``length``, ``depth``), as ``posenc passkey`` builds it."""
    def read(self, ids: Sequence[int]) -> Tuple[str, Optional[int]]:
        """The generated ids' text and the first integer in it."""
    def add_method(self, method: str, results_json: str, run_seconds: float) -> None:
        """Records ``method``'s trial records (a JSON list, the command's
        fields) and its call's seconds."""
    def document(self, model: str, trained_length: int, run_seconds: float) -> Dict[str, Any]:
        """The dict ``posenc passkey --json`` prints for the methods added."""
