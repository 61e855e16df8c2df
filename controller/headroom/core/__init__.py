"""The pure core: records, parameters, eligibility and policy. No I/O, no kubernetes."""
