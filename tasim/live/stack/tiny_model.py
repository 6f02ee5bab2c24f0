"""A tokenizer-only model folder for the mocker and the frontend when no model is given.

The Hugging Face hub is out of reach in CI, and the mocker reads nothing but the tokenizer and
``config.json``. The vocabulary is ``<unk> <s> </s>`` then the words ``w3 … wN-1``, one token
each, so any token id the mocker emits detokenizes, and the text of a prompt round-trips to its
ids.
"""

from __future__ import annotations

import json
from pathlib import Path

VOCAB_SIZE = 4096


def write_tiny_model(directory: Path, vocab_size: int = VOCAB_SIZE) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    directory.mkdir(parents=True, exist_ok=True)
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2} | {f"w{i}": i for i in range(3, vocab_size)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    tokenizer.save(str(directory / "tokenizer.json"))
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "model_max_length": 1 << 20,
        "chat_template": "{% for m in messages %}{{ m['content'] }} {% endfor %}",
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=1))
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab_size,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "max_position_embeddings": 1 << 20,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": "bfloat16",
    }
    (directory / "config.json").write_text(json.dumps(config, indent=1))
    return directory


def vocab_size(model_path: Path) -> int:
    """The vocabulary a model folder declares (prompts draw token ids below it)."""
    return int(json.loads((model_path / "config.json").read_text()).get("vocab_size", VOCAB_SIZE))
