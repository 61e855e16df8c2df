"""The commands people type: the `headroom` CLI (cli: what each subcommand does;
arguments: the flags each takes), what `plan` and `explain` print (output), and
`doctor`'s preflight checks (doctor)."""
