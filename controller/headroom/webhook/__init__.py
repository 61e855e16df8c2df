"""The mutating admission webhook: a new pod is born with a generous CPU limit (SPEC §9)."""
