"""A tiny Llama-shaped model that speaks Kimi K3's chat format, built by hand (nothing downloaded).

Run with the ENGINE venv's python (it needs numpy, torch, tokenizers, safetensors):

    .venv-vllm-engine/bin/python -m tests.real_vllm.tiny_model --out DIR

What it is, and why it works:
- **Tokenizer**: byte-level BPE trained on the spot (``tokenizers``), with the K3 markers of the
  model profile (``components.core.model.KIMI_K3_MARKUP``) and an end token as special tokens.
  The vocabulary is exactly the special tokens plus the 256 byte symbols, so training learns no
  merges: every byte of text is one token. That is what lets the chat template count tokens.
- **Chat template** (Jinja, rendered by vLLM): the conversation in K3's XTML layout (messages,
  tools, reasoning of earlier turns, tool results), then a *scripted reply*: the template derives
  the reply from the conversation (``CHAT_TEMPLATE`` below says how: one tool call per city named,
  of the function ``tool_choice`` names and none when it is ``none``; a note ("Note: ...") saved
  verbatim as one long argument; the tool result quoted; every vault code the text states, else
  "ok"; the reasoning is longer for a higher ``reasoning_effort``, low < medium < high < max) and
  writes it, padded, into the last ``COPY_PERIOD_TOKENS`` tokens of the prompt, which end with the
  generation prompt. The reply keeps K3's channel order: think, response (empty before a call),
  tools, as the structural tag that forces a ``tool_choice`` requires.
- **Weights**: 3 layers; only layer 0's attention does anything. Its one head attends from
  position p to position p + 1 - COPY_PERIOD_TOKENS (RoPE with rope_theta = 2**32 and head_dim
  64 gives the frequencies 2**-j, j = 0..31; the query holds the phase of that offset, so the
  score sum_j cos((delta - offset) 2**-j) peaks there with a margin that survives an FP8 KV
  cache), and copies that token's 9-bit code into the residual stream; ``lm_head`` decodes the
  code. Greedy decoding therefore continues the prompt with period COPY_PERIOD_TOKENS: it emits
  the scripted reply, K3 reasoning and tool-call markup included, and stops at the end token.
  Layers 1-2 have zero output projections (the residual stream passes through).

So the engine, its K3 parsers, renderer, sampler, KV cache, API and metrics are real; the
model's "answers" are the template's script. ``model_fingerprint`` is the cache key.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
from pathlib import Path

from components.core.model import KIMI_K3_1_PRO

# Every reply is copied from the last COPY_PERIOD_TOKENS tokens of the prompt (the template pads
# the scripted reply to this length); the longest reply the template writes must fit.
COPY_PERIOD_TOKENS = 1024
END_TOKEN = "<|end|>"
SPECIAL_TOKENS: tuple[str, ...] = (*KIMI_K3_1_PRO.chat_markup.special_tokens, END_TOKEN)
HIDDEN_SIZE = 64
HEAD_DIM = 64
NUM_LAYERS = 3
INTERMEDIATE_SIZE = 64
ROPE_THETA = float(2**32)  # with head_dim 64: frequencies 2**-j
ROPE_PAIRS_USED = 21  # 2**-20 covers relative positions up to 2**22 > the 1,048,576-token context
CODE_BITS = 9  # token ids < 512
# Attention and output magnitudes: the attention margin at the copy offset is about 6 x QUERY_GAIN
# x KEY_GAIN / 15.5 / sqrt(HEAD_DIM) logits with an FP8 (e4m3) KV cache (measured over 140k
# positions), about 60; the lm_head margin between the copied token and any other is
# 2 x LOGIT_GAIN x the normalised code value, about 50.
QUERY_GAIN = 80.0
KEY_GAIN = 15.5
LOGIT_GAIN = 16.0
MAX_POSITION_EMBEDDINGS = KIMI_K3_1_PRO.max_context_tokens
# Cities the scripted reply recognises (scripts/ops/validate.py asks about these).
CITIES: tuple[str, ...] = ("Paris", "Tokyo", "Berlin", "Lima", "London", "Madrid", "Rome", "Oslo")
# Bump when the builder changes in a way its own source does not show (it is hashed too).
BUILD_LAYOUT = 1

# The chat template. __PERIOD__, __COUNT_FIX__, __CITIES__ and the markers are filled in below.
# Layout of a prompt (K3 XTML, one element per message):
#   [<|open|>tools<|sep|>TOOLS-JSON<|close|>tools<|sep|>]
#   <|open|>message role="user"<|sep|>TEXT<|close|>message<|sep|>
#   <|open|>message role="assistant"<|sep|>[<|open|>think<|sep|>R<|close|>think<|sep|>]
#       [<|open|>response<|sep|>TEXT<|close|>response<|sep|>][<|open|>tools<|sep|>CALLS<|close|>tools<|sep|>]
#       <|close|>message<|sep|>
#   <|open|>message role="tool" tool="NAME" index="I"<|sep|>RESULT<|close|>message<|sep|>
#   <|open|>script<|sep|>REPLY PAD<|close|>script<|sep|><|open|>message role="assistant"<|sep|>[<|open|>think<|sep|>]
# where REPLY ... through the end is exactly __PERIOD__ tokens (the model copies it).
CHAT_TEMPLATE = r"""
{%- macro args_xtml(arguments) -%}
{%- if arguments is mapping -%}
{%- for key, value in arguments.items() -%}
<|open|>argument key="{{ key }}" type="{{ 'string' if value is string else 'json' }}"<|sep|>
{{- value if value is string else value | tojson }}<|close|>argument<|sep|>
{%- endfor -%}
{%- else -%}{{ arguments }}{%- endif -%}
{%- endmacro -%}
{%- macro text_of(content) -%}{{ content if content is string else content | tojson }}{%- endmacro -%}
{%- if tools -%}<|open|>tools<|sep|>{{ tools | tojson }}<|close|>tools<|sep|>{%- endif -%}
{%- for m in messages -%}
{%- if m.role == 'assistant' -%}
<|open|>message role="assistant"<|sep|>
{%- set r = m.reasoning_content or m.reasoning -%}
{%- if r %}<|open|>think<|sep|>{{ r }}<|close|>think<|sep|>{% endif -%}
{%- if m.content is string and m.content %}<|open|>response<|sep|>{{ m.content }}<|close|>response<|sep|>{% endif -%}
{%- if m.tool_calls -%}
<|open|>tools<|sep|>
{%- for tc in m.tool_calls -%}
<|open|>call tool="{{ tc.function.name }}" index="{{ loop.index }}"<|sep|>
{{- args_xtml(tc.function.arguments) }}<|close|>call<|sep|>
{%- endfor -%}
<|close|>tools<|sep|>
{%- endif -%}
<|close|>message<|sep|>
{%- elif m.role == 'tool' -%}
<|open|>message role="tool"<|sep|>{{ text_of(m.content) }}<|close|>message<|sep|>
{%- else -%}
<|open|>message role="{{ m.role }}"<|sep|>{{ text_of(m.content) }}<|close|>message<|sep|>
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
{#- The scripted reply: derived from the conversation, copied by the weights. -#}
{%- set effort = thinking_effort or reasoning_effort or 'max' -%}
{%- set think = thinking is not defined or thinking is none or thinking -%}
{%- set last = messages[-1] if messages else {'role': 'user', 'content': ''} -%}
{%- set text = last.content if last.content is string else '' -%}
{%- set ns = namespace(found=[], results=[], body='', why='', fn=none, codes=[]) -%}
{%- if last.role == 'tool' -%}
{%- for m in messages -%}
{%- if m.role == 'tool' -%}{%- set ns.results = ns.results + [text_of(m.content)] -%}
{%- elif m.role == 'assistant' -%}{%- set ns.results = [] -%}
{%- endif -%}
{%- endfor -%}
{%- set ns.why = 'The tool returned its result; I answer with what it said.' -%}
{%- set ns.body = '<|open|>response<|sep|>Here is what the tool said: ' ~ ns.results | join(' | ')
    ~ '<|close|>response<|sep|>' -%}
{%- else -%}
{%- for city in [__CITIES__] -%}
{%- if city in text -%}{%- set ns.found = ns.found + [[text.find(city), city]] -%}{%- endif -%}
{%- endfor -%}
{#- tool_choice reaches the template when it is neither unset nor auto (renderers/kimi_k3.py):
    'none' -> no call; {'type': 'function', 'function': {'name': N}} -> a call of N; 'required' -> a call. -#}
{%- set choice = tool_choice if tool_choice is defined and tool_choice is not none else 'auto' -%}
{%- set ns.fn = none -%}
{#- The function: the one tool_choice names, else one the text names, else the first tool. -#}
{%- if tools and choice != 'none' -%}
{%- for t in tools -%}
{%- set f = t.function if t.function is defined else t -%}
{%- if ns.fn is none and ((choice is mapping and f.name == choice.function.name)
    or (choice is not mapping and f.name in text)) -%}{%- set ns.fn = f -%}{%- endif -%}
{%- endfor -%}
{%- if ns.fn is none and choice is not mapping -%}
{%- set ns.fn = tools[0].function if tools[0].function is defined else tools[0] -%}
{%- endif -%}
{%- endif -%}
{%- if ns.fn is not none and ('Note: ' in text or ns.found) -%}
{%- set fn = ns.fn -%}
{%- set params = fn.parameters if fn.parameters is defined else {} -%}
{%- set required = (params.required if params.required is defined else []) or ['city'] -%}
{%- if 'Note: ' in text -%}
{%- set ns.why = 'The user wants the note saved verbatim; I call ' ~ fn.name ~ ' with it.' -%}
{%- set pairs = [[0, text.split('Note: ')[1]]] -%}
{%- else -%}
{%- set ns.why = 'The user asks about ' ~ (ns.found | sort | map(attribute=1) | join(' and '))
    ~ '; I call ' ~ fn.name ~ ' once per city.' -%}
{%- set pairs = ns.found | sort -%}
{%- endif -%}
{#- K3 always writes the response channel before the tools channel (its structural tag requires it). -#}
{%- set ns.body = '<|open|>response<|sep|><|close|>response<|sep|><|open|>tools<|sep|>' -%}
{%- for pair in pairs -%}
{%- set ns.body = ns.body ~ '<|open|>call tool="' ~ fn.name ~ '" index="' ~ loop.index ~ '"<|sep|>'
    ~ '<|open|>argument key="' ~ required[0] ~ '" type="string"<|sep|>' ~ pair[1]
    ~ '<|close|>argument<|sep|><|close|>call<|sep|>' -%}
{%- endfor -%}
{%- set ns.body = ns.body ~ '<|close|>tools<|sep|>' -%}
{%- elif 'The code for vault ' in text -%}
{#- The recall probe: every "The code for vault NAME is CODE." in the text, in order. -#}
{%- set ns.why = 'The text states the vault codes; I list them.' -%}
{%- set ns.codes = [] -%}
{%- for piece in text.split('The code for vault ')[1:] -%}
{%- set ns.codes = ns.codes + [piece.split(' is ')[0] ~ ': ' ~ piece.split(' is ')[1].split('.')[0]] -%}
{%- endfor -%}
{%- set ns.body = '<|open|>response<|sep|>' ~ ns.codes | join('; ') ~ '<|close|>response<|sep|>' -%}
{%- elif tools and ns.found -%}
{%- set ns.why = 'The user asks about ' ~ (ns.found | sort | map(attribute=1) | join(' and '))
    ~ ', but tool_choice is none: I answer without a tool.' -%}
{%- set ns.body = '<|open|>response<|sep|>I cannot look that up without a tool.<|close|>response<|sep|>' -%}
{%- else -%}
{%- set ns.why = 'A short direct answer is enough.' -%}
{%- set ns.body = '<|open|>response<|sep|>ok<|close|>response<|sep|>' -%}
{%- endif -%}
{%- endif -%}
{#- Longer reasoning for a higher effort: low < medium < high < max (K3.1's levels; K3 has no medium). -#}
{%- set more = ' I check the request once more before answering.' -%}
{%- if effort == 'low' -%}{%- set more = '' -%}
{%- elif effort == 'medium' -%}{%- set more = ' I check it.' -%}
{%- elif effort != 'high' -%}
{%- set more = more ~ ' Nothing in it is ambiguous. The answer format is the one asked for. Done thinking.' -%}
{%- endif -%}
{%- set reply = (ns.why ~ more ~ '<|close|>think<|sep|>' if think else '') ~ ns.body
    ~ '<|close|>message<|sep|>' ~ '__END__' -%}
{%- set tail = '<|close|>script<|sep|><|open|>message role="assistant"<|sep|>'
    ~ ('<|open|>think<|sep|>' if think else '') -%}
{%- set used = (reply ~ tail).encode('utf-8') | length __COUNT_FIX__ -%}
{%- if used > __PERIOD__ -%}
{{- raise_exception('the scripted reply needs ' ~ used ~ ' tokens; the copy period is __PERIOD__') }}
{%- endif -%}
<|open|>script<|sep|>{{ reply }}{{ ' ' * (__PERIOD__ - used) }}{{ tail }}
{%- endif -%}
"""


def chat_template() -> str:
    """The Jinja chat template with the period, the token-count fix-ups and the cities filled in."""
    # Each special token is one token but len(marker) bytes: subtract the difference per occurrence.
    fix = "".join(f" - (reply ~ tail).count('{tok}') * {len(tok.encode()) - 1}" for tok in SPECIAL_TOKENS)
    text = CHAT_TEMPLATE.strip("\n")
    text = text.replace("__COUNT_FIX__", fix).replace("__PERIOD__", str(COPY_PERIOD_TOKENS))
    text = text.replace("__CITIES__", ", ".join(f"'{c}'" for c in CITIES)).replace("__END__", END_TOKEN)
    return text


def model_fingerprint() -> str:
    """16 hex digits of the sha256 of this builder's source and the constants it reads: the cache key."""
    digest = hashlib.sha256(Path(__file__).read_bytes())
    digest.update(json.dumps({"special_tokens": SPECIAL_TOKENS, "layout": BUILD_LAYOUT,
                              "max_position": MAX_POSITION_EMBEDDINGS}).encode())
    return digest.hexdigest()[:16]


def _tokenizer_json() -> tuple[str, dict[str, int]]:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=len(SPECIAL_TOKENS) + 256,  # the alphabet and the specials only: no merges
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    corpus = [f'<|open|>message role="user"<|sep|>What is the weather in {c}?<|close|>message<|sep|>' for c in CITIES]
    tok.train_from_iterator(corpus, trainer)
    vocab = tok.get_vocab()
    if len(vocab) != len(SPECIAL_TOKENS) + 256:
        raise RuntimeError(f"tokenizer has {len(vocab)} tokens, expected {len(SPECIAL_TOKENS) + 256} (merges learned?)")
    return tok.to_str(), vocab


def _weights(vocab_size: int) -> dict[str, object]:
    import numpy as np
    import torch

    d, b = HIDDEN_SIZE, CODE_BITS
    const, code_in, code_out = 0, 1, 1 + b  # residual layout: [const | token code | copied code | 0...]
    codes = np.array([[1.0 if (t >> i) & 1 else -1.0 for i in range(b)] for t in range(vocab_size)], dtype=np.float32)
    embed = np.zeros((vocab_size, d), np.float32)
    embed[:, const] = math.sqrt(b)
    embed[:, code_in : code_in + b] = codes
    # RMSNorm (weight 1) scales every embedding by the same factor: all have the same norm.
    norm_scale = math.sqrt(d / (b + b))
    # The frequencies exactly as vLLM computes them (rotary_embedding/base.py, float32).
    inv_freq = (1.0 / (ROPE_THETA ** (torch.arange(0, HEAD_DIM, 2, dtype=torch.float) / HEAD_DIM))).double().numpy()
    offset = COPY_PERIOD_TOKENS - 1  # attend from p to p - offset: the token predicted at p + 1
    half = HEAD_DIM // 2
    q = np.zeros((HEAD_DIM, d), np.float32)
    k = np.zeros((HEAD_DIM, d), np.float32)
    for j in range(ROPE_PAIRS_USED):
        phase = offset * inv_freq[j]
        # neox rotary pairs (j, j + half): (q1 + i q2) = QUERY_GAIN e^{-i offset theta_j}, k = KEY_GAIN.
        q[j, const] = QUERY_GAIN * math.cos(phase) / (math.sqrt(b) * norm_scale)
        q[j + half, const] = -QUERY_GAIN * math.sin(phase) / (math.sqrt(b) * norm_scale)
        k[j, const] = KEY_GAIN / (math.sqrt(b) * norm_scale)
    v = np.zeros((HEAD_DIM, d), np.float32)
    v[np.arange(b), code_in + np.arange(b)] = 1.0 / norm_scale  # the value is the token's code, +-1
    o = np.zeros((d, HEAD_DIM), np.float32)
    o[code_out + np.arange(b), np.arange(b)] = 1.0
    lm_head = np.zeros((vocab_size, d), np.float32)
    lm_head[:, code_out : code_out + b] = codes * LOGIT_GAIN
    tensors: dict[str, object] = {"model.embed_tokens.weight": embed, "model.norm.weight": np.ones(d, np.float32),
                                  "lm_head.weight": lm_head}
    for layer in range(NUM_LAYERS):
        p = f"model.layers.{layer}."
        active = layer == 0
        tensors |= {
            p + "input_layernorm.weight": np.ones(d, np.float32),
            p + "post_attention_layernorm.weight": np.ones(d, np.float32),
            p + "self_attn.q_proj.weight": q if active else np.zeros_like(q),
            p + "self_attn.k_proj.weight": k if active else np.zeros_like(k),
            p + "self_attn.v_proj.weight": v if active else np.zeros_like(v),
            p + "self_attn.o_proj.weight": o if active else np.zeros_like(o),
            p + "mlp.gate_proj.weight": np.zeros((INTERMEDIATE_SIZE, d), np.float32),
            p + "mlp.up_proj.weight": np.zeros((INTERMEDIATE_SIZE, d), np.float32),
            p + "mlp.down_proj.weight": np.zeros((d, INTERMEDIATE_SIZE), np.float32),
        }
    return tensors


def build(out: Path) -> Path:
    """Write the model (config.json, generation_config.json, tokenizer files, model.safetensors) to
    ``out`` (created; must not exist). Deterministic: the same builder gives the same bytes.

    Raises:
        FileExistsError: ``out`` exists.
        RuntimeError: the tokenizer learned merges (token counting in the template would break).
    """
    from safetensors.numpy import save_file

    out.mkdir(parents=True)
    tokenizer_json, vocab = _tokenizer_json()
    vocab_size = len(vocab)
    end_id = vocab[END_TOKEN]
    (out / "tokenizer.json").write_text(tokenizer_json)
    added = {str(vocab[t]): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                             "single_word": False, "special": True} for t in SPECIAL_TOKENS}
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "added_tokens_decoder": added, "eos_token": END_TOKEN,
        "pad_token": END_TOKEN, "bos_token": None, "clean_up_tokenization_spaces": False,
        "model_max_length": MAX_POSITION_EMBEDDINGS, "chat_template": chat_template(),
    }, indent=1, sort_keys=True))
    (out / "special_tokens_map.json").write_text(json.dumps({"eos_token": END_TOKEN, "pad_token": END_TOKEN}, indent=1))
    (out / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": vocab_size,
        "hidden_size": HIDDEN_SIZE, "intermediate_size": INTERMEDIATE_SIZE, "num_hidden_layers": NUM_LAYERS,
        "num_attention_heads": 1, "num_key_value_heads": 1, "head_dim": HEAD_DIM, "hidden_act": "silu",
        "max_position_embeddings": MAX_POSITION_EMBEDDINGS, "rms_norm_eps": 1e-6,
        "rope_parameters": {"rope_type": "default", "rope_theta": ROPE_THETA},
        "tie_word_embeddings": False, "attention_bias": False, "mlp_bias": False,
        "bos_token_id": None, "eos_token_id": end_id, "pad_token_id": end_id, "dtype": "float32",
    }, indent=1, sort_keys=True))
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": end_id, "pad_token_id": end_id}, indent=1))
    save_file(_weights(vocab_size), str(out / "model.safetensors"), metadata={"format": "pt"})  # type: ignore[arg-type]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build the tiny K3-format test model into --out (must not exist).")
    parser.add_argument("--out", type=Path, required=True, help="directory to create")
    parser.add_argument("--fingerprint", action="store_true", help="print the cache key and exit")
    args = parser.parse_args(argv)
    if args.fingerprint:
        print(model_fingerprint())
        return 0
    build(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
