"""Direction checks: does tasim move the way the paper does (trends, ratios on either side of 1)?"""

from __future__ import annotations

# A relative change within this band counts as flat, and two values within it as tied: the
# paper's plotted values carry about that much reading error.
FLAT = 0.05


def direction(before: float, after: float, points: bool = False) -> str:
    """↑, ↓ or → (flat) with the change: relative, or in percentage points for hit rates (a
    relative change of a near-zero hit rate would read as a trend)."""
    if points:
        change, shown = after - before, f"{after - before:+.0f} pp"
        flat = FLAT * 100
    else:
        change = (after - before) / before if before else 0.0
        shown, flat = f"{change * 100:+.0f} %", FLAT
    arrow = "↑" if change > flat else "↓" if change < -flat else "→"
    return f"{arrow} {shown}"


def trend_note(paper: tuple[float, float], tasim: tuple[float, float], points: bool = False) -> tuple[str, bool]:
    """'paper ↑ +25 %, tasim ↓ -63 % ✗' and whether both go the same way."""
    p, t = direction(*paper, points=points), direction(*tasim, points=points)
    ok = p[0] == t[0]
    return f"paper {p}, tasim {t}{'' if ok else ' ✗'}", ok


def side_of_one(ratio: float) -> str:
    return "> 1" if ratio > 1 + FLAT else "< 1" if ratio < 1 - FLAT else "≈ 1"


def ratio_note(paper: float, tasim: float) -> tuple[str, bool]:
    """'paper > 1, tasim ≈ 1 ✗' and whether a ratio falls on the paper's side of 1."""
    ok = side_of_one(paper) == side_of_one(tasim)
    return f"paper {side_of_one(paper)}, tasim {side_of_one(tasim)}{'' if ok else ' ✗'}", ok
