"""A character-level tokenizer built in code, because hub downloads are impossible here.

Tiny random-initialised text encoders need a tokenizer whose vocabulary matches their embedding size.
Characters (lower-cased) keep every distinct prompt distinct without shipping a vocabulary file. Optional
`words` (a known vocabulary, such as the synthetic scenes') are single tokens when they stand alone; any
other text still falls back to characters.
"""

from __future__ import annotations

import string
from collections.abc import Sequence

from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers
from transformers import PreTrainedTokenizerFast

SPECIAL_TOKENS = ["<pad>", "<eos>", "<bos>", "<unk>"]
CHARACTERS = sorted(set(string.ascii_lowercase + string.digits + string.punctuation))


def build_tokenizer(
    vocab_size: int = 128,
    model_max_length: int = 128,
    extra_special_tokens: Sequence[str] = (),
    words: Sequence[str] = (),
) -> PreTrainedTokenizerFast:
    """A deterministic tokenizer with exactly `vocab_size` ids (specials, characters, words, unused fillers).

    `extra_special_tokens` (such as Qwen-VL's `<|image_pad|>`) take the last ids, in order, and are never split;
    the ids of every other token are the same as without them. `words` (lower-case letters only) follow the
    characters, in order; a whitespace- or punctuation-delimited word equal to one is one token.
    """
    extra, words = list(extra_special_tokens), list(words)
    if any(not (w.isascii() and w.isalpha() and w.islower()) for w in words):
        raise ValueError(f"words: {words}; allowed: lower-case ASCII letters only")
    minimum = len(SPECIAL_TOKENS) + len(CHARACTERS) + len(words) + len(extra)
    if vocab_size < minimum:
        raise ValueError(
            f"vocab_size={vocab_size}: must be at least {minimum} (specials + characters + words + extras)"
        )
    fillers = [f"<unused{i}>" for i in range(vocab_size - minimum)]
    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS + CHARACTERS + words + fillers + extra)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.normalizer = normalizers.Lowercase()
    splits = [pre_tokenizers.WhitespaceSplit()]
    if words:  # whole known words first (anchored to the piece), else one character at a time
        alternatives = "|".join(sorted(words, key=len, reverse=True))
        splits += [pre_tokenizers.Punctuation(), pre_tokenizers.Split(Regex(f"^(?:{alternatives})$|."), "isolated")]
    else:
        splits.append(pre_tokenizers.Split(Regex("."), behavior="isolated"))
    core.pre_tokenizer = pre_tokenizers.Sequence(splits)
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token="<pad>",
        eos_token="<eos>",
        bos_token="<bos>",
        unk_token="<unk>",
        model_max_length=model_max_length,
        **({"additional_special_tokens": extra} if extra else {}),
    )
