"""Draft-model proposals: a chain or a tree of a smaller model's tokens (``proposer``, ``tree``)."""
