"""Prints each benchmark's extra_info (rates, ratios) after the pytest-benchmark table."""

from __future__ import annotations

RESULTS: list[tuple[str, dict]] = []


def pytest_terminal_summary(terminalreporter) -> None:  # type: ignore[no-untyped-def]
    if not RESULTS:
        return
    terminalreporter.section("tasim benchmark figures")
    for name, info in RESULTS:
        figures = ", ".join(f"{k}={v:,.1f}" if isinstance(v, float) else f"{k}={v}" for k, v in info.items())
        terminalreporter.write_line(f"{name}: {figures}")
