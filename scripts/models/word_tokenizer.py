"""Writes crates/posenc-cli/tests/fixtures/word-tokenizer/tokenizer.json: a
word-level tokenizer of 256 entries (the landmark passkey prompt's words,
the ten digits one by one, punctuation, the most frequent words of Pride and
Prejudice, and [UNK]), so that the tiny random checkpoints of posenc-models
(vocabulary 256, trained length 128) can read the report's text and hold a
passkey prompt in the CLI's end-to-end tests. Run from the repository root
with any Python that has `tokenizers`."""

import collections
import re

from tokenizers import Tokenizer, models, pre_tokenizers

PROMPT = (
    "There is an important info hidden inside a lot of irrelevant text. "
    "Find it and memorize them. I will quiz you about the important information there. "
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
    "The pass key is 1. Remember it. 1 is the pass key. What is the pass key? The pass key is"
)
text = open("assets/corpus/pride-and-prejudice.txt", encoding="utf-8").read()

split = pre_tokenizers.Sequence(
    [pre_tokenizers.Whitespace(), pre_tokenizers.Digits(individual_digits=True)]
)
words = ["[UNK]"] + [str(d) for d in range(10)] + list(".,;:!?'\"-")
for w, _ in split.pre_tokenize_str(PROMPT):
    if w not in words:
        words.append(w)
counts = collections.Counter(w for w, _ in split.pre_tokenize_str(text[:200_000]))
for w, _ in counts.most_common():
    if len(words) == 256:
        break
    if w not in words and re.fullmatch(r"[A-Za-z]+", w):
        words.append(w)
assert len(words) == 256
tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
tok.pre_tokenizer = split
tok.save("crates/posenc-cli/tests/fixtures/word-tokenizer/tokenizer.json")
