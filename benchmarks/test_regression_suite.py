"""Every policy on the key presets against benchmarks/baseline.json (update: make baseline)."""

from __future__ import annotations

from conftest import RESULTS

from lab import regression


def test_policy_regression_suite(benchmark) -> None:  # type: ignore[no-untyped-def]
    results: dict = {}
    benchmark.pedantic(lambda: results.update(regression.run_suite(regression.CASES, jobs=2)), rounds=1, iterations=1)
    found = regression.drifts(results, regression.load_baseline())
    RESULTS.append(("policy regression suite", {"cases": len(results), "outside_tolerance": len(found)}))
    assert not found, "policy metrics moved (run `make baseline` if intended):\n" + "\n".join(d.line() for d in found)
