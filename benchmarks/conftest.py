"""Prints each benchmark's extra_info (rates, ratios) after the pytest-benchmark table."""

from __future__ import annotations

RESULTS: list[tuple[str, dict]] = []


def pytest_terminal_summary(terminalreporter) -> None:  # type: ignore[no-untyped-def]
    if not RESULTS:
        return
    terminalreporter.section("tasim benchmark figures")
    for name, info in RESULTS:
        figures = ", ".join(f"{k}={_figure(k, v)}" for k, v in info.items())
        terminalreporter.write_line(f"{name}: {figures}")


def _figure(name: str, value: object) -> str:
    """Ratios with two decimals (0.9 against 0.94 is the difference that matters), other
    floats with one."""
    if not isinstance(value, float):
        return str(value)
    return f"{value:.2f}" if "ratio" in name else f"{value:,.1f}"
