"""Tool calling: OpenAI `tools` and tool messages into the chat template, the model's tool-call syntax back into
OpenAI `tool_calls` (whole or as streaming deltas), and the grammars that make a call valid by construction.

One module per job:
- validation: the `tools` and `tool_choice` request fields;
- rendering: the conversation and the tools as the chat template expects them;
- registry: the formats by name (FORMATS) and which one a chat template uses (detect_format);
- grammar: the call grammars (required, named, lazy from a trigger token) and the trigger token;
- parser: ToolCallParser, the detected format's incremental parser (inferd.text.parsing's interface);
- one module per format, each a parser, a grammar and its markers (a syntax.CallSyntax):
  hermes (Qwen2.5, Hermes, most templates with a `tools` variable; and "generic" templates, taught it),
  llama3 (Llama 3.1+ JSON), mistral (before tokenizer v11, `[TOOL_CALLS] [...]`) and mistral_v11
  (`[TOOL_CALLS]name[ARGS]{...}`), with mistral_tokens (their control tokens and ids); harmony (gpt-oss's
  channels, whose parser reads the thinking too); qwen3_coder (Qwen3-Coder and Qwen3.5's
  `<function=name><parameter=p>`) and glm45 (GLM-4.5+'s `<arg_key>`/`<arg_value>`), with xml_args (values typed
  by the tool's schema); deepseek_v3 and deepseek_v31, with deepseek_calls (their markers);
- base, scanner, grammar_rules, syntax: what the formats share (the parser base classes, the JSON call object
  scanner, Lark pieces, the format record).
"""

from inferd.text.grammar import LazyMatcher
from inferd.text.parsing import ContentDelta, ToolArgsDelta, ToolCallStart, ToolDelta
from inferd.text.tools.base import CallParser, JsonCallParser, ToolCall, new_call_id
from inferd.text.tools.grammar import tool_call_grammar, trigger_token
from inferd.text.tools.mistral_tokens import ARGS, CALL_ID, TOOL_CALLS, marker_ids, mistral_id, new_mistral_id
from inferd.text.tools.parser import ToolCallParser, parse_tool_calls
from inferd.text.tools.registry import (
    DEEPSEEK_V3,
    DEEPSEEK_V31,
    FORMATS,
    GENERIC,
    GLM45,
    HARMONY,
    HERMES,
    LLAMA3,
    MISTRAL,
    MISTRAL_V11,
    QWEN3_CODER,
    ToolFormat,
    detect_format,
    marker_token_ids,
    shown_tokens,
    syntax_of,
)
from inferd.text.tools.rendering import GENERIC_TOOLS_BLOCK, prepare_messages, template_tools
from inferd.text.tools.scanner import CallObject, JsonValue
from inferd.text.tools.syntax import CallSyntax
from inferd.text.tools.validation import Tool, ToolError, parse_tool_choice, parse_tools

Event = ToolDelta  # what a tool-call parser emits

__all__ = [
    "ARGS",
    "CALL_ID",
    "DEEPSEEK_V3",
    "DEEPSEEK_V31",
    "FORMATS",
    "GENERIC",
    "GENERIC_TOOLS_BLOCK",
    "GLM45",
    "HARMONY",
    "HERMES",
    "LLAMA3",
    "MISTRAL",
    "MISTRAL_V11",
    "QWEN3_CODER",
    "TOOL_CALLS",
    "CallObject",
    "CallParser",
    "CallSyntax",
    "ContentDelta",
    "Event",
    "JsonCallParser",
    "JsonValue",
    "LazyMatcher",
    "Tool",
    "ToolArgsDelta",
    "ToolCall",
    "ToolCallParser",
    "ToolCallStart",
    "ToolDelta",
    "ToolError",
    "ToolFormat",
    "detect_format",
    "marker_ids",
    "marker_token_ids",
    "mistral_id",
    "new_call_id",
    "new_mistral_id",
    "parse_tool_calls",
    "parse_tool_choice",
    "parse_tools",
    "prepare_messages",
    "shown_tokens",
    "syntax_of",
    "template_tools",
    "tool_call_grammar",
    "trigger_token",
]
