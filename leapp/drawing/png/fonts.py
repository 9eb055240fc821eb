"""Fonts of the picture, and the text it writes and measures."""

from __future__ import annotations

from typing import Any, Mapping

from PIL import ImageFont

from ...bundle.pipeline import Port
from .style import BOLD_ROLES, FONT_SIZES, MAX_NAME_CHARS, NO_MODEL_LABEL

FontT = Any  # ImageFont.FreeTypeFont, or ImageFont.ImageFont without FreeType


def load_font(bold: bool, size: int) -> FontT:
    """DejaVu Sans (bold or regular) at `size`, else Pillow's bundled font at `size`."""
    for name in (["DejaVuSans-Bold.ttf"] if bold else []) + ["DejaVuSans.ttf"]:
        try:
            return ImageFont.truetype(name, size)
        except OSError:
            continue
    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow < 10.1 has no sized default font
        return ImageFont.load_default()


def load_fonts(scale: int) -> dict[str, FontT]:
    """Every font role at `scale` times its logical size."""
    return {role: load_font(role in BOLD_ROLES, size * scale) for role, size in FONT_SIZES.items()}


def is_scalable(fonts: Mapping[str, FontT]) -> bool:
    """Whether the fonts honour their requested size (FreeType fonts do)."""
    return all(isinstance(f, ImageFont.FreeTypeFont) for f in fonts.values())


def text_w(fonts: Mapping[str, FontT], role: str, text: str) -> float:
    """Width of `text` in logical pixels."""
    return float(fonts[role].getlength(text))


def clip(text: str, limit: int = MAX_NAME_CHARS) -> str:
    """Shorten `text` to `limit` characters with an ellipsis."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def port_kind(port: Port) -> str | None:
    """The port's semantic kind (its YAML entry's optional ``kind``), as text."""
    kind = port.entry.get("kind")
    return None if kind is None else str(kind)


def detail_text(port: Port) -> str:
    """A port's second line: `[d0, d1]  dtype`."""
    return "[" + ", ".join(str(d) for d in port.shape) + f"]  {port.dtype}"


def port_text_w(fonts: Mapping[str, FontT], port: Port) -> float:
    """Width of a port's widest text line."""
    widths = [text_w(fonts, "port", clip(port.name)), text_w(fonts, "detail", detail_text(port))]
    kind = port_kind(port)
    if kind:
        widths.append(text_w(fonts, "detail", clip(kind)))
    return max(widths)


def badge_text(backend: str | None) -> str:
    return NO_MODEL_LABEL if backend is None else backend


def badge_w(fonts: Mapping[str, FontT], backend: str | None) -> float:
    """Width of the backend pill."""
    return text_w(fonts, "badge", badge_text(backend)) + 14
