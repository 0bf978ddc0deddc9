"""Decoders: the shared verify loop (`base.generate`) and the methods that propose candidates."""

from specdec.decoders.base import generate
from specdec.decoders.draft import DraftModel
from specdec.decoders.ensemble import Ensemble
from specdec.decoders.lookahead import Lookahead
from specdec.decoders.medusa import Medusa
from specdec.decoders.prompt_lookup import PromptLookup
from specdec.decoders.protocol import Context, Method, Proposal, Proposer, StepResult
from specdec.decoders.stats import GenerateOutput, GenerateStats

__all__ = ["Context", "DraftModel", "Ensemble", "GenerateOutput", "GenerateStats", "Lookahead", "Medusa", "Method", "PromptLookup",
           "Proposal", "Proposer", "StepResult", "generate"]
