"""The commands people type: the `headroom` CLI (cli), what `plan` and `explain` print
(output), and `doctor`'s preflight checks (doctor)."""
