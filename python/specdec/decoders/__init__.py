"""Decoders: the shared verify loop (`base.generate`) and the methods that propose candidates."""

from specdec.decoders.base import GenerateOutput, GenerateStats, generate
from specdec.decoders.draft import DraftModel
from specdec.decoders.prompt_lookup import PromptLookup

__all__ = ["DraftModel", "GenerateOutput", "GenerateStats", "PromptLookup", "generate"]
