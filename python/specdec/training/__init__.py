"""Training on CPU, self-distilled from the target: Medusa heads (``medusa``), the EAGLE drafter
(``eagle``); what they share in ``loop``."""
