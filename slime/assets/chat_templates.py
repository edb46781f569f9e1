"""Chat templates the agent gateway can render with instead of a tokenizer's own
(`rollout.agent.chat_template=slime.assets.chat_templates.NAME`), for models whose template knows no tools."""

from __future__ import annotations

# ChatML (SmolLM2's layout and default system turn) with Qwen2.5's tool calling: the tools' JSON schemas in the
# system turn, a call as `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>` (rollout.agent.tool_parser
# "qwen25" reads it), a tool's answer as a user turn `<tool_response>\n...\n</tool_response>`.
CHATML_TOOLS = (
    "{%- set default_system = 'You are a helpful AI assistant named SmolLM, trained by Hugging Face' %}"
    "{%- set has_system = messages and messages[0]['role'] == 'system' %}"
    "{%- set system = messages[0]['content'] if has_system else default_system %}"
    "{{- '<|im_start|>system\\n' + system }}"
    "{%- if tools %}"
    "{{- '\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\\n<tool_call>\\n{"name": <function-name>, "arguments": '
    "<args-json-object>}\\n</tool_call>' }}"
    "{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'system' and loop.first %}"
    "{%- elif message['role'] == 'tool' %}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + message['content'] + '\\n</tool_response><|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + (message['content'] or '') }}"
    "{%- for call in message.tool_calls or [] %}"
    "{%- if message['content'] or not loop.first %}{{- '\\n' }}{%- endif %}"
    '{{- \'<tool_call>\\n{"name": "\' + call.function.name + \'", "arguments": \' }}'
    "{{- (call.function.arguments or {}) | tojson }}{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
