"""Build the tiny model the GSM8K end-to-end test serves with vLLM: run with the vLLM venv's python.

    .venv-vllm/bin/python tests/vllm_tiny_model.py --train TRAIN.jsonl --out DIR

A 2-layer Llama, hidden size 64, with random weights from a fixed seed, and a byte-level BPE
tokenizer of 2048 tokens trained on the GSM8K train split. Everything is made here, offline,
with the `tokenizers` and `transformers` that come with vLLM; nothing is fetched from a model
hub. The same inputs give the same files. The model's answers are noise (it scores about 0):
it exists so that a real vLLM engine loads, tokenizes, schedules and generates.

DIR is written whole or not at all (built beside it, then renamed), so an interrupted build
never leaves a half model for the next run to pick up.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

VOCAB_SIZE = 2048
HIDDEN = 64
LAYERS = 2
HEADS = 2  # head size 32: the CPU attention backend has no kernel for 16
MAX_POSITIONS = 4096
SEED = 20
SPECIAL = ["<s>", "</s>", "<pad>"]


def _texts(train: Path):
    with train.open(encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                row = json.loads(line)
                yield row["question"]
                yield row["answer"]


def build(train: Path, out: Path) -> None:
    import torch
    from tokenizers import ByteLevelBPETokenizer
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(
        _texts(train),
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=SPECIAL,
        show_progress=False,
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        model_max_length=MAX_POSITIONS,
    )
    tokenizer.save_pretrained(tmp)

    torch.manual_seed(SEED)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=HIDDEN,
        intermediate_size=4 * HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=HEADS,
        max_position_embeddings=MAX_POSITIONS,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config).to(torch.float32)
    model.save_pretrained(tmp, safe_serialization=True)

    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train", type=Path, required=True, help="GSM8K train.jsonl")
    parser.add_argument("--out", type=Path, required=True, help="model directory to write")
    args = parser.parse_args()
    if not args.train.is_file():
        print(f"vllm_tiny_model: no such file: {args.train}", file=sys.stderr)
        return 2
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    build(args.train, args.out)
    print(f"tiny model written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
