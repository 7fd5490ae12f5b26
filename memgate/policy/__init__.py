"""Pure policy, no I/O: masking, authorisation rules, entity matching, rank fusion."""
