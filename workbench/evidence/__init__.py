"""Qualification evidence: paired timing statistics, verdicts, frozen suites and atomic records."""
