"""Agentic rollouts (`rollout.agent.*`, docs/agents.md): user agent code speaks OpenAI's API to a gateway that sends
the engines token ids, never re-tokenized history, and records each turn; an episode becomes one training sample.

    tool_calls.py   how a turn's sampled ids become OpenAI `tool_calls` (one parser per chat-template format)
    openai_api.py   OpenAI request fields -> the turn's sampling params; the response bodies and stream chunks
    session.py      one episode's token stream: each turn's prompt is the last turn's ids plus the rendered suffix
    trajectory.py   the re-rendering check of every turn, the mismatch rule, the agent metrics
    gateway.py      the HTTP server (its own thread and event loop) and its sessions
    episode.py      the generate function: one episode of the user's entrypoint per sample
    calculator_agent.py   recipe=smollm2_agent's agent (plain openai-client code with a calculator tool)
"""
