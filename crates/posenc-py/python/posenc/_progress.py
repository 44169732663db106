"""The default progress display of long calls (``Model.perplexity``,
``passkey``, ``finetune``): a tqdm bar when tqdm is installed (``tqdm.auto``:
a widget in notebooks, a bar on a terminal, nothing when stderr is not a
terminal), otherwise nothing. Pass ``progress=`` a callable ``(done, total,
what)`` to get the ticks yourself, or ``progress=False`` for none."""

from __future__ import annotations

from typing import Any, Callable, Optional


def default() -> Optional[Callable[[int, int, str], None]]:
    """A callback drawing a tqdm bar, or None without tqdm."""
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    state = {"bar": None}

    def tick(done: int, total: int, what: str) -> None:
        bar = state["bar"]
        if bar is None or bar.total != total:
            if bar is not None:
                bar.close()
            bar = state["bar"] = tqdm(total=total, disable=None, leave=False, unit="step")
        bar.set_description_str(what, refresh=False)
        bar.n = done
        bar.refresh()
        if done >= total:
            bar.close()
            state["bar"] = None

    return tick


def resolve(progress: Any) -> Optional[Callable[[int, int, str], None]]:
    """``progress=`` as every long call takes it (``Model``'s, ``finetune``,
    ``posenc.hf``'s probes): ``None`` or ``True`` for :func:`default`,
    ``False`` for none, or the user's callable ``(done, total, what)``;
    anything else raises ``PosencError`` before the call starts."""
    from ._posenc import PosencError

    if progress is None or progress is True:
        return default()
    if progress is False:
        return None
    if callable(progress):
        return progress
    raise PosencError(
        f"progress: give a callable progress(done, total, what), True, False or None, not {type(progress).__name__}"
    )
