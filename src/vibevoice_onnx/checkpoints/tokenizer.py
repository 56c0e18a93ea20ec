"""A synthetic Qwen2.5-style byte-level BPE tokenizer for synthetic checkpoints.

Same pipeline shape as the real Qwen2.5 tokenizer.json (NFC, Qwen's split regex, byte-level BPE, no BOS),
trained with the `tokenizers` library on a small embedded corpus. Full size puts the Qwen added tokens at
their real ids (151643...) by padding the vocabulary with unreachable filler entries; tiny keeps them
inside a small vocabulary.
"""

from __future__ import annotations

import json

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from .configs import QWEN_SPECIAL_TOKENS

QWEN_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

_CORPUS = """\
The quick brown fox jumps over the lazy dog.
Speech synthesis turns written text into spoken audio, one frame at a time.
Hello, and welcome to the show! Today we talk about streaming voices.
She said: "It's a beautiful morning, isn't it?" He nodded and smiled.
Numbers like 1, 2, 3, 42 and 2026 appear in text too.
Long-form conversations need stable voices across many minutes of speech.
A small model can still sound natural when it runs on the right hardware.
What time is it? It's half past seven in the evening.
The weather today is sunny with a light breeze from the west.
Please read the following sentence slowly and clearly.
"""

TINY_BASE_VOCAB = 400
QWEN_BASE_VOCAB = min(QWEN_SPECIAL_TOKENS.values())  # 151643 regular tokens precede the added ones


def _pipeline() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    return tok


def build_tokenizer(size: str, extra: dict[str, int] | None = None) -> tuple[Tokenizer, dict[str, int]]:
    """Return the tokenizer and the ids of the Qwen added tokens in it; `extra`: more added tokens after
    them, at these ids at full size (ASR-Streaming's <|text_chunk_end|> and audio placeholders)."""
    base_vocab = QWEN_BASE_VOCAB if size == "full" else TINY_BASE_VOCAB
    tok = _pipeline()
    trainer = trainers.BpeTrainer(
        vocab_size=min(base_vocab, 2000),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS.splitlines(keepends=True) * 4, trainer)

    # Pad the BPE vocabulary with entries no merge can produce, so the added tokens get the wanted ids.
    data = json.loads(tok.to_str())
    vocab = data["model"]["vocab"]
    for i in range(len(vocab), base_vocab):
        vocab[f"<|synthetic_filler_{i}|>"] = i
    data["added_tokens"] = []
    tok = Tokenizer.from_str(json.dumps(data))
    wanted = {**QWEN_SPECIAL_TOKENS, **(extra or {})}
    specials = sorted(wanted, key=wanted.get)
    tok.add_special_tokens(specials)
    ids = {name: tok.token_to_id(name) for name in specials}
    if size == "full" and ids != wanted:
        raise RuntimeError("synthetic tokenizer: the added tokens did not land at their real ids")
    return tok, ids
