"""Where user code is: the one walk over Python frames that messages and guards share.

leapp names the user's line in its messages (an annotation's call site, a guard's
branch, a value read again, a random op).  The frames between that line and
leapp's hook belong to leapp or to torch; the user's is the first that belongs
to neither.  A leapp function that torch calls on every op of a pass (a
``TorchFunctionMode``'s ``__torch_function__``) sits between the user and torch's
frames: registered with :func:`seen_as_torch`, it is skipped like torch's own.
"""
from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch

PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # leapp/
TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep

# Code objects of leapp functions walked over as torch's frames (filled at import by
# seen_as_torch, read only afterwards).
_AS_TORCH: set = set()


def seen_as_torch(fn: Callable) -> Callable:
    """Mark fn (a leapp function torch calls on every op) as one of torch's frames."""
    _AS_TORCH.add(fn.__code__)
    return fn


def in_torch(frame: Any) -> bool:
    return frame.f_code.co_filename.startswith(TORCH_DIR) or frame.f_code in _AS_TORCH


def in_leapp(frame: Any) -> bool:
    return frame.f_code.co_filename.startswith(PACKAGE_DIR) and frame.f_code not in _AS_TORCH


def outward(depth: int = 0) -> Iterator[Any]:
    """The frames from depth levels out of the one iterating (0: that one) outward;
    iterate it in a plain loop (a generator expression is a frame of its own)."""
    try:
        frame: Any = sys._getframe(depth + 1)  # 0 is this generator's own frame
    except ValueError:
        return
    while frame is not None:
        yield frame
        frame = frame.f_back


def user_frame(depth: int = 0, torch_too: bool = True) -> Any:
    """The nearest frame outside leapp (and outside torch with torch_too), from depth
    levels out of the caller (0: the caller itself) outward, or None."""
    try:
        frame: Any = sys._getframe(depth + 1)
    except ValueError:
        return None
    while frame is not None and (in_leapp(frame) or (torch_too and in_torch(frame))):
        frame = frame.f_back
    return frame


def site(frame: Any) -> tuple[str, int]:
    """(file, line) of frame, ("<unknown>", 0) for None."""
    if frame is None:
        return ("<unknown>", 0)
    return (frame.f_code.co_filename, frame.f_lineno)


def user_site(depth: int = 0, torch_too: bool = True) -> tuple[str, int]:
    """(file, line) of the nearest frame outside leapp (and torch), from depth levels
    out of the caller (0: the caller itself) outward."""
    return site(user_frame(depth + 1, torch_too))
