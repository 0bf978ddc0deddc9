"""One place per method: ``draft`` (a smaller model: chain, tree, copies), ``prompt_lookup``,
``lookahead``, ``medusa`` (proposer, heads, trees) and ``ensemble``; ``copy_chain`` and
``merge`` are the pieces several methods share."""
