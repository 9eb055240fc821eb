"""Colours, sizes and font roles of the graph picture, sizes in logical pixels."""

from __future__ import annotations

from ...bundle.pipeline import FEEDBACK, FORWARD

#: Edge styles besides the pipeline's FORWARD and FEEDBACK: the wires of graph ports.
GRAPH_INPUT = "graph_input"
GRAPH_OUTPUT = "graph_output"

BACKGROUND = (247, 248, 250)
CARD_FILL = (255, 255, 255)
CARD_BORDER = (190, 199, 211)
CARD_SHADOW = (227, 231, 237)
HEADER_FILL = (234, 239, 246)
TEXT = (27, 35, 48)
TEXT_MUTED = (92, 103, 118)
KIND_TEXT = (13, 116, 108)
FORWARD_COLOR = (71, 85, 105)
FEEDBACK_COLOR = (214, 36, 110)
INPUT_COLOR = (34, 134, 74)
INPUT_FILL = (226, 244, 233)
OUTPUT_COLOR = (204, 88, 10)
OUTPUT_FILL = (253, 236, 222)
PORT_DOT = (148, 160, 176)

BADGE_COLORS: dict[str, tuple[int, int, int]] = {
    "jit": (180, 83, 9),
    "onnx": (29, 78, 216),
    "pt2": (124, 58, 237),
    "trt": (21, 128, 61),
}
BADGE_OTHER = (71, 85, 105)
BADGE_NONE = (148, 160, 176)
NO_MODEL_LABEL = "no model"

# Geometry, in logical pixels.
MARGIN = 40
HEADER_H = 30
CARD_PAD_X = 12
CARD_MID_GAP = 28
CARD_MIN_W = 170
PORT_PAD = 6
NAME_LINE = 16
DETAIL_LINE = 14
BODY_PAD_TOP = 4
BODY_PAD_BOTTOM = 6
TERMINAL_H = 38
TERMINAL_TIP = 12
ROW_GAP = 26
DUMMY_H = 10
MIN_COL_W = 24
BASE_GAP = 72
GUTTER = 14
V_SLOT = 10
LANE = 12
LANE_PAD = 18
BAND_PAD = 34
MAX_NAME_CHARS = 40
ARROW_LEN = 9
ARROW_HALF = 4.5
FORWARD_W = 2
FEEDBACK_W = 3
IO_W = 2
DASH = (11, 6)
CORNER = 9
CURVE_STEPS = 28
ORDER_SWEEPS = 8
ALIGN_SWEEPS = 6
WRAP_MIN_LAYERS = 11
WRAP_MIN_COLS = 4
WRAP_MAX_COLS = 14
TARGET_ASPECT = 1.6
SUPERSAMPLE_MAX_PIXELS = 8_000_000
MAX_SIDE = 16000
#: Height of the title, statistics and legend above the graph.
HEADER_BLOCK_H = 96

FONT_SIZES = {
    "title": 18,
    "subtitle": 12,
    "node": 14,
    "badge": 10,
    "port": 12,
    "detail": 11,
    "terminal": 12,
    "legend": 11,
}
BOLD_ROLES = {"title", "node", "badge", "port", "terminal"}

#: Edge kind -> (colour, width, dashed).
EDGE_STYLE = {
    FORWARD: (FORWARD_COLOR, FORWARD_W, False),
    GRAPH_INPUT: (INPUT_COLOR, IO_W, False),
    GRAPH_OUTPUT: (OUTPUT_COLOR, IO_W, False),
    FEEDBACK: (FEEDBACK_COLOR, FEEDBACK_W, True),
}

#: The legend: a sample of each edge kind with its text, then these backend badges.
LEGEND_ENTRIES = (
    (FORWARD, "data flow"),
    (FEEDBACK, "feedback (read on the next call)"),
    (GRAPH_INPUT, "graph input"),
    (GRAPH_OUTPUT, "graph output"),
)
LEGEND_BACKENDS = ("jit", "onnx", "pt2", None)
