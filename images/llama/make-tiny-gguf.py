#!/usr/bin/env python3
"""Writes a tiny llama-architecture GGUF model for the model-server tests.

2 layers, 64-dimensional embeddings, 4 heads, random f32 weights drawn from a fixed seed (the
same bytes on every run), and the tokenizer (vocabulary, scores, token types, special ids) copied
from a vocabulary-only GGUF that the llama.cpp source tree ships (models/ggml-vocab-*.gguf).
No package ships real weights; this model answers nonsense, but through the real code paths.

    make-tiny-gguf.py VOCAB.gguf OUT.gguf [--min-bytes N]

With --min-bytes the model takes a larger shape (512-dimensional embeddings, 8 heads, a
2048-wide feed-forward) and as many layers as make the file at least N bytes: a model of real
size and ordinary proportions (its compute buffers stay small), whose every weight each token
reads, with the same seed (the same bytes for the same N). Tensors are drawn and written one at
a time, so the generator holds one tensor in memory, not the model.
"""

import sys

import numpy as np
from gguf import GGUFReader, GGUFValueType, GGUFWriter

SEED = 1616
# (embedding, heads, feed-forward, layers): the tiny model, and the large one's layer shape.
TINY = (64, 4, 128, 2)
LARGE = (512, 8, 2048)
N_CTX = 512
# A plain chat template (no special tokens needed), so chat completions work with any vocabulary.
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


def copy_tokenizer(reader: GGUFReader, writer: GGUFWriter) -> int:
    """Copies every tokenizer.* key; returns the vocabulary size."""
    n_vocab = 0
    for name, field in reader.fields.items():
        if not name.startswith("tokenizer.") or name == "tokenizer.chat_template":
            continue
        vtype = field.types[0]
        value = field.contents()
        if vtype == GGUFValueType.ARRAY:
            writer.add_array(name, list(value))
            if name == "tokenizer.ggml.tokens":
                n_vocab = len(value)
        elif vtype == GGUFValueType.STRING:
            writer.add_string(name, value)
        else:
            writer.add_key_value(name, value, vtype)
    if n_vocab == 0:
        raise SystemExit("the vocabulary file has no tokenizer.ggml.tokens")
    return n_vocab


def large_shape(n_vocab: int, min_bytes: int) -> tuple[int, int, int, int]:
    """LARGE with the fewest layers that make the f32 tensors at least `min_bytes`."""
    n_embd, n_head, n_ff = LARGE
    fixed = 4 * (2 * n_vocab * n_embd + n_embd)
    per_layer = 4 * (4 * n_embd * n_embd + 3 * n_embd * n_ff + 2 * n_embd)
    return n_embd, n_head, n_ff, max(1, -(-(min_bytes - fixed) // per_layer))


def parse_args() -> tuple[str, str, int]:
    args = sys.argv[1:]
    min_bytes = 0
    if len(args) == 4 and args[2] == "--min-bytes" and args[3].isdigit():
        min_bytes = int(args[3])
        args = args[:2]
    if len(args) != 2:
        raise SystemExit("usage: make-tiny-gguf.py VOCAB.gguf OUT.gguf [--min-bytes N]")
    return args[0], args[1], min_bytes


def main() -> None:
    vocab_path, out_path, min_bytes = parse_args()
    reader = GGUFReader(vocab_path)
    writer = GGUFWriter(out_path, "llama")
    writer.add_name("vm-tiny-llama")
    writer.add_context_length(N_CTX)
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    n_embd, n_head, n_ff, n_layer = TINY
    if min_bytes and tokens:
        n_embd, n_head, n_ff, n_layer = large_shape(len(tokens.data), min_bytes)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(n_layer)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(n_embd // n_head)
    writer.add_file_type(0)  # all f32
    n_vocab = copy_tokenizer(reader, writer)
    writer.add_vocab_size(n_vocab)
    writer.add_chat_template(CHAT_TEMPLATE)

    rng = np.random.default_rng(SEED)

    # (name, shape, drawn): drawn weights, else ones (the norms). Declared first, then each
    # drawn and written in this order, one at a time.
    tensors = [("token_embd.weight", (n_vocab, n_embd), True)]
    for i in range(n_layer):
        b = f"blk.{i}"
        tensors.append((f"{b}.attn_norm.weight", (n_embd,), False))
        for t in ("attn_q", "attn_k", "attn_v", "attn_output"):
            tensors.append((f"{b}.{t}.weight", (n_embd, n_embd), True))
        tensors.append((f"{b}.ffn_norm.weight", (n_embd,), False))
        tensors.append((f"{b}.ffn_gate.weight", (n_ff, n_embd), True))
        tensors.append((f"{b}.ffn_up.weight", (n_ff, n_embd), True))
        tensors.append((f"{b}.ffn_down.weight", (n_embd, n_ff), True))
    tensors.append(("output_norm.weight", (n_embd,), False))
    tensors.append(("output.weight", (n_vocab, n_embd), True))

    for name, shape, _ in tensors:
        writer.add_tensor_info(name, shape, np.dtype(np.float32), 4 * int(np.prod(shape)))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for _, shape, drawn in tensors:
        if drawn:
            writer.write_tensor_data(rng.normal(0.0, 0.02, size=shape).astype(np.float32))
        else:
            writer.write_tensor_data(np.ones(shape, dtype=np.float32))
    writer.close()

if __name__ == "__main__":
    main()
