"""The mutating admission webhook: a new pod is born with a generous CPU limit (docs/install.md says how it is installed and when it answers)."""
