"""The mutating admission webhook: a new pod is born with a generous CPU limit; its own
process, its server, and its certificate (docs/install.md says how it is installed and when
it answers)."""
