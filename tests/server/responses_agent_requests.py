"""Responses API request bodies as coding agents send them, written from OpenAI's Responses API reference: the
agent's instructions and developer messages, a conversation replayed whole (reasoning items, function_call and
function_call_output items, an assistant message) with no previous_response_id, function tools beside a
`namespace` of MCP-style functions and hosted tools a local server cannot run, and the fields agents set on every
request (store false, include encrypted reasoning, prompt_cache_key, reasoning effort and summary...)."""
from __future__ import annotations

import copy

SHELL = {"type": "function", "name": "shell", "description": "Runs a shell command and returns its output.",
         "strict": False, "parameters": {"type": "object", "additionalProperties": False, "required": ["command"],
                                         "properties": {"command": {"type": "array", "items": {"type": "string"},
                                                                    "maxItems": 4}}}}
READ_FILE = {"type": "function", "name": "read_file", "description": "Reads a file.",
             "parameters": {"type": "object", "additionalProperties": False, "required": ["path"],
                            "properties": {"path": {"type": "string", "maxLength": 24}}}}
NAMESPACE = {"type": "namespace", "name": "mcp__fs__", "description": "The project's files.", "tools": [READ_FILE]}
HOSTED = [
    {"type": "web_search", "search_context_size": "medium"},
    {"type": "web_search_preview"},
    {"type": "file_search", "vector_store_ids": ["vs_1"]},
    {"type": "code_interpreter", "container": {"type": "auto"}},
    {"type": "computer_use_preview", "display_width": 1024, "display_height": 768, "environment": "browser"},
    {"type": "image_generation"},
    {"type": "mcp", "server_label": "deepwiki", "server_url": "https://mcp.deepwiki.com/mcp",
     "require_approval": "never"},
    {"type": "local_shell"},
    {"type": "custom", "name": "apply_patch", "description": "Applies a patch.",
     "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"}},
]
IGNORED_HEADER = ("web_search, web_search_preview, file_search, code_interpreter, computer_use_preview, "
                  "image_generation, mcp:deepwiki, local_shell, custom:apply_patch")

CONVERSATION = [
    {"type": "message", "role": "developer",
     "content": [{"type": "input_text", "text": "<permissions>Commands run in a sandbox.</permissions>"}]},
    {"type": "message", "role": "user",
     "content": [{"type": "input_text", "text": "<environment_context><cwd>/repo</cwd></environment_context>"}]},
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "What files are here?"}]},
    {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "**Listing files**"}],
     "content": None, "encrypted_content": "gAAAAABo-opaque-from-another-server"},
    {"type": "function_call", "id": "fc_1", "call_id": "call_ls", "name": "shell",
     "arguments": '{"command": ["ls"]}', "status": "completed"},
    {"type": "function_call_output", "call_id": "call_ls", "output": "README.md\nmain.py"},
    {"type": "function_call", "id": "fc_2", "call_id": "call_read", "name": "read_file", "namespace": "mcp__fs__",
     "arguments": '{"path": "README.md"}'},
    {"type": "function_call_output", "call_id": "call_read",
     "output": [{"type": "input_text", "text": "# Demo project"}]},
    {"type": "web_search_call", "id": "ws_1", "status": "completed",
     "action": {"type": "search", "query": "demo project"}},
    {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
     "content": [{"type": "output_text", "text": "There is README.md and main.py.", "annotations": []}]},
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Read main.py."}]},
]

AGENT_REQUEST = {
    "instructions": "You are a coding agent. Use the tools to inspect the project.",
    "input": CONVERSATION,
    "tools": [SHELL, NAMESPACE, *HOSTED],
    "tool_choice": "auto",
    "parallel_tool_calls": False,
    "reasoning": {"effort": "medium", "summary": "auto"},
    "store": False,
    "include": ["reasoning.encrypted_content"],
    "prompt_cache_key": "019a8c2e-5b6f-7d10-a2b3-c4d5e6f70819",
    "client_metadata": {"originator": "agent_cli", "version": "0.60.0"},
    "safety_identifier": "user-7f3a",
    "user": "user-7f3a",
    "service_tier": "auto",
    "truncation": "disabled",
    "text": {"verbosity": "low"},
    "max_output_tokens": 120,
}


def agent_request(**changes) -> dict:
    body = copy.deepcopy(AGENT_REQUEST)
    body.update(changes)
    return body
