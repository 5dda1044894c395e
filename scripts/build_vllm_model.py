"""Writes the small random-weight model that the real-vLLM tests and experiments serve.

No model can be downloaded on the project's machines, so this one is made
locally, the same bytes on every machine: a Llama-architecture model with
seeded random weights (``transformers``) and a byte-level BPE tokenizer trained
(``tokenizers``) on a seeded corpus of English and code words, with a chat
template. Its outputs are gibberish; what matters to basin-serve is that it is
served by the real engine (paged KV, prefix caching, priority scheduling,
chunked prefill) and that a miss costs much more than a hit.

Runs inside the vLLM environment (``scripts/setup_vllm.sh`` calls it):

    python scripts/build_vllm_model.py OUT_DIR [--hidden 512 --layers 4 ...]

The shape is read from ``profiles/engines/vllm-cpu.yaml`` by the setup script,
so the model and the profile that describes it cannot drift apart.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

#: Words the tokenizer learns from (and the calibration and replay filler draw on):
#: plain English and the vocabulary of coding agents.
CORPUS_WORDS = """
the of and to in is that for it as with was on be by this are or from at an not have
which but all were can has more one will their if would there been when also other
some what into only its time new about than them these two may first any after most
such used many made where over how should each because very between through make like
agent tool file patch test build error trace module function value index cache request
token branch commit review parser config server client thread queue memory buffer
session call prompt prefix context decode prefill engine budget cliff admission
class def return import from self none true false list dict string integer float
python rust shell command output input result status check update delete create read
write open close start stop run step loop event timer clock seed sample batch window
user system assistant message content role model answer question reason plan task
repository directory path line column diff merge rebase issue fix bug feature release
""".split()


def corpus(seed: int, lines: int) -> list[str]:
    """Seeded lines of words and a little punctuation and digits, so the BPE
    learns whole words, their pieces and every byte that tests send."""
    rng = random.Random(seed)
    out = []
    for _ in range(lines):
        n = rng.randint(5, 30)
        words = [rng.choice(CORPUS_WORDS) for _ in range(n)]
        if rng.random() < 0.3:
            words.insert(rng.randrange(n), str(rng.randint(0, 9999)))
        line = " ".join(words)
        out.append(line.capitalize() + rng.choice([".", ",", ":", "?", "!", ";", ""]))
    return out


CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}<|end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
SPECIAL_TOKENS = ["<|bos|>", "<|eos|>", "<|pad|>", "<|end|>", "<|system|>", "<|user|>", "<|assistant|>",
                  "<|tool|>"]


def build_tokenizer(out: Path, vocab_size: int, seed: int) -> int:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus(seed, 20_000), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|bos|>", eos_token="<|eos|>",
                                   pad_token="<|pad|>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    return int(tok.get_vocab_size())


def build_model(out: Path, vocab_size: int, hidden: int, layers: int, heads: int, kv_heads: int,
                intermediate: int, max_positions: int, seed: int) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=intermediate,
                         num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                         max_position_embeddings=max_positions, bos_token_id=0, eos_token_id=1,
                         pad_token_id=2, tie_word_embeddings=True, torch_dtype="float32")
    model = LlamaForCausalLM(config)
    model.save_pretrained(out, safe_serialization=True)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--hidden", type=int, required=True)
    ap.add_argument("--layers", type=int, required=True)
    ap.add_argument("--heads", type=int, required=True)
    ap.add_argument("--kv-heads", type=int, required=True)
    ap.add_argument("--intermediate", type=int, required=True)
    ap.add_argument("--vocab", type=int, required=True)
    ap.add_argument("--max-positions", type=int, required=True)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.hidden // args.heads != 64:
        ap.error(f"head dimension {args.hidden // args.heads}: vLLM's CPU attention needs 64 here "
                 "(hidden / heads); 16 is refused by its kernels")
    tmp = args.out.with_name(args.out.name + ".partial")
    tmp.mkdir(parents=True, exist_ok=True)
    vocab = build_tokenizer(tmp, args.vocab, args.seed)
    build_model(tmp, vocab, args.hidden, args.layers, args.heads, args.kv_heads, args.intermediate,
                args.max_positions, args.seed)
    (tmp / "basin-model.json").write_text(json.dumps(vars(args) | {"out": str(args.out), "vocab": vocab},
                                                     indent=1), encoding="utf-8")
    tmp.rename(args.out)
    print(f"build_vllm_model: {args.out} (vocab {vocab}, hidden {args.hidden}, layers {args.layers})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
