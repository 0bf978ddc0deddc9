"""Medusa: heads on the target's last hidden state (``heads``), their token trees (``trees``) and the proposer (``proposer``)."""
