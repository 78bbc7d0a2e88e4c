"""A tiny Llama model directory made offline: config + a BPE tokenizer trained on local text.

vLLM serves it with `--load-format dummy` (random weights: no weight files are needed), so the
whole startup path runs (config, tokenizer, model construction, KV cache, API server) with no
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
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
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
MARKER = ".starttrace-tiny-model"


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
    (target / MARKER).write_text("made by starttrace.demo.model.make_tiny_model\n")
    return target


if __name__ == "__main__":
    import sys

    print(make_tiny_model(sys.argv[1] if len(sys.argv) > 1 else "tiny-llama"))
