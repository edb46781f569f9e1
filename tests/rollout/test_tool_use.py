"""The calculator tool on its own (recipe=tiny_tool_use end to end: tests/e2e/test_tool_use_recipe.py)."""

from __future__ import annotations

import asyncio

from slime.rollout.tool_use import ERROR, calculate


def test_calculator_evaluates_arithmetic_only_within_its_time_limit():
    async def run():
        return await asyncio.gather(
            calculate("3+4"), calculate("2*(3-5)"), calculate("1/2"), calculate("7/0"),
            calculate("__import__('os')"), calculate(""), calculate("1+1", time_limit_s=0.001),
        )  # fmt: skip

    assert asyncio.run(run()) == ["7", "-4", "0.5", ERROR, ERROR, ERROR, ERROR]
