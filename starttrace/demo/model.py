"""A small Llama model directory made offline: config, a BPE tokenizer trained on local text and
real safetensors weights (random values, two shards and their index, as a Hugging Face checkpoint).

vLLM serves it with its defaults (real weights read from the shards, torch.compile on), so the
whole startup path runs (config, tokenizer, weights, compile, KV cache, API server) with no
download. Sizes follow the CPU backend's limits (head_dim 32: the CPU attention backend rejects 16).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

VOCAB_SIZE = 1024
MODEL_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 768,
    "num_hidden_layers": 2,
    "num_attention_heads": 8,
    "num_key_value_heads": 8,
    "head_dim": 32,
    "hidden_act": "silu",
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
    "vocab_size": VOCAB_SIZE,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
    "transformers_version": "4.56.0",
}
SPECIAL_TOKENS = ["<pad>", "<s>", "</s>", "<unk>"]
MARKER = ".starttrace-tiny-model-v2"  # v2: real safetensors weights
SHARDS = 2


def _local_text() -> Iterator[str]:
    """Training text: the standard library's own source files (always present, no download)."""
    stdlib = Path(os.__file__).parent
    names = ["os.py", "argparse.py", "textwrap.py", "string.py", "json/__init__.py", "pathlib.py", "typing.py"]
    for name in names:
        path = stdlib / name
        if path.exists():
            yield path.read_text(encoding="utf-8", errors="replace")
    yield "The quick brown fox jumps over the lazy dog. Hello, my name is starttrace."


def make_tiny_model(directory: str | os.PathLike[str]) -> Path:
    """Write the model directory (idempotent: an existing complete directory is reused)."""
    target = Path(directory)
    if (target / MARKER).exists() and (target / "tokenizer.json").exists():
        return target
    _write_tokenizer(target)
    _write_weights(target)
    (target / MARKER).write_text("made by starttrace.demo.model.make_tiny_model\n")
    return target


def weight_shapes() -> dict[str, tuple[int, ...]]:
    """The tensors of a LlamaForCausalLM checkpoint of MODEL_CONFIG, by name."""
    c = MODEL_CONFIG
    hidden, inter, vocab = int(c["hidden_size"]), int(c["intermediate_size"]), int(c["vocab_size"])
    heads, kv_heads, head_dim = int(c["num_attention_heads"]), int(c["num_key_value_heads"]), int(c["head_dim"])
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (vocab, hidden)}
    for i in range(int(c["num_hidden_layers"])):
        p = f"model.layers.{i}."
        shapes[p + "self_attn.q_proj.weight"] = (heads * head_dim, hidden)
        shapes[p + "self_attn.k_proj.weight"] = (kv_heads * head_dim, hidden)
        shapes[p + "self_attn.v_proj.weight"] = (kv_heads * head_dim, hidden)
        shapes[p + "self_attn.o_proj.weight"] = (hidden, heads * head_dim)
        shapes[p + "mlp.gate_proj.weight"] = (inter, hidden)
        shapes[p + "mlp.up_proj.weight"] = (inter, hidden)
        shapes[p + "mlp.down_proj.weight"] = (hidden, inter)
        shapes[p + "input_layernorm.weight"] = (hidden,)
        shapes[p + "post_attention_layernorm.weight"] = (hidden,)
    shapes["model.norm.weight"] = (hidden,)
    shapes["lm_head.weight"] = (vocab, hidden)
    return shapes


def _write_weights(target: Path) -> None:
    """Random float32 weights in SHARDS safetensors files plus model.safetensors.index.json."""
    import torch
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(0)
    names = list(weight_shapes().items())
    per_shard = -(-len(names) // SHARDS)
    weight_map: dict[str, str] = {}
    total = 0
    for k in range(SHARDS):
        file = f"model-{k + 1:05d}-of-{SHARDS:05d}.safetensors"
        tensors = {}
        for name, shape in names[k * per_shard : (k + 1) * per_shard]:
            if name.endswith("norm.weight"):
                tensors[name] = torch.ones(shape)
            else:
                tensors[name] = torch.randn(shape, generator=gen) * 0.02
            weight_map[name] = file
            total += tensors[name].numel() * 4
        save_file(tensors, str(target / file), metadata={"format": "pt"})
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (target / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


def _write_tokenizer(target: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    target.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_local_text(), trainer=trainer)
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)]
    )
    assert tokenizer.get_vocab_size() <= VOCAB_SIZE, tokenizer.get_vocab_size()
    assert [tokenizer.token_to_id(t) for t in SPECIAL_TOKENS] == [0, 1, 2, 3]
    tokenizer.save(str(target / "tokenizer.json"))
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "pad_token": "<pad>",
        "model_max_length": 128,
        "add_bos_token": True,
        "clean_up_tokenization_spaces": False,
    }
    (target / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n")
    (target / "special_tokens_map.json").write_text(
        json.dumps({"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}) + "\n"
    )
    (target / "config.json").write_text(json.dumps(MODEL_CONFIG, indent=2) + "\n")
    (target / "generation_config.json").write_text(
        json.dumps({"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}) + "\n"
    )


if __name__ == "__main__":
    import sys

    print(make_tiny_model(sys.argv[1] if len(sys.argv) > 1 else "tiny-llama"))
