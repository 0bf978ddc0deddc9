"""Draft-model proposals: a chain or a tree of a smaller model's tokens. ``method`` (`DraftModel`),
``proposer`` (its proposer and chain), ``lookup`` (the chain taking copies), ``tree`` (token
trees, Eagle's too) and ``vocab`` (the vocabulary check and reduced head)."""
