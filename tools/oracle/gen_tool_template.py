"""The tool-calling template fixture: a chat template in the `hermes` tool-call form (tools listed
in a system turn, past calls as <tool_call> lines, results as <tool_response> lines, as the Qwen2.5
family renders them; image parts as Qwen2.5-VL's placeholder), a request with tools, calls and results, and the prompt transformers renders
from them with `apply_chat_template(messages, tools=...)`: what the host's template must render
byte for byte.

    $PY tools/oracle/gen_tool_template.py   # writes tests/fixtures/tool_templates/hermes/{request.json,rendered.txt}
"""

import json
from pathlib import Path

import transformers
from transformers import PreTrainedTokenizerFast

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests/fixtures/tool_templates/hermes"

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "maxLength": 12},
            "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "pick", "description": "Pick a number",
        "parameters": {"type": "object", "properties": {"n": {"type": "integer", "minimum": 1, "maximum": 3}},
                       "required": ["n"], "additionalProperties": False}}},
]

# The wire form (what a client sends back): arguments as JSON text; transformers' templates take
# them as objects, which is what the host hands its template.
WIRE = [
    {"role": "system", "content": "You answer with tools."},
    {"role": "user", "content": "Weather in Paris and Oslo?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"unit\": \"celsius\"}"}},
        {"id": "call_2", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\", \"unit\": \"celsius\"}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 18}"},
    {"role": "tool", "tool_call_id": "call_2", "content": "{\"temp\": 4}"},
    {"role": "user", "content": "And pick a number."},
]


def main():
    template = (OUT / "chat_template.jinja").read_text()
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(ROOT / "tests/fixtures/qwen2_5_vl/tokenizer.json"))
    messages = json.loads(json.dumps(WIRE))
    for m in messages:
        for call in m.get("tool_calls") or []:
            call["function"]["arguments"] = json.loads(call["function"]["arguments"])
    rendered = tokenizer.apply_chat_template(messages, tools=TOOLS, chat_template=template,
                                             add_generation_prompt=True, tokenize=False)
    (OUT / "request.json").write_text(json.dumps({"messages": WIRE, "tools": TOOLS}, indent=1) + "\n")
    (OUT / "rendered.txt").write_text(rendered)
    (OUT / "provenance.json").write_text(json.dumps({
        "generator": "tools/oracle/gen_tool_template.py",
        "transformers": transformers.__version__,
    }, indent=1) + "\n")
    print(rendered)


if __name__ == "__main__":
    main()
