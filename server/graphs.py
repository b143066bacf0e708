"""The API's limits on what one answer may carry."""
from __future__ import annotations

MAX_PAGE = 5000
MAX_SHAPES = 20000
MAX_POINTS = 10000
