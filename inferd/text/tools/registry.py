"""The tool-call formats by name, and which one a model uses (from its chat template, in one place).

A format is a module holding a `SYNTAX` (syntax.CallSyntax: its parser, grammar, markers, ids); FORMATS lists them.
"generic" names a template that knows nothing of tools: the rendering teaches it the Hermes syntax in a system
block, so it parses and constrains as Hermes does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

# (imported as modules, not from the package, whose __init__ re-exports this one)
import inferd.text.tools.deepseek_calls as deepseek_calls
import inferd.text.tools.deepseek_v3 as deepseek_v3
import inferd.text.tools.deepseek_v31 as deepseek_v31
import inferd.text.tools.glm45 as glm45
import inferd.text.tools.harmony as harmony
import inferd.text.tools.hermes as hermes
import inferd.text.tools.llama3 as llama3
import inferd.text.tools.mistral as mistral
import inferd.text.tools.mistral_v11 as mistral_v11
import inferd.text.tools.qwen3_coder as qwen3_coder
from inferd.text.tools.harmony import is_harmony_template
from inferd.text.tools.mistral_tokens import ARGS, CALL_ID, TOOL_CALLS, marker_ids
from inferd.text.tools.syntax import CallSyntax

HERMES = hermes.SYNTAX.name
LLAMA3 = llama3.SYNTAX.name
MISTRAL = mistral.SYNTAX.name
MISTRAL_V11 = mistral_v11.SYNTAX.name
QWEN3_CODER = qwen3_coder.SYNTAX.name
GLM45 = glm45.SYNTAX.name
DEEPSEEK_V3 = deepseek_v3.SYNTAX.name
DEEPSEEK_V31 = deepseek_v31.SYNTAX.name
HARMONY = harmony.SYNTAX.name
GENERIC = "generic"

FORMATS: dict[str, CallSyntax] = {
    HERMES: hermes.SYNTAX,
    LLAMA3: llama3.SYNTAX,
    MISTRAL: mistral.SYNTAX,
    MISTRAL_V11: mistral_v11.SYNTAX,
    QWEN3_CODER: qwen3_coder.SYNTAX,
    GLM45: glm45.SYNTAX,
    DEEPSEEK_V3: deepseek_v3.SYNTAX,
    DEEPSEEK_V31: deepseek_v31.SYNTAX,
    HARMONY: harmony.SYNTAX,
    GENERIC: hermes.SYNTAX,
}


@dataclass(frozen=True)
class ToolFormat:
    """A model's tool calling, as detected: the format's name and what its template does with tools."""

    name: str  # a key of FORMATS
    template_renders_tools: bool  # the template takes `tools` and tool messages itself
    call_ids: bool = False  # mistral_v11: calls carry [CALL_ID]id before [ARGS]

    @property
    def is_mistral(self) -> bool:
        return self.name in (MISTRAL, MISTRAL_V11)

    @property
    def parses_thinking(self) -> bool:
        """The format's parser reads the thinking too (harmony): no reasoning parser goes before it."""
        return self.name == HARMONY


def syntax_of(fmt: ToolFormat | str) -> CallSyntax:
    return FORMATS[fmt.name if isinstance(fmt, ToolFormat) else fmt]


def detect_format(template: str | None, token_id_of: Callable[[str], int | None] | None = None) -> ToolFormat:
    """The tool-call syntax from the chat template's text (and, for Mistral, the vocabulary's control tokens).

    Mistral: a v11 template writes `[ARGS]` (and `[CALL_ID]` when it wants ids); a template that mentions only
    `[TOOL_CALLS]` is v11 when the vocabulary has an `[ARGS]` token and the template writes no JSON call list.
    The XML formats share Hermes' `<tool_call>`, so they are told apart first: Qwen3-Coder / Qwen3.5 by
    `<function=` and `<parameter=`, GLM-4.5+ by `<arg_key>`. DeepSeek's markers are its own; V3 (and R1) put the
    arguments in a ```json fence, V3.1 does not."""
    src = template or ""
    renders = "tools" in src
    if is_harmony_template(src):
        return ToolFormat(HARMONY, renders)
    if TOOL_CALLS in src:
        vocab = marker_ids(token_id_of) if token_id_of is not None else {}
        if ARGS in src or (ARGS in vocab and "[{" not in src and '"arguments"' not in src):
            return ToolFormat(MISTRAL_V11, renders, call_ids=CALL_ID in src)
        return ToolFormat(MISTRAL, renders)
    if deepseek_calls.CALLS_BEGIN in src or deepseek_calls.SEP in src:
        return ToolFormat(DEEPSEEK_V3 if deepseek_calls.FENCE in src else DEEPSEEK_V31, renders)
    if qwen3_coder.FUNCTION in src and qwen3_coder.PARAM in src:
        return ToolFormat(QWEN3_CODER, renders)
    if glm45.KEY in src:
        return ToolFormat(GLM45, renders)
    if hermes.OPEN in src:
        return ToolFormat(HERMES, renders)
    if llama3.PYTHON_TAG in src or ("ipython" in src and "parameters" in src):
        return ToolFormat(LLAMA3, renders)
    return ToolFormat(HERMES if renders else GENERIC, renders)


def marker_token_ids(fmt: ToolFormat | str, token_id_of: Callable[[str], int | None]) -> dict[str, int]:
    """The format's control tokens (its shown markers) that this vocabulary has, by text."""
    ids = {m: token_id_of(m) for m in syntax_of(fmt).shown_markers}
    return {m: int(i) for m, i in ids.items() if i is not None}


def shown_tokens(fmt: ToolFormat | str, token_id_of: Callable[[str], int | None]) -> frozenset[int]:
    """Control tokens that the output text must keep for the parser to see the calls (Mistral's, harmony's)."""
    return frozenset(marker_token_ids(fmt, token_id_of).values())
