#!/usr/bin/env python3
"""Writes a tiny llama-architecture GGUF model for the model-server tests.

2 layers, 64-dimensional embeddings, 4 heads, random f32 weights drawn from a fixed seed (the
same bytes on every run), and the tokenizer (vocabulary, scores, token types, special ids) copied
from a vocabulary-only GGUF that the llama.cpp source tree ships (models/ggml-vocab-*.gguf).
No package ships real weights; this model answers nonsense, but through the real code paths.

    make-tiny-gguf.py VOCAB.gguf OUT.gguf
"""

import sys

import numpy as np
from gguf import GGUFReader, GGUFValueType, GGUFWriter

SEED = 1616
N_EMBD = 64
N_LAYER = 2
N_HEAD = 4
N_FF = 128
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


def main() -> None:
    if len(sys.argv) != 3:
        raise SystemExit("usage: make-tiny-gguf.py VOCAB.gguf OUT.gguf")
    vocab_path, out_path = sys.argv[1], sys.argv[2]
    reader = GGUFReader(vocab_path)
    writer = GGUFWriter(out_path, "llama")
    writer.add_name("vm-tiny-llama")
    writer.add_context_length(N_CTX)
    writer.add_embedding_length(N_EMBD)
    writer.add_block_count(N_LAYER)
    writer.add_feed_forward_length(N_FF)
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(N_HEAD)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(N_EMBD // N_HEAD)
    writer.add_file_type(0)  # all f32
    n_vocab = copy_tokenizer(reader, writer)
    writer.add_vocab_size(n_vocab)
    writer.add_chat_template(CHAT_TEMPLATE)

    rng = np.random.default_rng(SEED)

    def weight(*shape: int) -> np.ndarray:
        return rng.normal(0.0, 0.02, size=shape).astype(np.float32)

    ones = lambda n: np.ones(n, dtype=np.float32)  # noqa: E731
    writer.add_tensor("token_embd.weight", weight(n_vocab, N_EMBD))
    for i in range(N_LAYER):
        b = f"blk.{i}"
        writer.add_tensor(f"{b}.attn_norm.weight", ones(N_EMBD))
        for t in ("attn_q", "attn_k", "attn_v", "attn_output"):
            writer.add_tensor(f"{b}.{t}.weight", weight(N_EMBD, N_EMBD))
        writer.add_tensor(f"{b}.ffn_norm.weight", ones(N_EMBD))
        writer.add_tensor(f"{b}.ffn_gate.weight", weight(N_FF, N_EMBD))
        writer.add_tensor(f"{b}.ffn_up.weight", weight(N_FF, N_EMBD))
        writer.add_tensor(f"{b}.ffn_down.weight", weight(N_EMBD, N_FF))
    writer.add_tensor("output_norm.weight", ones(N_EMBD))
    writer.add_tensor("output.weight", weight(n_vocab, N_EMBD))

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


if __name__ == "__main__":
    main()
