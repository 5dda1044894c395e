"""Distinct random text of a wanted token count, as the engine's own tokenizer counts it.

Each text is a run of random lowercase words drawn from a seeded generator,
opened by a serial number, so no two prompts share a prefix beyond the chat
template's own tokens. How many tokens a word is differs per tokenizer:
:class:`TextMaker` learns the engine's ratio from the usage of a probe call,
and every measurement records the ``prompt_tokens`` the engine reported, so
a text that misses its target by a few tokens is measured as what it is.
"""

from __future__ import annotations

import numpy as np

_LETTERS = np.array(list("abcdefghijklmnopqrstuvwxyz"))


class TextMaker:
    """Random texts; ``tokens_per_word`` is learned from the engine (:meth:`learn`)."""

    def __init__(self, seed: int) -> None:
        self._rng = np.random.default_rng(seed)
        self._serial = 0
        #: Tokens the engine counts per word; a first guess until :meth:`learn`.
        self.tokens_per_word = 2.0
        #: Tokens the chat template adds to a call of one message.
        self.overhead_tokens = 0

    def words(self, n: int) -> str:
        """``n`` random words, opened by this text's serial number."""
        self._serial += 1
        lengths = self._rng.integers(3, 9, size=max(n, 1))
        letters = self._rng.choice(_LETTERS, size=int(lengths.sum()))
        out, at = [], 0
        for length in lengths.tolist():
            out.append("".join(letters[at:at + length]))
            at += length
        return f"n{self._serial} " + " ".join(out)

    def text(self, tokens: int) -> str:
        """A fresh text of about ``tokens`` tokens (template overhead not included)."""
        return self.words(max(1, round(tokens / self.tokens_per_word)))

    def learn(self, words: int, prompt_tokens: int, overhead_tokens: int) -> None:
        """Set the ratio from a call of one ``words``-word message that counted ``prompt_tokens``."""
        self.overhead_tokens = max(0, overhead_tokens)
        self.tokens_per_word = max(0.05, (prompt_tokens - self.overhead_tokens) / max(words + 1, 1))
