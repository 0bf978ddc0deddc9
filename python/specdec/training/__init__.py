"""Training on CPU, self-distilled from the target: Medusa heads (``medusa``)."""
