"""The recipe's Qwen3.5 token-building template, derived at run time from the stock Qwen3.5 template.

`recipe_template(tokenizer)` edits the tokenizer's own Qwen3.5 template (or TRL's copy of the stock one, when
the tokenizer has another) into the recipe's fixed one; nothing of either is shipped with sweflow.
"""

# The recipe renders every prompt it does not extend token for token (the first one, a new lineage) and
# every appended-message suffix with its own fixed Qwen3.5 template: the stock one with three changes, which
# `derive` makes as asserted text edits (each raises `TemplateError` when its anchor is gone, i.e. the Qwen3.5
# template changed upstream and the edits need a look):
#
# - the tool instructions show one parameter in the example call, not two;
# - the closing `<IMPORTANT>` reminder block of the tool instructions is gone;
# - every assistant turn keeps its reasoning (`<think>...</think>`), not only those after the last query;
#
# and one more its dummy prefixes need: it renders a conversation without a user query (the stock template
# refuses one). The recipe swaps its template in whatever the tokenizer has; without a Qwen3.5 tokenizer and
# without TRL there is no stock text to derive it from, and `recipe_template` says so.

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path
from typing import Any

# First line of every derived template: says what it is and marks it for `is_recipe_template`. A jinja
# comment with whitespace control renders as nothing.
MARK = "{#- sweflow: the recipe's Qwen3.5 token-building template, derived from the stock one -#}\n"

# Text only the Qwen3.5 family's template has (the example call of its tool instructions, its turn markers and
# reasoning handling): a template with all of them is treated as Qwen3.5's.
_QWEN35_SIGNS = ("<|im_start|>", "<function=example_function_name>", "reasoning_content", "</think>")

# Inside a jinja string literal a newline is written `\n` (two characters); accept a raw newline as well.
_NL = r"(?:\\n|\n)"


class TemplateError(RuntimeError):
    """The recipe's Qwen3.5 template cannot be built (the message says why and what to do)."""


def looks_like_qwen35(template: Any) -> bool:
    """Whether `template` (a chat template text) is a Qwen3.5-family template."""
    return isinstance(template, str) and all(sign in template for sign in _QWEN35_SIGNS)


def is_recipe_template(template: Any) -> bool:
    """Whether `template` is one `derive` made."""
    return isinstance(template, str) and template.startswith(MARK)


def _edit(text: str, pattern: str, replacement: str, what: str, flags: int = 0) -> str:
    found = list(re.finditer(pattern, text, flags))
    if len(found) != 1:
        raise TemplateError(
            f"cannot derive the recipe's Qwen3.5 template ({what}): expected one match of {pattern!r} in "
            f"the stock template, found {len(found)}; the Qwen3.5 template changed upstream, so check the "
            f"edits in sweflow/proxy/qwen35_template.py against it"
        )
    at = found[0]
    return text[: at.start()] + at.expand(replacement) + text[at.end() :]


def derive(stock: str) -> str:
    """The recipe's fixed template from the stock Qwen3.5 template text (module docstring); TemplateError
    when an edit's anchor is not found exactly once."""
    if not looks_like_qwen35(stock):
        raise TemplateError(
            "cannot derive the recipe's Qwen3.5 template: the given template is not Qwen3.5's"
        )
    text = _edit(
        stock,
        _NL + r"<parameter=example_parameter_2>" + _NL + r"[^<]*?" + _NL + r"</parameter>",
        "",
        "drop the second parameter of the example call",
    )
    text = _edit(
        text,
        _NL + _NL + r"<IMPORTANT>.*?</IMPORTANT>",
        "",
        "drop the closing <IMPORTANT> reminder",
        re.DOTALL,
    )
    text = _edit(
        text,
        r"(\{%-?)\s*if\s+[^%]*?loop\.index0\s*>\s*ns\.last_query_index\)?\s*(-?%\})",
        r"\1 if true \2",
        "keep every assistant turn's reasoning",
    )
    text = _edit(
        text,
        r"\{%-?\s*if\s+ns\.multi_step_tool\s*-?%\}\s*\{\{-?\s*raise_exception\([^)]*\)\s*-?\}\}\s*\{%-?\s*endif\s*-?%\}",
        "",
        "render a conversation without a user query",
    )
    return MARK + text


# What the derived template must do, checked on one small conversation after the edits.
_PROBE_TOOLS = [{"type": "function", "function": {"name": "probe", "description": "", "parameters": {}}}]
_PROBE = [
    {"role": "system", "content": "s"},
    {"role": "user", "content": "q"},
    {
        "role": "assistant",
        "content": "",
        "reasoning_content": "kept-reasoning",
        "tool_calls": [{"type": "function", "function": {"name": "probe", "arguments": {"a": 1}}}],
    },
    {"role": "tool", "content": "r"},
    {"role": "user", "content": "next"},
]


def check_derived(tokenizer: Any, template: str) -> None:
    """Render a probe conversation with `template`: TemplateError unless it keeps an earlier turn's
    reasoning, shows no second example parameter and no reminder block, and ends with the generation prompt
    (so the assistant turn extends it)."""
    try:
        text = tokenizer.apply_chat_template(
            _PROBE, tools=_PROBE_TOOLS, chat_template=template, tokenize=False, add_generation_prompt=True
        )
    except Exception as exc:  # noqa: BLE001 - jinja syntax or raise_exception: the derivation broke it
        raise TemplateError(f"the derived Qwen3.5 template does not render: {exc}") from exc
    problems = [
        msg
        for bad, msg in (
            ("kept-reasoning" not in text, "an earlier turn's reasoning is dropped"),
            ("example_parameter_2" in text, "the second example parameter is still there"),
            ("<IMPORTANT>" in text, "the reminder block is still there"),
            ("<|im_end|>" in text.rsplit("<|im_start|>assistant\n", 1)[-1], "no open generation prompt"),
        )
        if bad
    ]
    if problems:
        raise TemplateError(f"the derived Qwen3.5 template is wrong: {'; '.join(problems)}")


@lru_cache(maxsize=4)
def trl_stock_template(name: str = "qwen3_5_think") -> str | None:
    """TRL's copy of a stock chat template (`trl/chat_templates/<name>.jinja`), found without importing TRL;
    None when TRL is not installed."""
    from importlib.util import find_spec

    try:
        spec = find_spec("trl")
    except (ImportError, ValueError):  # a blocked or half-imported trl counts as absent
        return None
    for root in (spec.submodule_search_locations or []) if spec is not None else []:
        path = Path(root) / "chat_templates" / f"{name}.jinja"
        if path.is_file():
            return path.read_text(encoding="utf-8")
    return None


def recipe_template(tokenizer: Any) -> str:
    """The recipe's template for `tokenizer`: derived from its own chat template when that is Qwen3.5's,
    else from TRL's stock Qwen3.5 template (the recipe swaps its template in whatever the tokenizer has);
    TemplateError when neither is available or an edit fails."""
    own = getattr(tokenizer, "chat_template", None)
    if looks_like_qwen35(own):
        stock, source = own, "the tokenizer's chat template"
    else:
        stock, source = trl_stock_template(), "TRL's qwen3_5_think.jinja"
        if stock is None:
            raise TemplateError(
                "token_build_model qwen3_5: the tokenizer's chat template is not Qwen3.5's and TRL, whose "
                "stock Qwen3.5 template it would be derived from, is not installed; use a Qwen3.5 tokenizer "
                "(its checkpoint ships the template) or token_build_model generic"
            )
    try:
        template = derive(stock)
        check_derived(tokenizer, template)
    except TemplateError as exc:
        raise TemplateError(f"{exc} (source: {source})") from None
    return template
