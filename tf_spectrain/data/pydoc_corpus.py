"""The `pydoc` text sets: English prose that ships with every Python, as token ids.

`pydoc_data.topics.topics` holds the language reference's help topics (`help("if")`):
about 465,000 characters in 79 topics on Python 3.11. Many topics repeat paragraphs of
others (`if` is a part of `compound`), so the corpus keeps each paragraph (text between
blank lines, compared with its runs of whitespace as single spaces) at its first occurrence
only, topics in sorted order: about 2,070 paragraphs, 377,000 characters. Paragraph `j`
goes to the test split when `j % 10 == 9` (about 10% of the text): no paragraph is in both
splits, and each split is its own paragraphs joined by blank lines, so no example straddles
the two. The text changes a little between Python versions, and with it the counts.

Tokens:
- `"bytes"` (the `pydoc` set): the UTF-8 bytes, id = byte value (vocabulary 256, which
  needs no table; id 0, the NUL byte, never occurs in text and is free for padding).
- `"words"` (`pydoc_words`): the lower-cased text split into words (`\\w+`) and single
  punctuation marks; id 0 is padding (never produced), 1 stands for a token out of the
  vocabulary, then come the `WORD_VOCAB_SIZE - 2` most frequent tokens of the training
  split (ties in alphabetical order). The test split never shapes the vocabulary.

An example is a window of `seq_len` tokens and the same window one token later: window
`i` has inputs `tokens[i*L : i*L + L]` and labels `tokens[i*L + 1 : i*L + L + 1]`, the
windows do not overlap, and a split of `n` tokens has `(n - 1) // L` of them.

Pure Python (no TensorFlow, no NumPy): the catalog counts examples with it.
"""

import collections
import functools
import re

from tf_spectrain import checks

LEVELS = ("bytes", "words")
BYTE_VOCAB_SIZE = 256
WORD_VOCAB_SIZE = 2048
PAD_ID = 0
OOV_ID = 1
TEST_EVERY = 10  # paragraph j is a test paragraph when j % TEST_EVERY == TEST_EVERY - 1

_WORD_RE = re.compile(r"\w+|[^\w\s]")
_SPLITS = ("train", "test")


@functools.lru_cache(maxsize=1)
def paragraphs():
    """Returns the corpus' paragraphs, each kept once, topics in sorted order.

    Returns:
        A tuple of str, the paragraphs as the topics give them (without the blank lines).
    """
    from pydoc_data.topics import topics

    seen, kept = set(), []
    for key in sorted(topics):
        for paragraph in topics[key].split("\n\n"):
            normal = " ".join(paragraph.split())
            if normal and normal not in seen:
                seen.add(normal)
                kept.append(paragraph.strip("\n"))
    return tuple(kept)


def _check_split(split):
    if split not in _SPLITS:
        raise ValueError(f"`split` must be 'train' or 'test'. Received: split={split!r}")


def split_text(split):
    """Returns the text of a split: its paragraphs joined by blank lines.

    Args:
        split: `"train"` or `"test"`.

    Returns:
        A str.

    Raises:
        ValueError: for another `split`.
    """
    _check_split(split)
    test = split == "test"
    chosen = [
        paragraph
        for j, paragraph in enumerate(paragraphs())
        if (j % TEST_EVERY == TEST_EVERY - 1) == test
    ]
    return "\n\n".join(chosen)


def words(text):
    """`text` as lower-cased words (`\\w+`) and single punctuation marks; whitespace dropped."""
    return _WORD_RE.findall(text.lower())


@functools.lru_cache(maxsize=1)
def word_vocabulary():
    """Returns the word-level vocabulary, built from the training split alone.

    Returns:
        A dict from token to id: the `WORD_VOCAB_SIZE - 2` most frequent tokens of the
        training split (ties alphabetical) get ids 2, 3, ... in that order (0 is padding,
        1 out of vocabulary).
    """
    counts = collections.Counter(words(split_text("train")))
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    kept = ranked[: WORD_VOCAB_SIZE - 2]
    return {token: OOV_ID + 1 + rank for rank, (token, _) in enumerate(kept)}


@functools.lru_cache(maxsize=4)
def token_ids(level, split):
    """Returns a split as token ids.

    Args:
        level: `"bytes"` or `"words"`.
        split: `"train"` or `"test"`.

    Returns:
        A tuple of int ids, each below `vocab_size(level)`.

    Raises:
        ValueError: for an unknown `level` or `split`.
    """
    checks.check_one_of("level", level, LEVELS)
    text = split_text(split)
    if level == "bytes":
        return tuple(text.encode("utf-8"))
    vocabulary = word_vocabulary()
    return tuple(vocabulary.get(token, OOV_ID) for token in words(text))


def vocab_size(level):
    """The number of token ids of `level` `"bytes"` or `"words"` (ValueError for another)."""
    checks.check_one_of("level", level, LEVELS)
    return BYTE_VOCAB_SIZE if level == "bytes" else WORD_VOCAB_SIZE


def num_windows(num_tokens, seq_len):
    """Returns how many non-overlapping examples of `seq_len` tokens `num_tokens` give.

    Each example needs its `seq_len` inputs and one token more for its last label.

    Args:
        num_tokens: the length of the token sequence, an int >= 0.
        seq_len: tokens per example, an int >= 1.

    Returns:
        `max(num_tokens - 1, 0) // seq_len`.

    Raises:
        TypeError, ValueError: for an argument that is not such an int.
    """
    checks.check_int("num_tokens", num_tokens, 0)
    checks.check_int("seq_len", seq_len, 1)
    return max(num_tokens - 1, 0) // seq_len
