"""EAGLE: a one-layer drafter on the target's final hidden states (``drafter``) and the proposer
that drafts its token trees (``proposer``)."""
