"""Chat templates written for the tests (not taken from any model), to exercise what the packaged
models' templates do not: Gemma 3's GGUF carries no template, so its engine gets this one with
`--chat-template FILE`.

GEMMA_STYLE_TEMPLATE writes Gemma's turn markup with `bos_token`, folds a system message into the
first user turn, refuses turns out of order with `raise_exception`, reads `tools` itself (as JSON
with `tojson`), keeps state in a `namespace`, stops a loop with `break`, marks the assistant's
text with `{% generation %}`, shows earlier reasoning (the `thinking` alias) and opens a thinking
block unless `enable_thinking` is false.
"""

from __future__ import annotations

GEMMA_STYLE_TEMPLATE = """{{ bos_token }}
{%- set ns = namespace(first_user=true, system='') -%}
{%- if messages[0]['role'] == 'system' -%}
  {%- set ns.system = messages[0]['content'] + '\\n\\n' -%}
  {%- set loop_messages = messages[1:] -%}
{%- else -%}
  {%- set loop_messages = messages -%}
{%- endif -%}
{%- if tools -%}
<start_of_turn>system
You may call these functions:
{% for tool in tools %}{{ tool | tojson(indent=1) }}
{% endfor %}<end_of_turn>
{% endif -%}
{%- for message in loop_messages -%}
  {%- if message['role'] == 'system' -%}
    {{ raise_exception('a system message may only come first') }}
  {%- endif -%}
  {%- set role = 'model' if message['role'] == 'assistant' else 'user' -%}
<start_of_turn>{{ role }}
{% if role == 'user' and ns.first_user %}{{ ns.system }}{% set ns.first_user = false %}{% endif -%}
{%- if message['role'] == 'tool' %}[result {{ message.get('name', '') }}] {% endif -%}
{%- if message['role'] == 'assistant' -%}
{%- generation -%}
{%- if message.thinking is defined %}<think>{{ message.thinking }}</think>{% endif -%}
{{ message['content'] | trim }}
{%- for call in message.get('tool_calls', []) -%}
{%- if loop.index > 4 %}{% break %}{% endif %}
{{ dict(name=call.function.name, arguments=call.function.arguments) | tojson }}
{%- endfor -%}
{%- endgeneration -%}
{%- else -%}
{{ message['content'] | trim }}
{%- endif %}<end_of_turn>
{% endfor -%}
{%- if add_generation_prompt -%}
<start_of_turn>model
{% if not (enable_thinking is defined and enable_thinking is false) %}<think>
{% endif -%}
{%- endif -%}"""
