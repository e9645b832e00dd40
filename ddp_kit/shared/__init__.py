"""What the kernel and the ranks both read and write: the contract between them (environment
variables, run directory, messages), records, failure reports, markers, errors, processes."""
