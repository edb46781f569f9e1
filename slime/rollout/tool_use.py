"""A multi-turn tool-use generate function (`recipe=tiny_tool_use`): the policy drives a calculator.

Protocol: whenever the policy writes "=", its turn ends (a stop string); the calculator evaluates the
arithmetic expression the policy wrote since the last tool output, in a separate Python process with
a time limit, and its result is appended to the response as tool tokens: loss mask 0 and a placeholder
log-prob of 0 (docs/architecture.md#alignment-invariants), so training never treats them as the policy's.
Generation then continues in the same response. At most `rollout.max_turns` engine calls per sample; the response
budget (`max_new_tokens`) covers the policy's tokens and the tool's alike.

`sample.metadata["tool_spans"]` lists each tool output as [start, end) offsets into the response
tokens, and `metadata["tool_calls"]` each (expression, result) pair, so dumps can be checked.
"""

from __future__ import annotations

import asyncio
import re
import sys
from typing import Any

from slime.rollout.base import RolloutContext
from slime.rollout.default import reset_sample
from slime.rollout.generate import append_engine_output, call_engine
from slime.types import Sample, SampleStatus

CALL = "="  # the stop string that hands the turn to the calculator
TIME_LIMIT_S = 2.0  # per tool call, process start included
ERROR = "?"  # what the calculator answers to an expression it cannot evaluate

# Runs in the child process: only arithmetic (numbers, + - * /, parentheses, unary signs) is evaluated.
_CALCULATOR = """
import ast, operator, sys
OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
       ast.USub: operator.neg, ast.UAdd: operator.pos}
def ev(node):
    if isinstance(node, ast.Expression):
        return ev(node.body)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in OPS:
        return OPS[type(node.op)](ev(node.left), ev(node.right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in OPS:
        return OPS[type(node.op)](ev(node.operand))
    raise ValueError("not arithmetic")
value = ev(ast.parse(sys.argv[1], mode="eval"))
print(int(value) if float(value).is_integer() else round(value, 4))
"""


async def calculate(expression: str, *, time_limit_s: float = TIME_LIMIT_S) -> str:
    """The calculator's answer to `expression` ('7', '-2', '0.5'), or ERROR when it is not arithmetic, fails
    or runs past `time_limit_s` seconds (the process is killed then)."""
    expression = expression.strip()
    if not expression:
        return ERROR
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-I", "-S", "-c", _CALCULATOR, expression,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), timeout=time_limit_s)
    except asyncio.TimeoutError:
        proc.kill()
        await proc.wait()
        return ERROR
    return out.decode().strip() if proc.returncode == 0 else ERROR


def render(result: str) -> str:
    """The result spelled one character per word, so a word-level vocabulary of digits can say any number."""
    return " ".join(result)


def _expression(turn: str) -> str:
    """The expression of the policy's turn (its text since the last tool output), without the final '='."""
    return re.sub(r"\s+", "", turn.rsplit(CALL, 1)[0])


def append_tool_output(args: RolloutContext, sample: Sample, text: str, budget: int) -> None:
    """Append tool tokens (at most `budget`): loss mask 0, log-prob 0, recorded in metadata["tool_spans"]."""
    ids = list(args.tokenizer(text, add_special_tokens=False)["input_ids"])[:budget]
    start = sample.response_length
    sample.append_response(ids, [0.0] * len(ids), " " + text + " ", loss_mask_value=0)
    sample.metadata.setdefault("tool_spans", []).append([start, sample.response_length])
    sample.check_alignment()


async def generate(args: RolloutContext, sample: Sample, sampling_params: dict[str, Any]) -> Sample:
    """Generate `sample`'s response, calling the calculator on every '=' (see the module docstring)."""
    if sample.response_length:  # a partial sample restarts: where its turn stood is not kept
        sample = reset_sample(sample)
        sample.metadata = {k: v for k, v in sample.metadata.items() if k not in ("tool_spans", "tool_calls")}
    params = {**sampling_params, "stop": [*sampling_params.get("stop", []), CALL], "no_stop_trim": True}
    turn_start = 0
    for turn in range(args.config.max_turns):
        out = await call_engine(args, sample, params)
        if out is None:
            break  # the budget is spent: TRUNCATED
        append_engine_output(sample, out)
        reason = out["meta_info"]["finish_reason"]
        if reason.get("matched") != CALL or turn == args.config.max_turns - 1 or args.aborted:
            break
        expression = _expression(sample.response[turn_start:])
        result = await calculate(expression)
        sample.metadata.setdefault("tool_calls", []).append([expression, result])
        append_tool_output(args, sample, render(result), params["max_new_tokens"] - sample.response_length)
        turn_start = len(sample.response)
        if sample.response_length >= params["max_new_tokens"]:
            sample.status = SampleStatus.TRUNCATED
            break
    return sample


def last_number_reward(response: str, label: str, metadata: dict | None = None) -> float:
    """`rm_type=last_number`: 1.0 when the last number of the response (spaces ignored, so the calculator's
    spelled-out "1 2" reads 12) equals the label, else 0.0."""
    numbers = re.findall(r"-?\d+(?:\.\d+)?", response.replace(" ", ""))
    return float(bool(numbers) and numbers[-1] == label.strip())
