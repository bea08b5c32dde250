"""A tiny causal LM + tokenizer built locally (no download), saved in Hugging Face format.

`build_tiny_model(dest)` trains a byte-level BPE tokenizer on a built-in corpus, wraps it in a
PreTrainedTokenizerFast with Qwen-style special tokens and a chat template that renders tools and
Qwen3-coder XML tool calls (the format `sweflow.proxy.toolcalls` parses), builds a seeded random Qwen3
model and saves both, so AutoTokenizer / AutoModelForCausalLM.from_pretrained load them for real.
`tiny_model_path()` caches one copy per process. Used by the e2e check and the tests; a real run points
the proxy at a real model and tokenizer instead.
"""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
ADDED = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"]
VOCAB_SIZE = 800
SEED = 1234

# Our own Qwen-style template: tools listed in the system turn, tool calls in Qwen3-coder XML, tool results
# grouped into one user turn. Historical assistant turns render exactly as the model would have written
# them, so consecutive prompts extend each other (what the recorder's linearisation relies on).
CHAT_TEMPLATE = (
    "{%- macro render_value(v) -%}{%- if v is string -%}{{ v }}{%- else -%}{{ v | tojson }}{%- endif -%}{%- endmacro -%}"
    "{%- set ns = namespace(start=0) -%}"
    "{%- if messages and messages[0].role == 'system' -%}{%- set ns.start = 1 -%}{%- endif -%}"
    "{%- if ns.start == 1 or tools -%}"
    "{{ '<|im_start|>system\n' }}"
    "{%- if ns.start == 1 -%}{{ messages[0].content }}{%- endif -%}"
    "{%- if tools -%}"
    "{{ '\n\n# Tools\n<tools>' }}"
    "{%- for tool in tools -%}{{ '\n' }}{{ (tool.function if tool.function is defined else tool) | tojson }}{%- endfor -%}"
    "{{ '\n</tools>\nCall a tool as:\n<tool_call>\n<function=NAME>\n<parameter=ARG>\nVALUE\n</parameter>\n</function>\n</tool_call>' }}"
    "{%- endif -%}"
    "{{ '<|im_end|>\n' }}"
    "{%- endif -%}"
    "{%- for message in messages[ns.start:] -%}"
    "{%- if message.role == 'assistant' -%}"
    "{{ '<|im_start|>assistant\n' }}"
    "{%- if message.content -%}{{ message.content }}{%- endif -%}"
    "{%- for call in message.tool_calls or [] -%}"
    "{%- if message.content or not loop.first -%}{{ '\n' }}{%- endif -%}"
    "{{ '<tool_call>\n<function=' + call.function.name + '>\n' }}"
    "{%- for key, value in (call.function.arguments or {}).items() -%}"
    "{{ '<parameter=' + key + '>\n' }}{{ render_value(value) }}{{ '\n</parameter>\n' }}"
    "{%- endfor -%}"
    "{{ '</function>\n</tool_call>' }}"
    "{%- endfor -%}"
    "{{ '<|im_end|>\n' }}"
    "{%- elif message.role == 'tool' -%}"
    "{%- if loop.first or loop.previtem.role != 'tool' -%}{{ '<|im_start|>user' }}{%- endif -%}"
    "{{ '\n<tool_response>\n' }}{{ message.content }}{{ '\n</tool_response>' }}"
    "{%- if loop.last or loop.nextitem.role != 'tool' -%}{{ '<|im_end|>\n' }}{%- endif -%}"
    "{%- else -%}"
    "{{ '<|im_start|>' + message.role + '\n' }}{{ message.content }}{{ '<|im_end|>\n' }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\n' }}{%- endif -%}"
)

_CORPUS = [
    "The quick brown fox jumps over the lazy dog. Fix the failing test in the repository.",
    "def add(a, b):\n    return a + b\n\nclass Calculator:\n    def divide(self, x, y):\n        return x / y\n",
    "import os\nimport sys\nfrom pathlib import Path\n\nprint('hello world')\n",
    "You are a helpful coding assistant. Read the file, edit the code, run the tests with pytest -rA.",
    "<tool_call>\n<function=Bash>\n<parameter=command>\nls -la /testbed\n</parameter>\n</function>\n</tool_call>",
    '<tool_call>\n{"name": "Read", "arguments": {"file_path": "/testbed/calclib/core.py"}}\n</tool_call>',
    "<tool_response>\ntotal 12\ndrwxr-xr-x 2 root root 4096 calclib tests setup.py README.md\n</tool_response>",
    "system user assistant tool function parameter command description properties type string object",
    "I will look at the code first. Then I will run the tests. All tests passed. The bug is fixed.",
    "0 1 2 3 4 5 6 7 8 9 10 100 1000 true false null {} [] () : ; , . ! ? - _ = + * / \\ | < > # @ $ %",
]


def _train_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 20, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
    )
    fast.add_tokens(ADDED)
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_tiny_tokenizer(dest: str | Path) -> Path:
    """Build and save only the tiny tokenizer (no torch needed) under `dest`; return it."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    _train_tokenizer().save_pretrained(dest)
    return dest


# Architecture presets. "tiny": the smallest model that exercises every code path (tests, the proxy).
# "tiny-swa": the one the embedded default trains: wider (it memorises a warm-start trajectory in tens of
# steps) and with sliding-window attention in both layers, so a token depends on the last 2 x 256 tokens
# only: a warm start can train on exact windows around the model's turns instead of whole 6k-token sessions.
PRESETS: dict[str, dict] = {
    "tiny": {"hidden_size": 64, "intermediate_size": 128, "head_dim": 16},
    "tiny-swa": {
        "hidden_size": 256,
        "intermediate_size": 512,
        "head_dim": 64,
        "use_sliding_window": True,
        "sliding_window": 256,
        "max_window_layers": 0,
    },
}


def build_tiny_model(dest: str | Path, preset: str = "tiny") -> Path:
    """Build and save the tiny tokenizer + random-weight Qwen3 model (`PRESETS[preset]`) under `dest`."""
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    tokenizer = _train_tokenizer()
    tokenizer.save_pretrained(dest)
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    pad = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=65536,
        tie_word_embeddings=True,
        eos_token_id=eos,
        pad_token_id=pad,
        bos_token_id=pad,
        **PRESETS[preset],
    )
    torch.manual_seed(SEED)
    model = Qwen3ForCausalLM(config)
    model.save_pretrained(dest)
    GenerationConfig(eos_token_id=eos, pad_token_id=pad, bos_token_id=pad).save_pretrained(dest)
    return dest


@functools.cache
def tiny_model_path() -> Path:
    """One built copy per process, in a temp dir removed at interpreter exit."""
    holder = tempfile.TemporaryDirectory(prefix="sweflow-tiny-model-")
    tiny_model_path._holder = holder  # type: ignore[attr-defined]  # keep the dir alive with the cache
    return build_tiny_model(Path(holder.name) / "tiny")


@functools.cache
def tiny_tokenizer_path() -> Path:
    """The tokenizer alone (same vocabulary and template as the model's), one copy per process."""
    holder = tempfile.TemporaryDirectory(prefix="sweflow-tiny-tok-")
    tiny_tokenizer_path._holder = holder  # type: ignore[attr-defined]
    return build_tiny_tokenizer(Path(holder.name) / "tok")
