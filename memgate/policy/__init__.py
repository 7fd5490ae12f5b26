"""Pure policy, no I/O: masking, authorisation rules, entity matching, citations, rank fusion."""

from memgate.policy.authorisation import authorise, refuse_personal_data
from memgate.policy.citations import apply, cited
from memgate.policy.entities import fold, names_in
from memgate.policy.fusion import Fused, rrf
from memgate.policy.masking import Masked, contains_personal_data, mask

__all__ = [
    "authorise", "refuse_personal_data", "apply", "cited", "fold", "names_in", "Fused", "rrf",
    "Masked", "contains_personal_data", "mask",
]
